package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Peer is the process at the other end of an API connection, as the kernel recorded it
// when it connected.
type Peer struct {
	// Cred is its pid, uid and gid (SO_PEERCRED).
	Cred unix.Ucred
	// Groups are its supplementary groups (SO_PEERGROUPS).
	Groups []uint32
}

// Root reports whether the peer is root, which sees every session.
func (p *Peer) Root() bool { return p != nil && p.Cred.Uid == 0 }

// errNoPeer: the connection carries no kernel credentials (not a Unix socket).
var errNoPeer = errors.New("no peer credentials: the API is served on a Unix socket only")

type peerKey struct{}

// peerContext is http.Server.ConnContext: it reads the peer's credentials once per
// connection, so every request on it is judged by who connected.
func peerContext(ctx context.Context, c net.Conn) context.Context {
	p, err := PeerOf(c)
	if err != nil {
		return context.WithValue(ctx, peerKey{}, err)
	}
	return context.WithValue(ctx, peerKey{}, p)
}

func peerFrom(ctx context.Context) (*Peer, error) {
	switch v := ctx.Value(peerKey{}).(type) {
	case *Peer:
		return v, nil
	case error:
		return nil, v
	}
	return nil, errNoPeer
}

// PeerOf reads the credentials of a Unix socket's peer.
func PeerOf(c net.Conn) (*Peer, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return nil, errNoPeer
	}
	rc, err := uc.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("peer credentials: %w", err)
	}
	var cred *unix.Ucred
	var groups []uint32
	var serr error
	cerr := rc.Control(func(fd uintptr) {
		cred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		if serr != nil {
			return
		}
		buf := make([]uint32, 64)
		for {
			n := uint32(len(buf) * 4)
			_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.SOL_SOCKET, unix.SO_PEERGROUPS,
				uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&n)), 0)
			if e == unix.ERANGE && int(n) > len(buf)*4 {
				buf = make([]uint32, n/4+1)
				continue
			}
			if e != 0 {
				serr = fmt.Errorf("SO_PEERGROUPS: %w", e)
				return
			}
			groups = buf[:n/4]
			return
		}
	})
	if cerr != nil {
		return nil, fmt.Errorf("peer credentials: %w", cerr)
	}
	if serr != nil {
		return nil, fmt.Errorf("peer credentials: %w", serr)
	}
	return &Peer{Cred: *cred, Groups: groups}, nil
}
