package control

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// maxFDs is the most descriptors a message may carry (OPEN: ring, output, trace, resource
// log); the control buffer has room for a few more so extras can be seen and closed
// instead of truncated.
const maxFDs = 4

// Conn is one SOCK_SEQPACKET connection speaking the framing of PROTOCOL.md 1.1. Send and
// Recv may be used by different goroutines; neither is safe for concurrent use by two.
type Conn struct {
	uc    *net.UnixConn
	rc    syscall.RawConn // uc's, for the raw receive (recvmsg_linux.go)
	rbuf  []byte
	oob   []byte
	creds *unix.Ucred
}

// NewConn wraps an accepted or dialed seqpacket connection.
func NewConn(uc *net.UnixConn) *Conn {
	return &Conn{uc: uc, rbuf: make([]byte, MaxMessage+1), oob: make([]byte, unix.CmsgSpace(4*(maxFDs+6)))}
}

// Unix is the underlying socket (for deadlines).
func (c *Conn) Unix() *net.UnixConn { return c.uc }

// PeerCred returns the peer's pid/uid/gid (SO_PEERCRED) as the kernel recorded them at
// connect time.
func (c *Conn) PeerCred() (*unix.Ucred, error) {
	if c.creds != nil {
		return c.creds, nil
	}
	rc, err := c.uc.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("peer cred: %w", err)
	}
	var cred *unix.Ucred
	var serr error
	if err := rc.Control(func(fd uintptr) {
		cred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, fmt.Errorf("peer cred: %w", err)
	}
	if serr != nil {
		return nil, fmt.Errorf("peer cred: %w", serr)
	}
	c.creds = cred
	return cred, nil
}

// Send encodes and sends one message with optional file descriptors.
func (c *Conn) Send(t Type, body any, fds ...int) error {
	b, err := Encode(t, body)
	if err != nil {
		return err
	}
	return c.SendRaw(b, fds...)
}

// SendRaw sends one already-framed datagram with optional file descriptors.
func (c *Conn) SendRaw(b []byte, fds ...int) error {
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	n, oobn, err := c.uc.WriteMsgUnix(b, oob, nil)
	if err != nil {
		return fmt.Errorf("send: %w", err)
	}
	if n != len(b) || oobn != len(oob) {
		return fmt.Errorf("send: short write %d/%d bytes", n, len(b))
	}
	return nil
}

// Recv reads one datagram and decodes it (framing and JSON object check). It returns the
// file descriptors that came with it; the caller owns them. A message with more than
// maxWant descriptors is refused: all of them are closed and ErrTooManyFDs returned. On a
// decode error the descriptors are closed too. io.EOF means the peer closed.
func (c *Conn) Recv(maxWant int) (Message, []int, error) {
	n, oobn, flags, err := c.recvmsg()
	if err != nil {
		return Message{}, nil, err
	}
	if n == 0 && oobn == 0 {
		// SOCK_SEQPACKET reports an orderly shutdown as a zero-length read.
		return Message{}, nil, io.EOF
	}
	fds, ferr := parseRights(c.oob[:oobn])
	if ferr != nil {
		closeAll(fds)
		return Message{}, nil, fmt.Errorf("%w: control data: %w", ErrBadMessage, ferr)
	}
	if flags&unix.MSG_CTRUNC != 0 {
		closeAll(fds)
		return Message{}, nil, fmt.Errorf("%w: too many file descriptors (control data truncated)", ErrTooManyFDs)
	}
	if flags&unix.MSG_TRUNC != 0 || n > MaxMessage {
		closeAll(fds)
		return Message{}, nil, fmt.Errorf("%w: datagram longer than %d bytes", ErrBadMessage, MaxMessage)
	}
	if len(fds) > maxWant {
		closeAll(fds)
		return Message{}, nil, fmt.Errorf("%w: %d descriptors, expected at most %d", ErrTooManyFDs, len(fds), maxWant)
	}
	m, err := Decode(c.rbuf[:n])
	if err != nil {
		// Keep the header so a version mismatch can still be answered.
		if h, herr := DecodeHeader(c.rbuf[:n]); herr == nil && h.Version != Version {
			closeAll(fds)
			return h, nil, err
		}
		closeAll(fds)
		return Message{}, nil, err
	}
	// Copy the body: rbuf is reused by the next Recv.
	m.Body = append([]byte(nil), m.Body...)
	return m, fds, nil
}

func parseRights(oob []byte) ([]int, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	var errs []error
	for i := range msgs {
		if msgs[i].Header.Level != unix.SOL_SOCKET || msgs[i].Header.Type != unix.SCM_RIGHTS {
			continue
		}
		r, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			errs = append(errs, err)
			continue
		}
		fds = append(fds, r...)
	}
	return fds, errors.Join(errs...)
}

func closeAll(fds []int) {
	for _, fd := range fds {
		_ = unix.Close(fd)
	}
}

// Close closes the connection.
func (c *Conn) Close() error { return c.uc.Close() }

// DialConn connects to a daemon socket with a deadline from ctx.
func DialConn(ctx context.Context, path string) (*Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unixpacket", path)
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", path, err)
	}
	return NewConn(c.(*net.UnixConn)), nil
}

// DaemonSocketPath resolves the daemon's socket path (PROTOCOL.md 1): explicit, then
// $STRAPD_SOCKET, then /run/strapd/strapd.sock for root, then the per-user runtime dir.
func DaemonSocketPath(explicit string) string {
	if explicit != "" {
		return explicit
	}
	if p := os.Getenv("STRAPD_SOCKET"); p != "" {
		return p
	}
	if os.Geteuid() == 0 {
		return "/run/strapd/strapd.sock"
	}
	return userSocketPath()
}

// ClientSocketPath resolves the path a client connects to: explicit, then $STRAPD_SOCKET,
// then /run/strapd/strapd.sock when it exists, then the per-user runtime dir.
func ClientSocketPath(explicit string) string {
	if explicit != "" {
		return explicit
	}
	if p := os.Getenv("STRAPD_SOCKET"); p != "" {
		return p
	}
	if _, err := os.Stat("/run/strapd/strapd.sock"); err == nil {
		return "/run/strapd/strapd.sock"
	}
	return userSocketPath()
}

func userSocketPath() string {
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "strapd", "strapd.sock")
	}
	return filepath.Join("/tmp", "strapd-"+strconv.Itoa(os.Getuid()), "strapd.sock")
}

// deadline returns ctx's deadline or a default timeout from now.
func deadline(ctx context.Context, def time.Duration) time.Time {
	if d, ok := ctx.Deadline(); ok {
		return d
	}
	return time.Now().Add(def)
}
