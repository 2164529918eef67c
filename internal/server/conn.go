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

	"github.com/strap-llm/strap/internal/codec"
	"github.com/strap-llm/strap/internal/control"
	"github.com/strap-llm/strap/internal/pipeline"
	"github.com/strap-llm/strap/internal/shm"
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

	rates   rateTracker     // status: MB/s over the last seconds, ratio, tokens, checkpoints
	counted bool            // counted in srv.quotas (removeConn undoes it)
	rate    *requestLimiter // control messages per second
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
	c.rates.fill(&st, ss, time.Now())
	return st, true
}

// fatal sends a fatal ERROR (no session involved, or before one started).
func (c *conn) fatal(code string, err error) {
	c.log.Warn("refusing client", zap.String("code", code), zap.Error(err))
	c.out.send(control.TypeError, control.Error{Code: code, Message: err.Error(), Fatal: true})
}

func (c *conn) serve() {
	defer c.srv.wg.Done()
	defer c.srv.removeConn(c)
	c.out = newOutbox(c.c, func(err error) {
		c.log.Warn("client stopped reading or left; replies dropped", zap.Error(err))
	})
	defer func() {
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
	m, fds, err := c.c.Recv(0)
	closeFDs(fds)
	if err != nil {
		if m.Version != 0 && m.Version != control.Version {
			c.fatal(control.CodeProtocolVersion, fmt.Errorf("client speaks protocol %d, strapd speaks protocol %d", m.Version, control.Version))
			return false
		}
		if !errors.Is(err, io.EOF) && !c.srv.closing.Load() {
			c.fatal(control.CodeBadMessage, fmt.Errorf("handshake: %w", err))
		}
		return false
	}
	if m.Version != control.Version {
		c.fatal(control.CodeProtocolVersion, fmt.Errorf("client speaks protocol %d, strapd speaks protocol %d", m.Version, control.Version))
		return false
	}
	if m.Type != control.TypeHello {
		c.fatal(control.CodeBadMessage, fmt.Errorf("first message is %s, expected HELLO", m.Type))
		return false
	}
	var h control.Hello
	if err := m.Unmarshal(&h, "protocol"); err != nil {
		c.fatal(control.CodeBadMessage, err)
		return false
	}
	if h.Protocol != control.Version {
		c.fatal(control.CodeProtocolVersion, fmt.Errorf("client speaks protocol %d, strapd speaks protocol %d", h.Protocol, control.Version))
		return false
	}
	_ = c.c.Unix().SetReadDeadline(time.Time{})
	if err := c.admit(); err != nil {
		c.fatal(CodeAccessDenied, err)
		return false
	}
	if c.srv.closing.Load() {
		c.fatal(control.CodeShutdown, errors.New("strapd is shutting down"))
		return false
	}
	c.log.Debug("client connected", zap.String("client", h.Client))
	c.out.send(control.TypeWelcome, control.Welcome{Protocol: control.Version, Daemon: "strapd " + c.srv.cfg.Version,
		PID: os.Getpid(), MaxMessage: control.MaxMessage})
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
		m, fds, err := c.c.Recv(3)
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
			var pe *pipeline.Error
			errors.As(err, &pe)
			c.endWith(pe.Code, pe.Err)
			return
		}
		if m.Version != control.Version {
			closeFDs(fds)
			c.endWith(control.CodeProtocolVersion, fmt.Errorf("message in protocol %d, strapd speaks protocol %d", m.Version, control.Version))
			return
		}
		if m.Type != control.TypeOpen && len(fds) > 0 {
			closeFDs(fds)
			c.endWith(control.CodeBadMessage, fmt.Errorf("%s carried %d file descriptors, expected none", m.Type, len(fds)))
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
			c.finish(pipeline.StatusAborted)
			c.out.send(control.TypeError, control.Error{Code: control.CodeShutdown, Fatal: true,
				Message: "strapd is shutting down: everything published was written and the stream ended with status aborted"})
		}
	case errors.Is(err, io.EOF) || errors.Is(err, unix.ECONNRESET):
		if sess != nil {
			c.log.Warn("client left without CLOSE; ending stream as aborted")
			c.finish(pipeline.StatusAborted)
		}
	default:
		code := control.CodeBadMessage
		if !errors.Is(err, control.ErrBadMessage) && !errors.Is(err, control.ErrTooManyFDs) {
			code = control.CodeInternal
		}
		c.endWith(code, err)
	}
}

// endWith sends a fatal error and ends the session (if any) with status error.
func (c *conn) endWith(code string, err error) {
	if sess := c.session(); sess != nil {
		// The session reports through OnError; record the cause there.
		sess.Fail(code, err)
		c.finish(pipeline.StatusError)
		return
	}
	c.fatal(code, err)
}

func (c *conn) session() *pipeline.Session {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sess
}

// handle serves one message; it reports whether the connection is done.
func (c *conn) handle(m control.Message, fds []int) bool {
	sess := c.session()
	switch m.Type {
	case control.TypeStatus:
		c.out.send(control.TypeStatusReply, c.srv.StatusFor(&c.cred))
		return false
	case control.TypeOpen:
		if sess != nil {
			closeFDs(fds)
			c.endWith(control.CodeBadMessage, errors.New("a connection carries at most one session"))
			return true
		}
		if err := c.open(m, fds); err != nil {
			var pe *pipeline.Error
			if errors.As(err, &pe) {
				c.fatal(pe.Code, pe.Err)
			} else {
				c.fatal(control.CodeInternal, err)
			}
			return true
		}
		return false
	case control.TypePublish, control.TypeDrop, control.TypeToken, control.TypeCheckpoint, control.TypeClose:
	default:
		c.endWith(control.CodeBadMessage, fmt.Errorf("unexpected %s", m.Type))
		return true
	}
	if sess == nil {
		c.fatal(control.CodeBadMessage, fmt.Errorf("%s before OPEN", m.Type))
		return true
	}
	var err error
	switch m.Type {
	case control.TypePublish:
		var p control.Publish
		if err = m.Unmarshal(&p, "head", "seq"); err == nil {
			err = sess.Publish(p.Head, p.Seq)
		}
	case control.TypeDrop:
		var d control.Drop
		if err = m.Unmarshal(&d, control.DropRequired...); err == nil {
			err = sess.Drop(d)
		}
	case control.TypeToken:
		var t control.Token
		if err = m.Unmarshal(&t, "seq", "index"); err == nil {
			err = sess.Token(t)
		}
	case control.TypeCheckpoint:
		var ck control.Checkpoint
		if err = m.Unmarshal(&ck, "seq"); err == nil {
			err = sess.Checkpoint(ck)
		}
	case control.TypeClose:
		var cl control.Close
		if err = m.Unmarshal(&cl, "seq", "head", "drops"); err == nil {
			err = sess.CheckClose(cl)
		}
		if err == nil {
			res, ferr := c.finish(pipeline.StatusComplete)
			if ferr == nil {
				c.out.send(control.TypeClosed, control.Closed{Packets: res.Packets, Drops: res.Drops,
					BytesIn: res.BytesIn, BytesOut: res.BytesOut, FileBytes: res.FileBytes})
			}
			return true
		}
	}
	if err != nil {
		if errors.Is(err, control.ErrBadMessage) {
			sess.Fail(control.CodeBadMessage, err)
		}
		c.finish(pipeline.StatusError)
		return true
	}
	return false
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

func perr(code string, format string, args ...any) error {
	return &pipeline.Error{Code: code, Err: fmt.Errorf(format, args...)}
}

// open validates OPEN and its two descriptors and starts the session. The descriptors are
// always closed (the ring stays mapped; the output is kept open as an *os.File).
func (c *conn) open(m control.Message, fds []int) (err error) {
	defer func() {
		if err != nil {
			closeFDs(fds)
		}
	}()
	if len(fds) != 2 && len(fds) != 3 {
		return perr(control.CodeBadMessage, "OPEN carries %d file descriptors, expected 2 or 3 (ring memfd, output file, optional trace file)", len(fds))
	}
	var req control.Open
	if err := m.Unmarshal(&req, control.OpenRequired...); err != nil {
		return &pipeline.Error{Code: control.CodeBadMessage, Err: err}
	}
	cfg := &c.srv.cfg
	if req.RingSize > cfg.MaxRingSize {
		return perr(control.CodeLimit, "ring_size %d exceeds this daemon's maximum %d (--max-ring-size)", req.RingSize, cfg.MaxRingSize)
	}
	if err := shm.CheckRingSize(req.RingSize); err != nil {
		return &pipeline.Error{Code: control.CodeRingSize, Err: err}
	}
	if req.Policy != "block" && req.Policy != "drop" {
		return perr(control.CodeBadMessage, "policy %q, expected \"block\" or \"drop\"", req.Policy)
	}
	resume, err := resumeExpect(req)
	if err != nil {
		return err
	}
	bs := req.BlockSize
	if bs == 0 {
		bs = pipeline.DefaultBlockSize
	}
	if bs < 4096 || bs > cfg.MaxBlockSize {
		return perr(control.CodeLimit, "block_size %d, expected 4096..%d", bs, cfg.MaxBlockSize)
	}
	copts := codec.Options{Level: req.CodecLevel}
	if req.Lossy != nil {
		copts.Lossy = &codec.LossyBound{Mode: req.Lossy.Mode, Value: req.Lossy.Value}
	}
	cd, err := codec.New(req.Codec, copts)
	if err != nil {
		return &pipeline.Error{Code: control.CodeBadCodec, Err: err}
	}
	if lc, ok := cd.(codec.LossyCodec); ok && lc.Bound().Mode == "" {
		return perr(control.CodeBadCodec, "codec %s is lossy and needs a bound: OPEN \"lossy\": {\"mode\": \"rel\"|\"abs\"|\"fp16\", \"value\": v}", cd.Name())
	}
	if err := checkOutput(fds[1]); err != nil {
		return err
	}
	if err := c.srv.checkTrace(fds); err != nil {
		return err
	}
	if err := c.srv.quotas.openSession(cfg.Clients, c.cred.Uid); err != nil {
		return &pipeline.Error{Code: control.CodeLimit, Err: err}
	}
	id, ok := c.srv.takeSessionSlot()
	if !ok {
		c.srv.quotas.closeSession(c.cred.Uid)
		return perr(control.CodeLimit, "%d sessions already open (--max-sessions)", cfg.MaxSessions)
	}
	defer func() {
		if err != nil {
			c.srv.dropSessionSlot()
			c.srv.quotas.closeSession(c.cred.Uid)
		}
	}()
	lease, err := c.srv.budget.Open(int64(req.RingSize), pipeline.Reserve(cd, int(bs), req.RingSize-shm.HeaderSize))
	if err != nil {
		return &pipeline.Error{Code: control.CodeMemoryBudget, Err: fmt.Errorf("%w (--memory-limit)", err)}
	}
	ring, err := shm.Map(fds[0], req.RingSize)
	if err != nil {
		lease.Close()
		code := control.CodeRingHeader
		switch {
		case errors.Is(err, shm.ErrNotSealed), errors.Is(err, shm.ErrNotMemfd):
			code = control.CodeRingNotSealed
		case errors.Is(err, shm.ErrRingSize):
			code = control.CodeRingSize
		}
		return &pipeline.Error{Code: code, Err: err}
	}
	_ = unix.Close(fds[0])
	out := os.NewFile(uintptr(fds[1]), fmt.Sprintf("session-%d-output", id))
	var trace *os.File
	if len(fds) == 3 {
		trace = os.NewFile(uintptr(fds[2]), fmt.Sprintf("session-%d-trace", id))
	}
	fds = nil

	host, _ := os.Hostname()
	meta := map[string]any{
		"strapd_version": cfg.Version, "created": time.Now().UTC().Format(time.RFC3339), "host": host,
		"session": id, "codec": cd.Name(), "codec_level": req.CodecLevel, "block_size": bs, "policy": req.Policy,
		"client_metadata": req.Metadata,
		// Who opened the session, as the kernel reported it (SO_PEERCRED), not as the client says.
		"peer": map[string]any{"pid": c.cred.Pid, "uid": c.cred.Uid, "gid": c.cred.Gid},
	}
	if req.Metadata == nil {
		meta["client_metadata"] = map[string]any{}
	}
	if req.Lossy != nil {
		meta["lossy"] = req.Lossy
	}
	log := c.log.With(zap.Uint64("session", id))
	sess, err := pipeline.Start(pipeline.Options{
		ID: id, Ring: ring, Output: out, Codec: cd, BlockSize: int(bs), Metadata: meta, Limits: cfg.Limits,
		Pool: c.srv.pool, Lease: lease, Release: c.out.release, Log: log, WriteDelay: cfg.DebugWriteDelay,
		Resume: resume, Observer: c.srv.cfg.Observer,
		OnCheckpoint: func(ck control.Checkpointed) {
			c.out.send(control.TypeCheckpointed, ck)
		},
		OnError: func(e *pipeline.Error) {
			c.out.send(control.TypeError, control.Error{Code: e.Code, Message: e.Err.Error(), Fatal: true})
			c.wake()
		},
	})
	if err != nil {
		out.Close()
		if trace != nil {
			trace.Close()
		}
		return err
	}
	str := func(k string) string { s, _ := req.Metadata[k].(string); return s }
	c.mu.Lock()
	c.sess = sess
	c.slotted = true
	c.info = control.SessionStatus{Session: id, PID: c.cred.Pid, UID: c.cred.Uid, ModelClass: str("model_class"),
		OutputPath: str("output_path"), Codec: cd.Name(), Policy: req.Policy, Started: time.Now().UTC().Format(time.RFC3339),
		RingSize: req.RingSize, Resumed: req.AppendAt}
	c.rates.start(time.Now(), sess.Stats())
	// The output file stays open for the session's life; finish closes it.
	c.outFile = out
	c.mu.Unlock()
	c.srv.probeSessionStart(id, c.info.OutputPath, int(c.cred.Pid), trace)
	log.Info("session opened", zap.String("codec", cd.Name()), zap.Uint64("ring_size", req.RingSize),
		zap.String("policy", req.Policy), zap.String("output_path", c.info.OutputPath))
	c.out.send(control.TypeOpened, control.Opened{Session: id, BlockSize: bs})
	return nil
}

// checkOutput verifies the output descriptor is a regular file open for writing, without
// O_APPEND (the stream is written at explicit offsets from 0).
func checkOutput(fd int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return perr(control.CodeBadOutput, "fstat output: %v", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return perr(control.CodeBadOutput, "output is file type %#o, expected a regular file", st.Mode&unix.S_IFMT)
	}
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil {
		return perr(control.CodeBadOutput, "output flags: %v", err)
	}
	if acc := fl & unix.O_ACCMODE; acc != unix.O_WRONLY && acc != unix.O_RDWR {
		return perr(control.CodeBadOutput, "output is not open for writing (open it O_WRONLY|O_CREAT|O_TRUNC)")
	}
	if fl&unix.O_APPEND != 0 {
		return perr(control.CodeBadOutput, "output is open with O_APPEND; open it O_WRONLY|O_CREAT|O_TRUNC")
	}
	return nil
}
