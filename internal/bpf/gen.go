package bpf

// The BPF object is built from bpf/strap.bpf.c against the running kernel's BTF; `make
// generate` installs clang, llvm, libbpf-dev and bpftool. The generated strap_x86_bpfel.go
// and .o are committed so `go build` needs no clang.
//go:generate sh -c "bpftool btf dump file /sys/kernel/btf/vmlinux format c > ../../bpf/vmlinux.h"
//go:generate go tool bpf2go -tags linux -target amd64 -type rq_start -type dev_stats -type thread_stats -type proc_stats -type open_event -type offcpu_start strap ../../bpf/strap.bpf.c -- -O2 -g -Wall -I../../bpf -I/usr/include
