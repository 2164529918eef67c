package control

import (
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// recvmsg reads one datagram into c.rbuf and c.oob. The socket is non-blocking (Go's
// poller owns it): the read itself is a raw recvmsg(2), and only when nothing is queued
// does the goroutine park in the poller. A raw syscall does not enter the Go scheduler's
// syscall state, so receiving a message does not wake the runtime's sysmon thread, which
// every syscall made from an idle process does (and which then polls every 20 µs while
// the daemon is busy): on a decoding client that was several of strapd's context
// switches per token (PERFORMANCE.md, "One wake-up per token"). Deadlines and Close work
// as for ReadMsgUnix.
func (c *Conn) recvmsg() (n, oobn, flags int, err error) {
	if c.rc == nil {
		rc, rerr := c.uc.SyscallConn()
		if rerr != nil {
			return 0, 0, 0, rerr
		}
		c.rc = rc
	}
	var serr syscall.Errno
	rerr := c.rc.Read(func(fd uintptr) bool {
		for {
			n, oobn, flags, serr = rawRecvmsg(int(fd), c.rbuf, c.oob)
			if serr != unix.EINTR {
				return serr != unix.EAGAIN
			}
		}
	})
	if rerr != nil {
		return 0, 0, 0, rerr
	}
	if serr != 0 {
		return 0, 0, 0, &os.SyscallError{Syscall: "recvmsg", Err: serr}
	}
	return n, oobn, flags, nil
}

// rawRecvmsg is recvmsg(2) with MSG_CMSG_CLOEXEC (descriptors arrive close-on-exec, as
// net's ReadMsgUnix makes them) and MSG_DONTWAIT, without entering the scheduler.
func rawRecvmsg(fd int, p, oob []byte) (n, oobn, flags int, errno syscall.Errno) {
	var iov unix.Iovec
	if len(p) > 0 {
		iov.Base = &p[0]
		iov.SetLen(len(p))
	}
	var msg unix.Msghdr
	msg.Iov = &iov
	msg.Iovlen = 1
	if len(oob) > 0 {
		msg.Control = &oob[0]
		msg.SetControllen(len(oob))
	}
	r, _, e := unix.RawSyscall(unix.SYS_RECVMSG, uintptr(fd), uintptr(unsafe.Pointer(&msg)),
		uintptr(unix.MSG_CMSG_CLOEXEC|unix.MSG_DONTWAIT))
	if e != 0 {
		return 0, 0, 0, e
	}
	return int(r), int(msg.Controllen), int(msg.Flags), 0
}
