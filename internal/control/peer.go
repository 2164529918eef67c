package control

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// PeerGroups returns the supplementary groups of the peer of the connected Unix socket fd,
// as the kernel recorded them at connect time (SO_PEERGROUPS, Linux 4.13+). Both the control
// socket and the HTTP API's socket admit peers by them, so both read them here.
func PeerGroups(fd int) ([]uint32, error) {
	buf := make([]uint32, 64)
	for {
		n := uint32(len(buf) * 4)
		_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_PEERGROUPS,
			uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&n)), 0)
		// ERANGE: the peer has more groups than buf holds; n says how many bytes it needs.
		if e == unix.ERANGE && int(n) > len(buf)*4 {
			buf = make([]uint32, n/4+1)
			continue
		}
		if e != 0 {
			return nil, fmt.Errorf("SO_PEERGROUPS: %w", e)
		}
		return buf[:n/4], nil
	}
}
