// Package server owns the daemon's control socket: listening (path, permissions, stale
// socket removal), the handshake, one session per connection from OPEN to CLOSE or client
// death, STATUS, limits, and graceful shutdown that drains every session. It is where the
// protocol (internal/control) meets the data path (internal/pipeline): it converts bodies
// into pipeline requests and pipeline events and failures into wire messages.
package server
