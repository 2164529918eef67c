// Package shm owns the shared-memory ring of docs/PROTOCOL.md section 2: validating and
// mapping a client's sealed memfd read-only, parsing the records in it, and a Go producer
// that writes rings the same way the Python client does (for tests and load generation).
package shm
