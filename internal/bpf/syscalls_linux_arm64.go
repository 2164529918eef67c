package bpf

// arm64 (the generic syscall table) has no poll and no epoll_wait: libc implements them
// with ppoll and epoll_pwait, which are counted under the same sync kinds. -1 is never a
// syscall number at exit, so these two never match.
const (
	sysPoll      = -1
	sysEpollWait = -1
)
