package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net"

	"golang.org/x/sys/unix"

	"github.com/strap-llm/strap/internal/control"
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
		groups, serr = control.PeerGroups(int(fd))
	})
	if cerr != nil {
		return nil, fmt.Errorf("peer credentials: %w", cerr)
	}
	if serr != nil {
		return nil, fmt.Errorf("peer credentials: %w", serr)
	}
	return &Peer{Cred: *cred, Groups: groups}, nil
}
