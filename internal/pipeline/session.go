package pipeline

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/strap-llm/strap/internal/codec"
	"github.com/strap-llm/strap/internal/shm"
	"github.com/strap-llm/strap/internal/stream"
)

// End statuses written into the END packet.
const (
	StatusComplete = "complete"
	StatusAborted  = "aborted"
	StatusError    = "error"
)

// options are a session's resources once Plan.Open has acquired them. The ring and lease
// are owned by the session from start on (start closes them on failure too); the output
// stays the caller's.
type options struct {
	Env
	Ring      *shm.Ring
	Output    *os.File
	Codec     codec.Codec
	BlockSize int
	Metadata  any
	Lease     *Lease
	// Resume, when set, continues the stream already in Output instead of starting one;
	// sequence numbers go on after its LastSeq.
	Resume *stream.ResumeExpect
}

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
	// CPURawBlocks counts blocks stored raw because the CPU budget was spent.
	CPURawBlocks uint64
	RingUsed     uint64
	Head         uint64
	Tail         uint64
}

// Result is how a session ended.
type Result struct {
	Stats
	FileBytes uint64
	Status    string
}

// Session is one capture: it parses what the client publishes (input.go), fans blocks out
// to the shared pool (fanout.go), frees ring space in order (tail.go), and writes packets
// in sequence order (writeloop.go, assemble.go).
type Session struct {
	o     options
	w     *stream.Writer
	codec codec.Codec // nil for codec none: payloads go straight from the ring
	bs    int
	ctx   context.Context
	stop  context.CancelFunc

	in input
	// inline: batches of small records are compressed on the connection's goroutine
	// (batch.go); false under IdleWorkers, where the pool's idle workers do it.
	inline     bool
	queue      chan *item
	writerDone chan struct{}
	// queued counts items sent to the writer and not yet written (writeNow).
	queued atomic.Int64
	// stopped: a codec or write failure stopped the writing. Held by whoever writes:
	// the writer, or the connection's goroutine while the writer is idle (writeNow).
	stopped bool
	tail    tailTracker

	failOnce sync.Once
	failed   chan struct{}
	ferr     atomic.Pointer[error]

	packets, drops, bytesIn, bytesOut, headA atomic.Uint64
	tokens, checkpoints, cpuRaw              atomic.Uint64
	lastCkpt                                 atomic.Int64 // unix nanoseconds
	// durableAt is the stream size last reported to OnDurable (the writer goroutine's).
	durableAt uint64
	// indexed is how many index entries OnCheckpoint has handed out (IndexAtCheckpoint;
	// the writer goroutine's).
	indexed    int
	finishOnce sync.Once
	result     Result
	resultErr  error
}

// start writes the stream header (or resumes the prefix) and starts the writer.
func start(o options) (*Session, error) {
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
		o.OnError = func(error) {}
	}
	if o.OnCheckpoint == nil {
		o.OnCheckpoint = func(Durable) {}
	}
	if o.OnDurable == nil {
		o.OnDurable = func(uint64) {}
	}
	var (
		w   *stream.Writer
		err error
	)
	nextSeq := uint64(1)
	// O_DIRECT where the file system takes it: the page-cache copy of buffered writes
	// was most of the daemon's CPU on codec none (docs/STREAM_FORMAT.md 6). Its staging
	// buffers count in the memory budget; without room for them the stream is buffered.
	staged := o.Lease.TryHold(stream.DirectStaging)
	wo := stream.WriterOptions{Direct: staged, Staging: o.Lease.b, CRCGrain: o.CRCGrain}
	if o.Resume != nil {
		w, err = stream.ResumeWith(o.Output, *o.Resume, wo)
		nextSeq = o.Resume.LastSeq + 1
	} else {
		w, err = stream.NewWith(o.Output, o.Metadata, wo)
	}
	if err == nil {
		if on, why := w.Direct(); on {
			o.Log.Info("stream output", zap.Bool("direct_io", true))
		} else {
			if staged {
				o.Lease.Unhold(stream.DirectStaging) // buffered after all: no staging held
			} else {
				why = fmt.Sprintf("no room in --memory-limit for the %d bytes of O_DIRECT staging buffers", stream.DirectStaging)
			}
			o.Log.Info("stream output", zap.Bool("direct_io", false), zap.String("buffered_because", why))
		}
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
		return nil, &Error{Kind: KindBadOutput, Err: fmt.Errorf("%s: %w", what, err)}
	}
	c := o.Codec
	if c != nil && c.ID() == codec.None {
		c = nil
	}
	ctx, stop := context.WithCancel(context.Background())
	idleWorkers, _ := o.Pool.Idle()
	s := &Session{
		o: o, w: w, codec: c, bs: o.BlockSize, ctx: ctx, stop: stop, inline: !idleWorkers,
		in:         input{rd: shm.NewReader(o.Ring.Data(), 0, o.Limits), nextSeq: nextSeq},
		queue:      make(chan *item, 1024),
		writerDone: make(chan struct{}),
		tail:       tailTracker{release: o.Release},
		failed:     make(chan struct{}),
	}
	// The index entries a resume took from the journal are in it already: the first
	// checkpoint hands out only those after them.
	s.indexed = w.JournaledEntries()
	s.packets.Store(w.Packets())
	s.drops.Store(w.Drops())
	s.tokens.Store(w.Tokens())
	go s.writeLoop()
	return s, nil
}

// Failed is closed when the session hit a fatal error.
func (s *Session) Failed() <-chan struct{} { return s.failed }

// RangeCRCs is the writer's record of the stream file's CRC32C at multiples of
// Env.CRCGrain (nil without one, and for a resumed stream).
func (s *Session) RangeCRCs() *stream.RangeCRCs { return s.w.RangeCRCs() }

// Err is the session's fatal error, or nil.
func (s *Session) Err() error {
	if p := s.ferr.Load(); p != nil {
		return *p
	}
	return nil
}

// fail records the first fatal error, logs it and reports it through OnError. It returns
// the first fatal error, which may be an earlier one.
func (s *Session) fail(err error) error {
	s.failOnce.Do(func() {
		s.ferr.Store(&err)
		s.o.Log.Error("session failed", zap.Stringer("kind", KindOf(err)), zap.Error(err))
		close(s.failed)
		s.o.OnError(err)
	})
	return s.Err()
}

// Fail ends the session with a fatal error found outside the pipeline (a malformed
// message on its connection); err keeps whatever coding the caller gave it. It returns
// the session's first fatal error.
func (s *Session) Fail(err error) error { return s.fail(err) }

// Stats returns the counters now.
func (s *Session) Stats() Stats {
	h, t := s.headA.Load(), s.tail.pos.Load()
	st := Stats{Packets: s.packets.Load(), Drops: s.drops.Load(), Tokens: s.tokens.Load(), BytesIn: s.bytesIn.Load(),
		BytesOut: s.bytesOut.Load(), Head: h, Tail: t, RingUsed: h - min(t, h), Checkpoints: s.checkpoints.Load(),
		CPURawBlocks: s.cpuRaw.Load()}
	if ns := s.lastCkpt.Load(); ns != 0 {
		st.LastCheckpoint = time.Unix(0, ns)
	}
	return st
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
	end := stream.EndInfo{Status: status, Packets: s.packets.Load(), Drops: s.drops.Load()}
	if e := s.Err(); e != nil {
		end.Status = StatusError
		end.Error = e.Error()
	}
	var errs []error
	if err := s.w.Close(end); err != nil {
		errs = append(errs, fmt.Errorf("close stream: %w", err))
		s.fail(&Error{Kind: KindWrite, Err: fmt.Errorf("close stream: %w", err)})
	}
	s.stop()
	if err := s.o.Ring.Close(); err != nil {
		errs = append(errs, err)
	}
	s.o.Lease.Close()
	s.o.Pool.procs.sessionClosed()
	st := s.Stats()
	res := Result{Stats: st, FileBytes: uint64(s.w.Offset()), Status: end.Status}
	err := errors.Join(errs...)
	if err == nil && end.Status == StatusError {
		err = s.Err()
	}
	direct, _ := s.w.Direct()
	s.w.Release()
	s.o.Log.Info("session finished", zap.String("status", end.Status), zap.Bool("direct_io", direct), zap.Uint64("packets", st.Packets),
		zap.Uint64("drops", st.Drops), zap.Uint64("bytes_in", st.BytesIn), zap.Uint64("bytes_out", st.BytesOut),
		zap.Uint64("file_bytes", res.FileBytes))
	return res, err
}
