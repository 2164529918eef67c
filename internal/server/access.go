package server

import (
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/strap-llm/strap/internal/control"
)

// CodeAccessDenied is the ERROR code for a peer the allow-lists refuse (PROTOCOL.md 1.2).
const CodeAccessDenied = "access_denied"

// errAccessDenied: the peer is not on the allow-lists, or its credentials are unknown.
var errAccessDenied = errors.New("access denied")

// Access decides who may use the daemon beyond what the socket's mode and group allow.
type Access struct {
	// SocketMode is the control socket's permission bits (0600 when zero). Ignored for a
	// socket systemd passed: strapd.socket sets SocketMode=.
	SocketMode os.FileMode
	// SocketGID, when positive, is the group the socket (and a socket directory strapd
	// creates) is given, so members of that group can connect. 0: left alone.
	SocketGID int
	// AllowUIDs, when not empty, lists the uids that may connect (root always may).
	AllowUIDs []uint32
	// AllowGIDs, when not empty, lists groups whose members (primary or supplementary
	// group) may connect. With both lists empty everyone who can open the socket may.
	AllowGIDs []uint32
}

// applySocketPerms gives a socket strapd created its mode and group.
func (s *Server) applySocketPerms(path string) error {
	a := s.cfg.Access
	if a.SocketGID > 0 {
		if err := os.Lchown(path, -1, a.SocketGID); err != nil {
			return fmt.Errorf("socket group %d: %w", a.SocketGID, err)
		}
	}
	if err := os.Chmod(path, a.SocketMode.Perm()); err != nil {
		return fmt.Errorf("socket mode %v: %w", a.SocketMode, err)
	}
	return nil
}

// admit checks a peer against the allow-lists. Root is always admitted.
func (a *Access) admit(cred *unix.Ucred, groups []uint32) error {
	if cred == nil {
		return fmt.Errorf("%w: peer credentials unknown", errAccessDenied)
	}
	if cred.Uid == 0 || (len(a.AllowUIDs) == 0 && len(a.AllowGIDs) == 0) {
		return nil
	}
	if slices.Contains(a.AllowUIDs, cred.Uid) || slices.Contains(a.AllowGIDs, cred.Gid) {
		return nil
	}
	for _, g := range groups {
		if slices.Contains(a.AllowGIDs, g) {
			return nil
		}
	}
	return fmt.Errorf("%w: uid %d gid %d is not on this daemon's allow-lists (--allow-uid, --allow-gid)", errAccessDenied, cred.Uid, cred.Gid)
}

// peerGroups returns the peer's supplementary groups as the kernel recorded them at
// connect time (SO_PEERGROUPS, Linux 4.13+).
func peerGroups(c *control.Conn) ([]uint32, error) {
	rc, err := c.Unix().SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("peer groups: %w", err)
	}
	var groups []uint32
	var serr error
	cerr := rc.Control(func(fd uintptr) { groups, serr = control.PeerGroups(int(fd)) })
	if cerr != nil {
		return nil, fmt.Errorf("peer groups: %w", cerr)
	}
	if serr != nil {
		return nil, fmt.Errorf("peer groups: %w", serr)
	}
	return groups, nil
}

// Admit checks a peer of another socket (the HTTP API's) against the allow-lists, as every
// control connection is checked.
func (s *Server) Admit(cred *unix.Ucred, groups []uint32) error {
	return s.cfg.Access.admit(cred, groups)
}

// CanControl reports whether a peer may see or control a session owned by ownerUID: the
// owner itself, or root. `status` and `resume` go through it.
func CanControl(peer *unix.Ucred, ownerUID uint32) bool {
	return peer != nil && (peer.Uid == 0 || peer.Uid == ownerUID)
}

// StatusFor is Status as the peer may see it: the daemon-wide figures, and only the
// sessions CanControl lets it see. A nil peer sees no session.
func (s *Server) StatusFor(peer *unix.Ucred) control.StatusReply {
	return statusFor(s.Status(), peer)
}

// statusFor filters a full status down to what peer may see.
func statusFor(rep control.StatusReply, peer *unix.Ucred) control.StatusReply {
	kept := rep.Sessions[:0]
	for _, st := range rep.Sessions {
		if CanControl(peer, st.UID) {
			kept = append(kept, st)
		}
	}
	rep.Sessions = kept
	ups := rep.Uploads[:0]
	for _, u := range rep.Uploads {
		if CanControl(peer, u.UID) {
			ups = append(ups, u)
		}
	}
	rep.Uploads = ups
	if pr := rep.Daemon.Probes; pr != nil && (peer == nil || peer.Uid != 0) {
		// The watched set names other users' client pids: keep strapd's own and those of
		// the sessions this peer may see.
		visible := map[int]bool{rep.Daemon.PID: true}
		for _, st := range kept {
			visible[int(st.PID)] = true
		}
		cp := *pr
		cp.Watched = nil
		for _, pid := range pr.Watched {
			if visible[pid] {
				cp.Watched = append(cp.Watched, pid)
			}
		}
		rep.Daemon.Probes = &cp
	}
	return rep
}

// maxRefusing bounds the refused connections being answered at once.
const maxRefusing = 64

// refuseTimeout bounds how long a connection refused at accept may take to send HELLO.
const refuseTimeout = time.Second

// refuse answers a connection refused at accept (limits, no credentials) with one fatal
// ERROR and closes it. It first reads the client's HELLO (for at most refuseTimeout, in its
// own goroutine), so the client's send succeeds and it reads the ERROR where it expected
// WELCOME instead of a broken pipe.
func (s *Server) refuse(uc *net.UnixConn, log *zap.Logger, code string, err error) {
	if s.refusing.Add(1) > maxRefusing {
		// A flood: answering each one would hold a descriptor and a goroutine per
		// connection for refuseTimeout. Close at once; the client sees EOF.
		s.refusing.Add(-1)
		uc.Close()
		return
	}
	log.Warn("refusing connection", zap.String("code", code), zap.Error(err))
	go func() {
		defer s.refusing.Add(-1)
		defer uc.Close()
		c := control.NewConn(uc)
		_ = uc.SetDeadline(time.Now().Add(refuseTimeout))
		if _, fds, rerr := c.Recv(0); rerr == nil {
			closeFDs(fds)
		}
		_ = c.Send(control.TypeError, control.Error{Code: code, Message: err.Error(), Fatal: true})
	}()
}

// admit applies the allow-lists to this connection's peer.
func (c *conn) admit() error {
	a := &c.srv.cfg.Access
	if len(a.AllowGIDs) == 0 {
		return a.admit(&c.cred, nil)
	}
	groups, err := peerGroups(c.c)
	if err != nil {
		c.log.Warn("no supplementary groups; checking the primary group only", zap.Error(err))
	}
	return a.admit(&c.cred, groups)
}
