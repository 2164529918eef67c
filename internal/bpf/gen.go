package bpf

// The BPF objects are built from bpf/strap.bpf.c against the running kernel's BTF; `make
// generate` installs clang, llvm, libbpf-dev and bpftool. One object per target
// architecture: strap_x86_bpfel.{go,o} (amd64) and strap_arm64_bpfel.{go,o} (arm64), each
// behind its GOARCH build tag, committed so `go build` needs no clang. vmlinux.h is the
// build machine's (x86_64); the arm64 object takes the few arch-specific kernel types from
// bpf/arch.h and everything else from it, which CO-RE relocates by name on the target.
//go:generate sh -c "bpftool btf dump file /sys/kernel/btf/vmlinux format c > ../../bpf/vmlinux.h"
//go:generate go tool bpf2go -tags linux -target amd64,arm64 -type rq_start -type dev_stats -type thread_stats -type proc_stats -type open_event -type offcpu_start -type lat_stats -type tcp_stats -type tgid_key -type weight_open strap ../../bpf/strap.bpf.c -- -O2 -g -Wall -I../../bpf -I/usr/include

// Syscall names for the per-syscall statistics: amd64's from the x86_64 uapi header
// (Debian's linux-libc-dev, a dependency of libbpf-dev); arm64's from golang.org/x/sys's
// table (the build machine has no arm64 uapi headers), the version go.mod pins.
//go:generate sh -c "awk -v arch=x86_64 -f ../../bpf/syscall_names.awk /usr/include/x86_64-linux-gnu/asm/unistd_64.h > syscall_names_amd64.go && gofmt -w syscall_names_amd64.go"
//go:generate sh -c "awk -v arch=arm64 -f ../../bpf/syscall_names.awk $(go list -m -f '{{.Dir}}' golang.org/x/sys)/unix/zsysnum_linux_arm64.go > syscall_names_arm64.go && gofmt -w syscall_names_arm64.go"
