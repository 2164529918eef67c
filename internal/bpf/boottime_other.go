//go:build !linux

package bpf

// bootNow has no boot-time clock to read off Linux (nor probes that stamp with one).
func bootNow() (uint64, error) { return 0, ErrUnsupported }
