// Package server owns the daemon's control socket: listening (path, permissions, stale
// socket removal), the handshake, one session per connection from OPEN to CLOSE or client
// death, STATUS, limits, and graceful shutdown that drains every session.
package server
