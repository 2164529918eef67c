package server

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/strap-llm/strap/internal/control"
	"github.com/strap-llm/strap/internal/pipeline"
)

// flushTimeout bounds how long a finishing connection waits for its last replies to be
// read by the client.
const flushTimeout = 2 * time.Second

// conn is one client connection and its session, if any.
type conn struct {
	srv  *Server
	c    *control.Conn
	cred unix.Ucred
	log  *zap.Logger
	out  *outbox

	mu      sync.Mutex // guards sess and info for Status
	sess    *pipeline.Session
	info    control.SessionStatus
	slotted bool
	outFile *os.File
	outID   fileID         // outFile's claim in the server (claimOutput), released when it is closed
	res     *resourceLog   // the session's resource log, nil when OPEN passed none
	upload  *sessionUpload // the stream's upload to object storage, nil when none

	rates   rateTracker     // status: MB/s over the last seconds, ratio, tokens, checkpoints
	counted bool            // counted in srv.quotas (removeConn undoes it)
	rate    *requestLimiter // control messages per second
	// published is set at the session's first PUBLISH (the end of its client's model
	// load, for the probes); only the connection's reader touches it.
	published bool
	// holdMax is how many freed ring bytes may wait for the end of a message before a
	// RELEASE goes out (outbox.hold): an eighth of the session's ring, set at OPEN.
	holdMax uint64
}

// wake interrupts the connection's blocking read (shutdown, or a session failure).
func (c *conn) wake() { _ = c.c.Unix().SetReadDeadline(time.Now()) }

func (c *conn) status() (control.SessionStatus, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sess == nil {
		return control.SessionStatus{}, false
	}
	st := c.info
	ss := c.sess.Stats()
	st.Packets, st.Drops, st.BytesIn, st.BytesOut, st.RingUsed = ss.Packets, ss.Drops, ss.BytesIn, ss.BytesOut, ss.RingUsed
	st.CPURawBlocks = ss.CPURawBlocks
	c.rates.fill(&st, ss, time.Now())
	if c.res != nil {
		c.res.fill(&st)
	}
	return st, true
}

// fatal sends a fatal ERROR (no session involved, or before one started).
func (c *conn) fatal(err error) {
	e := wireError(err)
	c.log.Warn("refusing client", zap.String("code", e.Code), zap.Error(err))
	c.out.send(control.TypeError, e)
}

// checkVersion is the one protocol version rule: the frame header of every message and
// HELLO's protocol field must both be Version.
func checkVersion(v int) error {
	if v != control.Version {
		return control.Errorf(control.CodeProtocolVersion, "client speaks protocol %d, strapd speaks protocol %d", v, control.Version)
	}
	return nil
}

// recv reads one message with at most maxFDs descriptors. A message framed in another
// protocol version is refused here, whether or not the rest of it decoded (a version
// mismatch may come with a body this version cannot read).
func (c *conn) recv(maxFDs int) (control.Message, []int, error) {
	m, fds, err := c.c.Recv(maxFDs)
	if m.Version != 0 || err == nil {
		if verr := checkVersion(int(m.Version)); verr != nil {
			closeFDs(fds)
			return m, nil, verr
		}
	}
	return m, fds, err
}

func (c *conn) serve() {
	defer c.srv.wg.Done()
	defer c.srv.removeConn(c)
	c.out = newOutbox(c.c, func(err error) {
		c.log.Warn("client stopped reading or left; replies dropped (a fatal ERROR is still sent)", zap.Error(err))
	})
	defer func() {
		// Nothing more is taken: what the client still has queued is read and dropped
		// (with any descriptors), which wakes a client blocked sending into our full
		// socket (a flood cut off by a limit); its next send then fails with EPIPE, and it
		// turns to read the replies and the ERROR that say why.
		u := c.c.Unix()
		_ = u.CloseRead()
		go func() {
			buf := make([]byte, 4096)
			for {
				if _, err := u.Read(buf); err != nil {
					return
				}
			}
		}()
		c.out.flush(flushTimeout)
		c.c.Close()
		c.out.stop()
	}()
	if !c.handshake() {
		return
	}
	c.loop()
}

func (c *conn) handshake() bool {
	_ = c.c.Unix().SetReadDeadline(time.Now().Add(c.srv.cfg.HandshakeTimeout))
	m, fds, err := c.recv(0)
	closeFDs(fds)
	if err != nil {
		if _, coded := errors.AsType[*control.Error](err); coded {
			c.fatal(err)
		} else if !errors.Is(err, io.EOF) && !c.srv.closing.Load() {
			c.fatal(control.Errorf(control.CodeBadMessage, "handshake: %w", err))
		}
		return false
	}
	if m.Type != control.TypeHello {
		c.fatal(control.Errorf(control.CodeBadMessage, "first message is %s, expected HELLO", m.Type))
		return false
	}
	var h control.Hello
	if err := m.Unmarshal(&h, "protocol"); err != nil {
		c.fatal(control.Errorf(control.CodeBadMessage, "%w", err))
		return false
	}
	if err := checkVersion(h.Protocol); err != nil {
		c.fatal(err)
		return false
	}
	_ = c.c.Unix().SetReadDeadline(time.Time{})
	if err := c.admit(); err != nil {
		c.fatal(control.Errorf(CodeAccessDenied, "%w", err))
		return false
	}
	if c.srv.closing.Load() {
		c.fatal(control.Errorf(control.CodeShutdown, "strapd is shutting down"))
		return false
	}
	c.log.Debug("client connected", zap.String("client", h.Client))
	c.out.send(control.TypeWelcome, control.Welcome{Protocol: control.Version, Daemon: "strapd " + c.srv.cfg.Version,
		PID: os.Getpid(), MaxMessage: control.MaxMessage, MaxRingSize: c.srv.cfg.MaxRingSize})
	return true
}

// drainIdle is how long a draining connection waits for more queued messages.
const drainIdle = 20 * time.Millisecond

// loop serves messages until the connection or its session ends. On shutdown it first
// drains the messages already queued on the socket, so nothing the client published before
// the daemon stopped is lost.
func (c *conn) loop() {
	var drainStart time.Time
	resets := 0
	for {
		if !drainStart.IsZero() {
			if time.Since(drainStart) > c.srv.cfg.ShutdownTimeout/2 {
				c.endOnRecvError(os.ErrDeadlineExceeded, true)
				return
			}
			_ = c.c.Unix().SetReadDeadline(time.Now().Add(drainIdle))
		}
		m, fds, err := c.recv(4)
		if err != nil {
			// Linux reports a peer that closed with our replies unread as ECONNRESET once,
			// before the messages it queued: keep reading them, EOF follows.
			if errors.Is(err, unix.ECONNRESET) && resets < 2 {
				resets++
				continue
			}
			sess := c.session()
			if drainStart.IsZero() && errors.Is(err, os.ErrDeadlineExceeded) && c.srv.closing.Load() &&
				(sess == nil || sess.Err() == nil) {
				drainStart = time.Now()
				continue
			}
			c.endOnRecvError(err, !drainStart.IsZero())
			return
		}
		resets = 0
		if err := c.rate.allow(); err != nil {
			closeFDs(fds)
			c.endWith(err)
			return
		}
		if m.Type == control.TypeClose && len(fds) == 1 && c.uploading() {
			// The client's tokens file, uploaded beside the stream (PROTOCOL.md 1.3).
			c.attachSide(fds[0])
			fds = nil
		}
		if m.Type != control.TypeOpen && len(fds) > 0 {
			closeFDs(fds)
			c.endWith(control.Errorf(control.CodeBadMessage, "%s carried %d file descriptors, expected none", m.Type, len(fds)))
			return
		}
		if done := c.handle(m, fds); done {
			return
		}
	}
}

// endOnRecvError ends the connection after a failed read: client death, shutdown, a
// session failure (which woke the read) or a malformed message.
func (c *conn) endOnRecvError(err error, draining bool) {
	sess := c.session()
	switch {
	case sess != nil && sess.Err() != nil:
		c.finish(pipeline.StatusError)
	case draining && errors.Is(err, os.ErrDeadlineExceeded):
		if sess != nil {
			c.takePublished(sess)
			c.finish(pipeline.StatusAborted)
			c.out.send(control.TypeError, control.Error{Code: control.CodeShutdown, Fatal: true,
				Message: "strapd is shutting down: everything published was written and the stream ended with status aborted"})
		}
	case errors.Is(err, io.EOF) || errors.Is(err, unix.ECONNRESET):
		if sess != nil {
			c.log.Warn("client left without CLOSE; ending stream as aborted")
			c.takePublished(sess)
			c.finish(pipeline.StatusAborted)
		}
	default:
		if _, coded := errors.AsType[*control.Error](err); !coded {
			code := control.CodeBadMessage
			if !errors.Is(err, control.ErrBadMessage) && !errors.Is(err, control.ErrTooManyFDs) {
				code = control.CodeInternal
			}
			err = control.Errorf(code, "%w", err)
		}
		c.endWith(err)
	}
}

// endWith sends a fatal error and ends the session (if any) with status error.
func (c *conn) endWith(err error) {
	if sess := c.session(); sess != nil {
		// The session reports through OnError; record the cause there.
		sess.Fail(endCause{err})
		c.finish(pipeline.StatusError)
		return
	}
	c.fatal(err)
}

func (c *conn) session() *pipeline.Session {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sess
}

// notePublished tells the probes of the session's first publish (PUBLISH, or a TOKEN
// carrying a head): the end of its client's model load.
func (c *conn) notePublished() {
	if c.published {
		return
	}
	c.published = true
	c.mu.Lock()
	id := c.info.Session
	c.mu.Unlock()
	c.srv.probeFirstPublish(id)
}

// takePublished takes, once the client is gone or the daemon stops reading it, the records
// below the ring's published cursor that no message named yet (PROTOCOL.md 1.4).
func (c *conn) takePublished(sess *pipeline.Session) {
	n, err := sess.DrainPublished()
	if n > 0 {
		c.log.Info("took records below the published cursor", zap.Int("records", n))
	}
	if err != nil {
		c.log.Warn("published cursor: drain stopped; the records before it are kept", zap.Error(err))
	}
}

// sessionHandlers serve the messages that act on an open session; each reports whether
// the connection is done. Errors are the session's own (it already told the client).
var sessionHandlers = map[control.Type]func(c *conn, m control.Message, s *pipeline.Session) (bool, error){
	control.TypePublish: func(c *conn, m control.Message, s *pipeline.Session) (bool, error) {
		var p control.Publish
		if err := m.UnmarshalPublish(&p); err != nil {
			return false, err
		}
		if err := s.Publish(p.Head, p.Seq); err != nil {
			return false, err
		}
		c.notePublished()
		return false, nil
	},
	control.TypeDrop: func(_ *conn, m control.Message, s *pipeline.Session) (bool, error) {
		var d control.Drop
		if err := m.Unmarshal(&d, control.DropRequired...); err != nil {
			return false, err
		}
		return false, s.Drop(pipeline.Drop{Seq: d.Seq, Name: d.Name, Step: d.Step, Forward: d.Forward,
			Bytes: d.Bytes, Reason: d.Reason})
	},
	control.TypeToken: func(c *conn, m control.Message, s *pipeline.Session) (bool, error) {
		var t control.Token
		if err := m.UnmarshalToken(&t); err != nil {
			return false, err
		}
		if t.Head != nil {
			// The records before the token, published with it: their last seq is the one
			// before the token's (Token then checks the token's own).
			if err := s.Publish(*t.Head, t.Seq-1); err != nil {
				return false, err
			}
			c.notePublished()
		}
		if err := s.Token(pipeline.Token{Seq: t.Seq, Index: t.Index, TokenID: t.TokenID, Text: t.Text,
			Position: t.Position}); err != nil {
			return false, err
		}
		c.mu.Lock()
		id := c.info.Session
		c.mu.Unlock()
		c.srv.probeToken(id, t)
		return false, nil
	},
	control.TypeCheckpoint: func(_ *conn, m control.Message, s *pipeline.Session) (bool, error) {
		var ck control.Checkpoint
		if err := m.Unmarshal(&ck, "seq"); err != nil {
			return false, err
		}
		return false, s.Checkpoint(ck.Seq)
	},
	control.TypeResources: func(c *conn, m control.Message, _ *pipeline.Session) (bool, error) {
		if c.res == nil {
			return false, fmt.Errorf("%w: RESOURCES but OPEN passed no resource log (\"resources\": true)", control.ErrBadMessage)
		}
		lines, n, err := control.ResourceLines(m)
		if err != nil {
			return false, err
		}
		c.res.append(lines, n)
		if o := c.srv.cfg.Observer; o != nil {
			o.ObserveResources(lines)
		}
		return false, nil
	},
	control.TypeClose: func(c *conn, m control.Message, s *pipeline.Session) (bool, error) {
		var cl control.Close
		if err := m.Unmarshal(&cl, "seq", "head", "drops"); err != nil {
			return false, err
		}
		if err := s.CheckClose(pipeline.Close{Seq: cl.Seq, Head: cl.Head, Drops: cl.Drops}); err != nil {
			return false, err
		}
		res, ferr := c.finish(pipeline.StatusComplete)
		if ferr == nil {
			cl := control.Closed{Packets: res.Packets, Drops: res.Drops,
				BytesIn: res.BytesIn, BytesOut: res.BytesOut, FileBytes: res.FileBytes}
			if c.upload != nil {
				cl.Upload = c.upload.u.Status().Object
			}
			c.out.send(control.TypeClosed, cl)
		}
		return true, nil
	},
}

// handle serves one message; it reports whether the connection is done.
func (c *conn) handle(m control.Message, fds []int) bool {
	sess := c.session()
	switch h, forSession := sessionHandlers[m.Type]; {
	case m.Type == control.TypeStatus:
		c.out.send(control.TypeStatusReply, c.srv.StatusFor(&c.cred))
		return false
	case m.Type == control.TypeOpen && sess != nil:
		closeFDs(fds)
		c.endWith(control.Errorf(control.CodeBadMessage, "a connection carries at most one session"))
		return true
	case m.Type == control.TypeOpen:
		if err := c.open(m, fds); err != nil {
			c.fatal(err)
			return true
		}
		return false
	case !forSession:
		c.endWith(control.Errorf(control.CodeBadMessage, "unexpected %s", m.Type))
		return true
	case sess == nil:
		c.fatal(control.Errorf(control.CodeBadMessage, "%s before OPEN", m.Type))
		return true
	default:
		c.out.hold(c.holdMax)
		done, err := h(c, m, sess)
		c.out.unhold()
		if err != nil {
			if errors.Is(err, control.ErrBadMessage) {
				sess.Fail(endCause{control.Errorf(control.CodeBadMessage, "%w", err)})
			}
			c.finish(pipeline.StatusError)
			return true
		}
		return done
	}
}

// finish ends the session and releases its slot; the session reports its own errors.
func (c *conn) finish(status string) (pipeline.Result, error) {
	sess := c.session()
	res, err := sess.Finish(status)
	if o := c.srv.cfg.Observer; o != nil {
		if st, ok := c.status(); ok {
			o.SessionEnded(st)
		}
	}
	// The trace's last snapshot covers the stream's end; its errors never fail the capture.
	_ = c.srv.probeSessionEnd(c.info.Session)
	// c.mu is released before the server's lock is taken: Status holds s.mu while it takes
	// each c.mu, and the opposite order deadlocked a STATUS against a finishing session.
	c.mu.Lock()
	slotted := c.slotted
	c.slotted = false
	c.mu.Unlock()
	if slotted {
		c.srv.dropSessionSlot()
		c.srv.quotas.closeSession(c.cred.Uid)
		if cerr := c.outFile.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("close output: %w", cerr)
		}
		// Released only once the stream is finished and closed: a session opened on the
		// file after this writes nothing into this one's.
		c.srv.releaseOutput(c.outID, c.info.Session)
		// Like the trace, the resource log never fails the capture: its errors are logged
		// (and were in status while the session lived).
		if c.res != nil {
			if rerr := c.res.close(); rerr != nil {
				c.log.Warn("resource log", zap.Uint64("session", c.info.Session), zap.Error(rerr))
			}
		}
		// The upload goes on after the session: it completes the object from the file,
		// which no longer changes.
		if c.upload != nil {
			if uerr := c.upload.end(res.Status, c.log); uerr != nil {
				c.log.Warn("upload", zap.Uint64("session", c.info.Session), zap.Error(uerr))
			}
		}
	}
	if err != nil {
		c.log.Warn("session ended with error", zap.Uint64("session", c.info.Session), zap.String("status", res.Status), zap.Error(err))
	}
	return res, err
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		_ = unix.Close(fd)
	}
}

// endCause is a failure the server hands to a session: the END packet's error text reads
// "code: message" like the session's own failures, while wireError still finds the coded
// error underneath.
type endCause struct{ err error }

func (e endCause) Error() string {
	if ce, ok := errors.AsType[*control.Error](e.err); ok {
		return ce.Code + ": " + ce.Message
	}
	return e.err.Error()
}

func (e endCause) Unwrap() error { return e.err }
