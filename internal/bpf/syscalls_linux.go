//go:build linux && (amd64 || arm64)

package bpf

import "golang.org/x/sys/unix"

// syscallNrs holds the numbers the loader writes into the object's nr_* constants: the
// calls the probes treat specially, as numbered on this architecture (sysPoll and
// sysEpollWait are the two that differ by more than their number).
var syscallNrs = map[string]int64{
	"nr_mmap":            unix.SYS_MMAP,
	"nr_mlock":           unix.SYS_MLOCK,
	"nr_munlock":         unix.SYS_MUNLOCK,
	"nr_mlock2":          unix.SYS_MLOCK2,
	"nr_openat":          unix.SYS_OPENAT,
	"nr_read":            unix.SYS_READ,
	"nr_write":           unix.SYS_WRITE,
	"nr_ioctl":           unix.SYS_IOCTL,
	"nr_futex":           unix.SYS_FUTEX,
	"nr_futex_waitv":     unix.SYS_FUTEX_WAITV,
	"nr_epoll_wait":      sysEpollWait,
	"nr_epoll_pwait":     unix.SYS_EPOLL_PWAIT,
	"nr_epoll_pwait2":    unix.SYS_EPOLL_PWAIT2,
	"nr_poll":            sysPoll,
	"nr_ppoll":           unix.SYS_PPOLL,
	"nr_clock_nanosleep": unix.SYS_CLOCK_NANOSLEEP,
}
