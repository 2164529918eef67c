package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Client is a small synchronous client of the daemon, used by tests, load generators and
// `strapd status`. It is not safe for concurrent use.
type Client struct {
	conn    *Conn
	welcome Welcome
	// Tail is the newest tail received in a RELEASE.
	Tail uint64
}

// Dial connects to the daemon at path and performs the handshake.
func Dial(ctx context.Context, path, clientName string) (*Client, error) {
	conn, err := DialConn(ctx, path)
	if err != nil {
		return nil, err
	}
	c := &Client{conn: conn}
	if err := conn.Unix().SetDeadline(deadline(ctx, 10*time.Second)); err != nil {
		conn.Close()
		return nil, fmt.Errorf("hello: %w", err)
	}
	if err := conn.Send(TypeHello, Hello{Protocol: Version, Client: clientName, PID: os.Getpid()}); err != nil {
		conn.Close()
		return nil, fmt.Errorf("hello: %w", err)
	}
	m, err := c.expect(TypeWelcome)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("hello: %w", err)
	}
	if err := m.Unmarshal(&c.welcome, "protocol"); err != nil {
		conn.Close()
		return nil, fmt.Errorf("hello: %w", err)
	}
	_ = conn.Unix().SetDeadline(time.Time{})
	return c, nil
}

// Conn is the underlying connection (tests send malformed messages through it).
func (c *Client) Conn() *Conn { return c.conn }

// Welcome is the daemon's handshake answer.
func (c *Client) Welcome() Welcome { return c.welcome }

// Recv reads one message, records RELEASE tails and turns ERROR into *Error (controltest
// polls RELEASE through it).
func (c *Client) Recv() (Message, error) {
	m, fds, err := c.conn.Recv(0)
	if errors.Is(err, unix.ECONNRESET) {
		// Linux reports a peer that closed with our messages unread as ECONNRESET once,
		// before the messages it sent us: read those (an ERROR may be among them).
		m, fds, err = c.conn.Recv(0)
	}
	closeAll(fds)
	if err != nil {
		return m, fmt.Errorf("receive: %w", err)
	}
	switch m.Type {
	case TypeError:
		var e Error
		if err := m.Unmarshal(&e); err != nil {
			return m, err
		}
		return m, &e
	case TypeRelease:
		var r Release
		if err := m.Unmarshal(&r, "tail"); err != nil {
			return m, err
		}
		if r.Tail > c.Tail {
			c.Tail = r.Tail
		}
	}
	return m, nil
}

// expect reads messages until one of type t, absorbing RELEASE messages.
func (c *Client) expect(t Type) (Message, error) {
	for {
		m, err := c.Recv()
		if err != nil {
			return m, err
		}
		if m.Type == t {
			return m, nil
		}
		if m.Type != TypeRelease {
			return m, fmt.Errorf("%w: %s while waiting for %s", ErrUnexpected, m.Type, t)
		}
	}
}

// Open sends OPEN with the ring memfd and output file and waits for OPENED.
func (c *Client) Open(ring, out *os.File, req Open) (Opened, error) {
	return c.open(req, int(ring.Fd()), int(out.Fd()))
}

// OpenResources sends OPEN with a resource log (req.Resources is set): res is a file
// open for writing into which the daemon appends the events of later RESOURCES messages.
func (c *Client) OpenResources(ring, out, res *os.File, req Open) (Opened, error) {
	req.Resources = true
	return c.open(req, int(ring.Fd()), int(out.Fd()), int(res.Fd()))
}

func (c *Client) open(req Open, fds ...int) (Opened, error) {
	var o Opened
	if err := c.conn.Send(TypeOpen, req, fds...); err != nil {
		return o, fmt.Errorf("open: %w", err)
	}
	m, err := c.expect(TypeOpened)
	if err != nil {
		return o, fmt.Errorf("open: %w", err)
	}
	if err := m.Unmarshal(&o, "session"); err != nil {
		return o, fmt.Errorf("open: %w", err)
	}
	return o, nil
}

// Resources sends RESOURCES with events, each a JSON object with an "event" name.
func (c *Client) Resources(events ...json.RawMessage) error {
	return c.conn.Send(TypeResources, Resources{Events: events})
}

// Publish sends PUBLISH.
func (c *Client) Publish(head, seq uint64) error {
	return c.conn.Send(TypePublish, Publish{Head: head, Seq: seq})
}

// Drop sends DROP.
func (c *Client) Drop(d Drop) error { return c.conn.Send(TypeDrop, d) }

// WaitRelease blocks until a RELEASE raises the tail above old (or an ERROR arrives) and
// returns the newest tail.
func (c *Client) WaitRelease(old uint64) (uint64, error) {
	for c.Tail <= old {
		m, err := c.Recv()
		if err != nil {
			return c.Tail, err
		}
		if m.Type != TypeRelease {
			return c.Tail, fmt.Errorf("%w: %s while waiting for RELEASE", ErrUnexpected, m.Type)
		}
	}
	return c.Tail, nil
}

// Close sends CLOSE and waits for CLOSED (absorbing RELEASE messages).
func (c *Client) Close(req Close) (Closed, error) {
	var cl Closed
	if err := c.conn.Send(TypeClose, req); err != nil {
		return cl, fmt.Errorf("close: %w", err)
	}
	m, err := c.expect(TypeClosed)
	if err != nil {
		return cl, fmt.Errorf("close: %w", err)
	}
	if err := m.Unmarshal(&cl); err != nil {
		return cl, fmt.Errorf("close: %w", err)
	}
	return cl, nil
}

// Status asks for the daemon's status.
func (c *Client) Status() (StatusReply, error) {
	var r StatusReply
	if err := c.conn.Send(TypeStatus, nil); err != nil {
		return r, fmt.Errorf("status: %w", err)
	}
	m, err := c.expect(TypeStatusReply)
	if err != nil {
		return r, fmt.Errorf("status: %w", err)
	}
	if err := m.Unmarshal(&r, "daemon"); err != nil {
		return r, fmt.Errorf("status: %w", err)
	}
	return r, nil
}

// Disconnect closes the socket without CLOSE (what a dying client does).
func (c *Client) Disconnect() error { return c.conn.Close() }
