package bpf

import "golang.org/x/sys/unix"

const (
	sysPoll      = unix.SYS_POLL
	sysEpollWait = unix.SYS_EPOLL_WAIT
)
