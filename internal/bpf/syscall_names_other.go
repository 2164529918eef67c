//go:build !amd64 && !arm64

package bpf

// syscallNames is empty where no eBPF object is built: without the probes there are no
// per-syscall statistics to name.
var syscallNames map[uint32]string
