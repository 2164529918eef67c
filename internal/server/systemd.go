package server

import (
	"errors"
	"fmt"
	"net"

	"github.com/coreos/go-systemd/v22/activation"
	"github.com/coreos/go-systemd/v22/daemon"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// Errors of socket activation.
var (
	// ErrActivation: LISTEN_FDS/LISTEN_PID are set for this process but do not describe
	// exactly one listening AF_UNIX SOCK_SEQPACKET socket.
	ErrActivation = errors.New("socket activation")
)

// Notify sends one sd_notify(3) state datagram ("READY=1", "STATUS=…", "STOPPING=1",
// several joined by newlines) to $NOTIFY_SOCKET. Without $NOTIFY_SOCKET (not started by
// systemd as Type=notify) it does nothing and returns nil. NOTIFY_SOCKET stays set: every
// later phase reports through it too.
func Notify(state string) error {
	if _, err := daemon.SdNotify(false, state); err != nil {
		return fmt.Errorf("notify: %w", err)
	}
	return nil
}

// ActivationListener returns the control socket systemd passed to this process
// (sd_listen_fds(3): LISTEN_PID is our pid, the socket is fd 3), or nil when the process
// was not socket-activated (LISTEN_PID unset, not a number or another process's pid,
// LISTEN_FDS unset or 0, as sd_listen_fds(3) treats them). More than one descriptor, or
// one that is not a listening AF_UNIX SOCK_SEQPACKET socket, is an error. LISTEN_PID,
// LISTEN_FDS and LISTEN_FDNAMES are cleared so that no child inherits them.
func ActivationListener() (*net.UnixListener, error) {
	files := activation.Files(true)
	if len(files) == 0 {
		return nil, nil
	}
	defer func() {
		for _, f := range files {
			f.Close() // FileListener dups the one it keeps
		}
	}()
	if len(files) != 1 {
		return nil, fmt.Errorf("%w: LISTEN_FDS=%d, expected exactly one socket (ListenSequentialPacket= in strapd.socket)", ErrActivation, len(files))
	}
	f := files[0]
	fd := int(f.Fd())
	if err := checkActivationFD(fd); err != nil {
		return nil, err
	}
	ln, err := net.FileListener(f)
	if err != nil {
		return nil, fmt.Errorf("%w: fd %d: %w", ErrActivation, fd, err)
	}
	ul, ok := ln.(*net.UnixListener)
	if !ok {
		ln.Close()
		return nil, fmt.Errorf("%w: fd %d is a %T, expected a unix socket", ErrActivation, fd, ln)
	}
	return ul, nil
}

func checkActivationFD(fd int) error {
	dom, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
	if err != nil {
		return fmt.Errorf("%w: fd %d is not a socket: %w", ErrActivation, fd, err)
	}
	typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	if err != nil {
		return fmt.Errorf("%w: fd %d: %w", ErrActivation, fd, err)
	}
	acc, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN)
	if err != nil {
		return fmt.Errorf("%w: fd %d: %w", ErrActivation, fd, err)
	}
	if dom != unix.AF_UNIX || typ != unix.SOCK_SEQPACKET || acc != 1 {
		return fmt.Errorf("%w: fd %d is domain %d type %d listening %v, expected a listening AF_UNIX SOCK_SEQPACKET socket",
			ErrActivation, fd, dom, typ, acc == 1)
	}
	return nil
}

// UseListener makes the server accept on ln (a socket systemd passed) instead of creating
// its socket in Listen. The socket file belongs to systemd: it is not removed on exit, and
// its mode and group are the ones strapd.socket set. The listener's address replaces
// Config.Socket (STATUS and the logs report the socket clients really use).
func (s *Server) UseListener(ln *net.UnixListener) {
	ln.SetUnlinkOnClose(false)
	s.ln = ln
	s.inherited = true
	if a, ok := ln.Addr().(*net.UnixAddr); ok && a.Name != "" {
		if s.cfg.Socket != "" && s.cfg.Socket != a.Name {
			s.log.Info("using the socket systemd passed instead of --socket", zap.String("socket", a.Name),
				zap.String("ignored", s.cfg.Socket))
		}
		s.cfg.Socket = a.Name
	}
}

// notify passes a state change to Config.Notify, if any.
func (s *Server) notify(state string) {
	if s.cfg.Notify != nil {
		s.cfg.Notify(state)
	}
}
