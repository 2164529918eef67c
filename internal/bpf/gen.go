package bpf

// The BPF object is built from bpf/strap.bpf.c against the running kernel's BTF; `make
// generate` installs clang, llvm, libbpf-dev and bpftool. The generated strap_x86_bpfel.go
// and .o are committed so `go build` needs no clang.
//go:generate sh -c "bpftool btf dump file /sys/kernel/btf/vmlinux format c > ../../bpf/vmlinux.h"
//go:generate go tool bpf2go -tags linux -target amd64 -type rq_start -type dev_stats -type thread_stats -type proc_stats -type open_event -type offcpu_start -type lat_stats -type tcp_stats -type tgid_key -type weight_open strap ../../bpf/strap.bpf.c -- -O2 -g -Wall -I../../bpf -I/usr/include

// Syscall names for the per-syscall statistics, from the x86_64 uapi header (Debian's
// linux-libc-dev, a dependency of libbpf-dev).
//go:generate sh -c "awk -f ../../bpf/syscall_names.awk /usr/include/x86_64-linux-gnu/asm/unistd_64.h > syscall_names_x86.go && gofmt -w syscall_names_x86.go"
