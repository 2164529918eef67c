// Package control owns the control-socket protocol of docs/PROTOCOL.md section 1: message
// framing and typed bodies, fd passing over SOCK_SEQPACKET, socket path resolution, and a
// small Go client used by tests and `strapd status`.
package control
