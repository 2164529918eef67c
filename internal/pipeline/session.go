package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/strap-llm/strap/internal/codec"
	"github.com/strap-llm/strap/internal/control"
	"github.com/strap-llm/strap/internal/dtype"
	"github.com/strap-llm/strap/internal/shm"
	"github.com/strap-llm/strap/internal/writer"
)

// DefaultBlockSize is the raw bytes per compression block when OPEN names none.
const DefaultBlockSize = 1 << 20

// End statuses written into the END packet.
const (
	StatusComplete = "complete"
	StatusAborted  = "aborted"
	StatusError    = "error"
)

// Error is a session failure with the protocol error code the client receives.
type Error struct {
	Code string
	Err  error
}

// Error formats the code and cause.
func (e *Error) Error() string { return e.Code + ": " + e.Err.Error() }

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

func errf(code, format string, args ...any) *Error {
	return &Error{Code: code, Err: fmt.Errorf(format, args...)}
}

// Options configure one session. The ring, output and lease are owned by the session from
// Start on (Start closes them on failure too, except Output, which the caller closes).
type Options struct {
	// ID is the session number (for logs and the stream metadata).
	ID uint64
	// Ring is the client's ring, mapped read-only.
	Ring *shm.Ring
	// Output is the stream file; the session writes it but does not close it.
	Output *os.File
	// Codec compresses payloads; nil or codec None writes raw bytes straight from the ring.
	Codec codec.Codec
	// BlockSize is the raw bytes per codec block (DefaultBlockSize when 0).
	BlockSize int
	// Metadata is the stream header's metadata object.
	Metadata map[string]any
	// Limits tighten the per-record limits.
	Limits shm.Limits
	// Pool runs compression jobs; shared by all sessions.
	Pool *Pool
	// Lease is this session's memory budget share (see Budget.Open and SlotSize).
	Lease *Lease
	// Release is called with each new ring tail; it must not block.
	Release func(tail uint64)
	// OnError is called once, with the first fatal error; it must not block.
	OnError func(*Error)
	// Log receives the session's log lines.
	Log *zap.Logger
	// WriteDelay slows the writer by this much per packet (tests fill tiny rings with it).
	WriteDelay time.Duration
	// Resume, when set, continues the stream already in Output instead of starting one
	// (writer.Resume checks the prefix); sequence numbers go on after its LastSeq.
	Resume *writer.ResumeExpect
	// OnCheckpoint is called from the writer goroutine once every event up to a
	// checkpoint's seq is written and fdatasynced; it must not block.
	OnCheckpoint func(control.Checkpointed)
	// Observer receives write, fdatasync, checkpoint and token timings; nil: none.
	Observer Observer
}

// Observer receives a session's timings (internal/metrics implements it). Its methods are
// called from the session's goroutines and must return quickly.
type Observer interface {
	// ObserveWrite is the time one packet took to reach the file.
	ObserveWrite(time.Duration)
	// ObserveSync is the time of one fdatasync.
	ObserveSync(time.Duration)
	// ObserveCheckpoint is the time from a CHECKPOINT to its durable reply.
	ObserveCheckpoint(time.Duration)
	// ObserveToken is a TOKEN of session arriving at at.
	ObserveToken(session uint64, at time.Time)
}

// Reserve is the compression buffer memory a session must reserve at open so that its
// largest possible record (one filling the data region) can always be compressed: 0 for
// codec none, which writes straight from the ring.
func Reserve(c codec.Codec, blockSize int, dataSize uint64) int64 {
	if c == nil || c.ID() == codec.None {
		return 0
	}
	if blockSize <= 0 {
		blockSize = DefaultBlockSize
	}
	full := int64(dataSize) / int64(blockSize)
	r := full * int64(bufCap(blockSize))
	if rest := int(int64(dataSize) % int64(blockSize)); rest > 0 {
		r += int64(bufCap(rest))
	}
	return r
}

// bufCap is the capacity of a compression buffer for a block of n raw bytes: room for
// codecs that expand incompressible input a little before giving up.
func bufCap(n int) int { return n + n/64 + 1024 }

// Stats are a session's counters.
type Stats struct {
	Packets uint64
	Drops   uint64
	Tokens  uint64
	// Checkpoints counts durable checkpoints; LastCheckpoint is when the last one was
	// made (zero when none).
	Checkpoints    uint64
	LastCheckpoint time.Time
	BytesIn        uint64
	BytesOut       uint64
	RingUsed       uint64
	Head           uint64
	Tail           uint64
}

// Result is what CLOSED reports.
type Result struct {
	Stats
	FileBytes uint64
	Status    string
}

type itemKind uint8

const (
	kindTensor itemKind = iota
	kindDrop
	kindToken
	kindCheckpoint
)

// item is one ordered event of a session on its way to the writer.
type item struct {
	kind itemKind
	seq  uint64
	rec  shm.Record
	meta []byte
	span *span // ring bytes it holds; nil for notices
	drop control.Drop
	tok  control.Token
	at   time.Time // when a checkpoint was asked for

	blocks  []writer.Block
	stats   []codec.BlockStats // lossy codecs: the error of each block
	grants  []grant
	pending atomic.Int32
	done    chan struct{}
	errMu   sync.Mutex
	err     error
}

// span is one record's ring range in the tail tracker.
type span struct {
	end   uint64
	freed bool
}

// Session is one capture: it parses what the client publishes, compresses on the shared
// pool and writes packets in sequence order.
type Session struct {
	o     Options
	w     *writer.Writer
	codec codec.Codec
	bs    int
	ctx   context.Context
	stop  context.CancelFunc

	// Input side, used only by the connection's goroutine.
	rd       *shm.Reader
	head     uint64
	nextSeq  uint64
	dropsIn  uint64
	inClosed bool

	queue      chan *item
	writerDone chan struct{}

	// Tail tracker.
	tmu   sync.Mutex
	spans []*span
	tail  uint64

	failOnce sync.Once
	failed   chan struct{}
	ferr     atomic.Pointer[Error]

	packets, drops, bytesIn, bytesOut, headA, tailA atomic.Uint64
	tokens, checkpoints                             atomic.Uint64
	lastCkpt                                        atomic.Int64 // unix nanoseconds
	finishOnce                                      sync.Once
	result                                          Result
	resultErr                                       error
}

// Start writes the stream header and starts the session's writer.
func Start(o Options) (*Session, error) {
	if o.BlockSize <= 0 {
		o.BlockSize = DefaultBlockSize
	}
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	if o.Release == nil {
		o.Release = func(uint64) {}
	}
	if o.OnError == nil {
		o.OnError = func(*Error) {}
	}
	if o.OnCheckpoint == nil {
		o.OnCheckpoint = func(control.Checkpointed) {}
	}
	var (
		w   *writer.Writer
		err error
	)
	nextSeq := uint64(1)
	if o.Resume != nil {
		w, err = writer.Resume(o.Output, *o.Resume)
		nextSeq = o.Resume.LastSeq + 1
	} else {
		w, err = writer.New(o.Output, o.Metadata)
	}
	if err == nil && o.Observer != nil {
		w.OnSync = o.Observer.ObserveSync
	}
	if err != nil {
		o.Ring.Close()
		o.Lease.Close()
		what := "write stream header"
		if o.Resume != nil {
			what = "resume stream"
		}
		return nil, &Error{Code: control.CodeBadOutput, Err: fmt.Errorf("%s: %w", what, err)}
	}
	c := o.Codec
	if c != nil && c.ID() == codec.None {
		c = nil
	}
	ctx, stop := context.WithCancel(context.Background())
	s := &Session{
		o: o, w: w, codec: c, bs: o.BlockSize, ctx: ctx, stop: stop,
		rd:         shm.NewReader(o.Ring.Data(), 0, o.Limits),
		nextSeq:    nextSeq,
		queue:      make(chan *item, 1024),
		writerDone: make(chan struct{}),
		failed:     make(chan struct{}),
	}
	s.packets.Store(w.Packets())
	s.drops.Store(w.Drops())
	s.tokens.Store(w.Tokens())
	go s.writeLoop()
	return s, nil
}

// Failed is closed when the session hit a fatal error.
func (s *Session) Failed() <-chan struct{} { return s.failed }

// Err is the session's fatal error, or nil.
func (s *Session) Err() *Error { return s.ferr.Load() }

// fail records the first fatal error, logs it and reports it to the client.
func (s *Session) fail(e *Error) *Error {
	s.failOnce.Do(func() {
		s.ferr.Store(e)
		s.o.Log.Error("session failed", zap.String("code", e.Code), zap.Error(e.Err))
		close(s.failed)
		s.o.OnError(e)
	})
	return s.ferr.Load()
}

// Fail ends the session with a fatal error found outside the pipeline (a malformed
// message on its connection). It returns the session's first fatal error.
func (s *Session) Fail(code string, err error) *Error {
	return s.fail(&Error{Code: code, Err: err})
}

// Stats returns the counters now.
func (s *Session) Stats() Stats {
	h, t := s.headA.Load(), s.tailA.Load()
	st := Stats{Packets: s.packets.Load(), Drops: s.drops.Load(), Tokens: s.tokens.Load(), BytesIn: s.bytesIn.Load(),
		BytesOut: s.bytesOut.Load(), Head: h, Tail: t, RingUsed: h - min(t, h), Checkpoints: s.checkpoints.Load()}
	if ns := s.lastCkpt.Load(); ns != 0 {
		st.LastCheckpoint = time.Unix(0, ns)
	}
	return st
}

// Publish takes the window [previous head, head): it parses every record in it and queues
// them. seq is the last tensor record's sequence number in the window. It returns the
// session's fatal error when the window is bad or the session already failed.
func (s *Session) Publish(head, seq uint64) error {
	if e := s.Err(); e != nil {
		return e
	}
	if head < s.head {
		return s.fail(errf(control.CodeBadRecord, "publish head %d, expected at least the previous head %d", head, s.head))
	}
	s.tmu.Lock()
	tail := s.tail
	s.tmu.Unlock()
	if ds := s.o.Ring.DataSize(); head-tail > ds {
		return s.fail(errf(control.CodeBadRecord, "publish head %d is more than data_size %d past tail %d", head, ds, tail))
	}
	s.head = head
	s.headA.Store(head)
	var last uint64
	for s.rd.Pos() < head {
		rec, pos, err := s.rd.Next(head)
		if err != nil {
			return s.fail(&Error{Code: control.CodeBadRecord, Err: err})
		}
		sp := &span{end: pos + rec.Len}
		s.tmu.Lock()
		s.spans = append(s.spans, sp)
		s.tmu.Unlock()
		if rec.Kind == shm.KindPad {
			s.free(sp)
			continue
		}
		if rec.Seq != s.nextSeq {
			s.free(sp)
			return s.fail(errf(control.CodeTornRecord, "record at position %d has seq %d, expected %d", pos, rec.Seq, s.nextSeq))
		}
		s.nextSeq++
		last = rec.Seq
		it := &item{kind: kindTensor, seq: rec.Seq, rec: rec, span: sp, done: make(chan struct{})}
		// Name and meta are copied: the client may reuse the bytes once released.
		if len(rec.Meta) > 0 {
			it.meta = append([]byte(nil), rec.Meta...)
			var obj map[string]json.RawMessage
			if err := json.Unmarshal(it.meta, &obj); err != nil {
				s.free(sp)
				return s.fail(errf(control.CodeBadRecord, "record seq %d: meta is not a JSON object: %v", rec.Seq, err))
			}
		}
		s.bytesIn.Add(uint64(len(rec.Payload)))
		if err := s.dispatch(it); err != nil {
			return err
		}
	}
	if last != 0 && last != seq {
		return s.fail(errf(control.CodeTornRecord, "publish says last seq %d, window ends with record seq %d", seq, last))
	}
	return nil
}

// dispatch queues it for the writer and, for compressed codecs, its blocks for the pool.
func (s *Session) dispatch(it *item) error {
	if s.codec == nil || it.kind != kindTensor {
		close(it.done)
		return s.enqueue(it)
	}
	p := it.rec.Payload
	n := (len(p) + s.bs - 1) / s.bs
	it.blocks = make([]writer.Block, n)
	it.grants = make([]grant, n)
	if n == 0 {
		s.free(it.span)
		close(it.done)
		return s.enqueue(it)
	}
	dt := it.rec.DType
	enc := s.codec
	if tp, ok := enc.(codec.TensorPreparer); ok {
		// One pass over the whole record (e.g. the RMS a relative bound refers to).
		c, err := tp.ForTensor(p, dt)
		if err != nil {
			s.free(it.span)
			return s.fail(&Error{Code: control.CodeCodec, Err: fmt.Errorf("prepare seq %d (%s): %w", it.seq, it.rec.Name, err)})
		}
		enc = c
	}
	se, withStats := enc.(codec.StatsEncoder)
	if withStats {
		it.stats = make([]codec.BlockStats, n)
	}
	it.pending.Store(int32(n))
	// Queue the item first so the writer waits on it in order while blocks compress.
	if err := s.enqueue(it); err != nil {
		return err
	}
	for i := range n {
		src := p[i*s.bs : min(len(p), (i+1)*s.bs)]
		g, err := s.o.Lease.acquire(s.ctx, int64(bufCap(len(src))))
		if err != nil {
			it.setErr(err)
			for range n - i {
				s.blockDone(it)
			}
			return s.fail(&Error{Code: control.CodeInternal, Err: fmt.Errorf("wait for memory budget: %w", err)})
		}
		it.grants[i] = g
		i := i
		job := func() {
			buf := getBuf(bufCap(len(src)))
			var (
				out        []byte
				compressed bool
				err        error
			)
			if withStats {
				var st codec.BlockStats
				out, compressed, st, err = se.EncodeStats(buf[:0], src, dt)
				if !compressed {
					st = codec.BlockStats{Values: len(src) / max(1, dt.Size()), Lossless: true}
				}
				it.stats[i] = st
			} else {
				out, compressed, err = enc.Encode(buf[:0], src, dt)
			}
			switch {
			case err != nil:
				it.setErr(fmt.Errorf("block %d: %w", i, err))
				putBuf(buf)
			case compressed:
				it.blocks[i] = writer.Block{Data: out}
			default:
				// Stored verbatim: copy, since the ring bytes are released before writing.
				it.blocks[i] = writer.Block{Data: append(out[:0], src...), Raw: true}
			}
			s.blockDone(it)
		}
		if err := s.o.Pool.Submit(s.ctx, job); err != nil {
			it.setErr(err)
			for range n - i {
				s.blockDone(it)
			}
			return s.fail(&Error{Code: control.CodeInternal, Err: fmt.Errorf("submit block: %w", err)})
		}
	}
	return nil
}

func (it *item) setErr(err error) {
	it.errMu.Lock()
	if it.err == nil {
		it.err = err
	}
	it.errMu.Unlock()
}

func (it *item) getErr() error {
	it.errMu.Lock()
	defer it.errMu.Unlock()
	return it.err
}

// blockDone counts one finished block; the last one frees the ring bytes.
func (s *Session) blockDone(it *item) {
	if it.pending.Add(-1) == 0 {
		s.free(it.span)
		close(it.done)
	}
}

func (s *Session) enqueue(it *item) error {
	select {
	case s.queue <- it:
		return nil
	case <-s.ctx.Done():
		return s.fail(&Error{Code: control.CodeInternal, Err: s.ctx.Err()})
	}
}

// Drop takes a DROP notice: it takes the next sequence number and becomes a DROP packet.
func (s *Session) Drop(d control.Drop) error {
	if e := s.Err(); e != nil {
		return e
	}
	if d.Seq != s.nextSeq {
		return s.fail(errf(control.CodeTornRecord, "drop %q has seq %d, expected %d", d.Name, d.Seq, s.nextSeq))
	}
	if d.Name == "" || len(d.Name) > shm.MaxNameLen {
		return s.fail(errf(control.CodeBadMessage, "drop seq %d: name length %d, expected 1..%d", d.Seq, len(d.Name), shm.MaxNameLen))
	}
	s.nextSeq++
	s.dropsIn++
	it := &item{kind: kindDrop, seq: d.Seq, drop: d, done: make(chan struct{})}
	close(it.done)
	return s.enqueue(it)
}

// Token takes a TOKEN notice: it takes the next sequence number and becomes a TOKEN packet.
func (s *Session) Token(t control.Token) error {
	if e := s.Err(); e != nil {
		return e
	}
	if t.Seq != s.nextSeq {
		return s.fail(errf(control.CodeTornRecord, "token has seq %d, expected %d", t.Seq, s.nextSeq))
	}
	s.nextSeq++
	if s.o.Observer != nil {
		s.o.Observer.ObserveToken(s.o.ID, time.Now())
	}
	it := &item{kind: kindToken, seq: t.Seq, tok: t, done: make(chan struct{})}
	close(it.done)
	return s.enqueue(it)
}

// Checkpoint asks for every event up to seq (the last sequence number taken) to be written
// and fdatasynced; Options.OnCheckpoint then reports the durable facts. A seq other than
// the last one received is a fatal torn_record: a checkpoint must cover everything sent.
func (s *Session) Checkpoint(c control.Checkpoint) error {
	if e := s.Err(); e != nil {
		return e
	}
	if c.Seq != s.nextSeq-1 {
		return s.fail(errf(control.CodeTornRecord, "checkpoint seq %d, last sequence number received %d", c.Seq, s.nextSeq-1))
	}
	it := &item{kind: kindCheckpoint, seq: c.Seq, at: time.Now(), done: make(chan struct{})}
	close(it.done)
	return s.enqueue(it)
}

// CheckClose validates CLOSE against what was received: the head of the last PUBLISH, the
// last sequence number taken, and the number of DROP notices.
func (s *Session) CheckClose(c control.Close) error {
	if e := s.Err(); e != nil {
		return e
	}
	switch {
	case c.Head != s.head:
		return s.fail(errf(control.CodeBadRecord, "close head %d, last published head %d", c.Head, s.head))
	case c.Seq != s.nextSeq-1:
		return s.fail(errf(control.CodeTornRecord, "close seq %d, last sequence number received %d", c.Seq, s.nextSeq-1))
	case c.Drops != s.dropsIn:
		return s.fail(errf(control.CodeBadRecord, "close drops %d, DROP notices received %d", c.Drops, s.dropsIn))
	}
	return nil
}

// free marks a span's ring bytes as no longer needed and advances the tail past every
// contiguous freed span.
func (s *Session) free(sp *span) {
	s.tmu.Lock()
	sp.freed = true
	old := s.tail
	i := 0
	for i < len(s.spans) && s.spans[i].freed {
		s.tail = s.spans[i].end
		i++
	}
	if i > 0 {
		clear(s.spans[:i])
		s.spans = s.spans[i:]
	}
	tail := s.tail
	s.tmu.Unlock()
	if tail != old {
		s.tailA.Store(tail)
		s.o.Release(tail)
	}
}

// writeLoop writes queued items in order. After a fatal error it keeps draining (waiting for
// jobs and returning buffers) without writing.
func (s *Session) writeLoop() {
	defer close(s.writerDone)
	// Items queued before a reader-side failure are good and still written; after a codec
	// or write failure nothing more is written (the stream would have a gap).
	stopped := false
	for it := range s.queue {
		<-it.done
		if !stopped {
			if err := it.getErr(); err != nil {
				stopped = true
				s.fail(&Error{Code: control.CodeCodec, Err: fmt.Errorf("compress seq %d (%s): %w", it.seq, it.rec.Name, err)})
			} else if it.kind == kindCheckpoint {
				if err := s.checkpoint(it.seq); err != nil {
					stopped = true
					s.fail(&Error{Code: control.CodeWrite, Err: fmt.Errorf("checkpoint seq %d: %w", it.seq, err)})
				} else if s.o.Observer != nil {
					s.o.Observer.ObserveCheckpoint(time.Since(it.at))
				}
			} else if err := s.write(it); err != nil {
				stopped = true
				s.fail(&Error{Code: control.CodeWrite, Err: fmt.Errorf("write seq %d: %w", it.seq, err)})
			}
		}
		for i, b := range it.blocks {
			if b.Data != nil {
				putBuf(b.Data)
			}
			if it.grants != nil && it.grants[i].n > 0 {
				s.o.Lease.release(it.grants[i])
			}
		}
		it.blocks = nil
		if s.codec == nil && it.span != nil {
			s.free(it.span)
		}
	}
}

// checkpoint makes everything written so far durable and reports it.
func (s *Session) checkpoint(seq uint64) error {
	if err := s.w.Sync(); err != nil {
		return err
	}
	lo, lc := s.w.LastPacket()
	s.checkpoints.Add(1)
	s.lastCkpt.Store(time.Now().UnixNano())
	s.o.OnCheckpoint(control.Checkpointed{Seq: seq, Offset: uint64(s.w.Offset()), Packets: s.w.Packets(),
		Drops: s.w.Drops(), Tokens: s.w.Tokens(), LastOffset: uint64(lo), LastCRC: lc})
	return nil
}

func (s *Session) write(it *item) error {
	var p writer.Packet
	switch it.kind {
	case kindTensor:
		r := &it.rec
		p = writer.Packet{Type: writer.TypeTensor, DType: r.DType, Shape: r.Shape, Name: r.Name, Meta: it.meta,
			Seq: r.Seq, Step: r.Step, Forward: r.Forward, RawLen: uint64(len(r.Payload)),
			PartOffset: r.PartOffset, TensorLen: r.TensorLen}
		if r.Flags&shm.FlagPart != 0 {
			p.Flags = writer.FlagPart
		}
		if it.stats != nil {
			meta, err := s.lossyMeta(it)
			if err != nil {
				return err
			}
			p.Meta = meta
		}
		if s.codec == nil {
			p.Codec = codec.None
			p.Blocks = []writer.Block{{Data: r.Payload}}
		} else {
			p.Codec = s.codec.ID()
			p.BlockSize = uint32(s.bs)
			p.Blocks = it.blocks
		}
	case kindDrop:
		d := it.drop
		reason := d.Reason
		if reason == "" {
			reason = "ring_full"
		}
		meta, _ := json.Marshal(map[string]string{"reason": reason})
		p = writer.Packet{Type: writer.TypeDrop, DType: dtype.Invalid, Name: d.Name, Meta: meta, Seq: d.Seq,
			Step: d.Step, Forward: d.Forward, RawLen: d.Bytes, TensorLen: d.Bytes}
	case kindToken:
		t := it.tok
		pos := int64(t.Index)
		if t.Position != nil {
			pos = *t.Position
		}
		meta, _ := json.Marshal(map[string]any{"token_id": t.TokenID, "text": t.Text, "position": pos})
		p = writer.Packet{Type: writer.TypeToken, Name: "token", Meta: meta, Seq: t.Seq, Step: t.Index}
	}
	before := s.w.Offset()
	start := time.Now()
	if err := s.w.WritePacket(&p); err != nil {
		return err
	}
	if s.o.Observer != nil {
		s.o.Observer.ObserveWrite(time.Since(start))
	}
	if s.o.WriteDelay > 0 {
		time.Sleep(s.o.WriteDelay)
	}
	switch it.kind {
	case kindTensor:
		s.packets.Add(1)
		s.bytesOut.Add(uint64(s.w.Offset() - before))
	case kindDrop:
		s.drops.Add(1)
		s.packets.Add(1)
	case kindToken:
		s.tokens.Add(1)
		s.packets.Add(1)
	}
	return nil
}

// errBoundExceeded: a lossy codec reported an error beyond its bound (a codec bug).
var errBoundExceeded = errors.New("lossy codec exceeded its error bound")

// lossyMeta folds a lossy packet's block stats into its meta under "lossy"
// (docs/COMPRESSION.md 6), refusing a packet whose error exceeds the bound.
func (s *Session) lossyMeta(it *item) ([]byte, error) {
	var b codec.LossyBound
	if lc, ok := s.codec.(codec.LossyCodec); ok {
		b = lc.Bound()
	}
	rep := codec.Report(b, it.stats)
	if rep.Exceeds() {
		return nil, fmt.Errorf("seq %d (%s): %w: %+v", it.seq, it.rec.Name, errBoundExceeded, rep)
	}
	obj := map[string]any{}
	if len(it.meta) > 0 {
		if err := json.Unmarshal(it.meta, &obj); err != nil {
			return nil, fmt.Errorf("seq %d meta: %w", it.seq, err)
		}
	}
	obj["lossy"] = rep
	return json.Marshal(obj)
}

// Finish ends the session: no more input is taken, everything queued is written, then the
// END packet (status complete or aborted as asked, error when the session failed), index
// and footer, and fdatasync. It unmaps the ring and returns the lease. Safe to call more
// than once; later calls return the first result.
func (s *Session) Finish(status string) (Result, error) {
	s.finishOnce.Do(func() { s.result, s.resultErr = s.finish(status) })
	return s.result, s.resultErr
}

func (s *Session) finish(status string) (Result, error) {
	close(s.queue)
	<-s.writerDone
	end := writer.EndInfo{Status: status, Packets: s.packets.Load(), Drops: s.drops.Load()}
	if e := s.Err(); e != nil {
		end.Status = StatusError
		end.Error = e.Error()
	}
	var errs []error
	if err := s.w.Close(end); err != nil {
		errs = append(errs, fmt.Errorf("close stream: %w", err))
		s.fail(&Error{Code: control.CodeWrite, Err: fmt.Errorf("close stream: %w", err)})
	}
	s.stop()
	if err := s.o.Ring.Close(); err != nil {
		errs = append(errs, err)
	}
	s.o.Lease.Close()
	st := s.Stats()
	res := Result{Stats: st, FileBytes: uint64(s.w.Offset()), Status: end.Status}
	err := errors.Join(errs...)
	if err == nil && end.Status == StatusError {
		err = s.Err()
	}
	s.o.Log.Info("session finished", zap.String("status", end.Status), zap.Uint64("packets", st.Packets),
		zap.Uint64("drops", st.Drops), zap.Uint64("bytes_in", st.BytesIn), zap.Uint64("bytes_out", st.BytesOut),
		zap.Uint64("file_bytes", res.FileBytes))
	return res, err
}

var bufPool sync.Pool

func getBuf(n int) []byte {
	if v, ok := bufPool.Get().(*[]byte); ok && cap(*v) >= n {
		return (*v)[:0]
	}
	return make([]byte, 0, n)
}

func putBuf(b []byte) {
	b = b[:0]
	bufPool.Put(&b)
}
