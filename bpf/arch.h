// The registers the syscall probes read, per target architecture (bpf2go defines
// __TARGET_ARCH_x86 or __TARGET_ARCH_arm64 for each object it builds).
//
// vmlinux.h comes from the build machine's kernel (x86_64), so its struct pt_regs has x86
// fields. CO-RE relocations match structs by name and fields by name, not by layout, so
// for arm64 the two kernel structs the probes read are declared here under names libbpf
// resolves against the arm64 kernel's BTF: user_pt_regs, and pt_regs through the
// "___strap" flavour (everything from the last "___" on is ignored when matching). The
// local layout below is arm64's, but only the names have to be right.

#ifndef STRAP_ARCH_H
#define STRAP_ARCH_H

#if defined(__TARGET_ARCH_x86)

// The syscall ABI passes arguments in di, si, dx, r10, r8, r9; orig_ax keeps the number
// (ax is overwritten by the return value).
#define SYSCALL_ARG0(regs) PT_REGS_PARM1_CORE_SYSCALL(regs)
#define SYSCALL_ARG1(regs) PT_REGS_PARM2_CORE_SYSCALL(regs)
#define SYSCALL_NR(regs) ((__s64)BPF_CORE_READ(regs, orig_ax))

#elif defined(__TARGET_ARCH_arm64)

// arch/arm64/include/uapi/asm/ptrace.h; bpf_tracing.h reads regs[n] through it.
struct user_pt_regs {
	__u64 regs[31];
	__u64 sp;
	__u64 pc;
	__u64 pstate;
} __attribute__((preserve_access_index));

// arch/arm64/include/asm/ptrace.h: x0 is overwritten by the return value, so the first
// argument is kept in orig_x0; syscallno is the number (NO_SYSCALL, -1, when a tracer or
// seccomp cancelled the call).
struct pt_regs___strap {
	__u64 orig_x0;
	__s32 syscallno;
} __attribute__((preserve_access_index));

#define SYSCALL_ARG0(regs) BPF_CORE_READ((struct pt_regs___strap *)(regs), orig_x0)
#define SYSCALL_ARG1(regs) PT_REGS_PARM2_CORE_SYSCALL(regs)
#define SYSCALL_NR(regs) ((__s64)BPF_CORE_READ((struct pt_regs___strap *)(regs), syscallno))

#else
#error "strap.bpf.c is built for x86 and arm64 only (bpf2go -target amd64,arm64)"
#endif

#endif
