package bpf

import "errors"

// Sentinel errors returned by this package.
var (
	// ErrUnsupported is returned by Start on platforms without the eBPF object (anything
	// but linux/amd64 and linux/arm64); the /proc collectors still need a Collector, so callers treat it as
	// "kernel probes off" rather than fatal.
	ErrUnsupported = errors.New("bpf: eBPF probes are built for linux/amd64 and linux/arm64 only")
	// ErrClosed is returned by calls on a closed Collector.
	ErrClosed = errors.New("bpf: closed")
	// ErrBadPID is returned by Watch/Unwatch for a pid that is not positive.
	ErrBadPID = errors.New("bpf: pid must be positive")
	// ErrBadPSI is returned by ParsePSI for input that is not /proc/pressure syntax.
	ErrBadPSI = errors.New("bpf: malformed pressure stall information")
)
