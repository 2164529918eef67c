// Package control owns the control-socket protocol of docs/PROTOCOL.md section 1: message
// framing, every typed body, the one coded error (Error), fd passing over SOCK_SEQPACKET,
// socket path resolution, and a small Go client used by tests and `strapd status`. It is a
// leaf: it imports no other strapd package but jsontext (itself a leaf), so clients and
// tools link only the protocol.
package control
