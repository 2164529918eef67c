package pipeline

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/strap-llm/strap/internal/stream"
)

// ErrBudget: a session's ring (plus its guaranteed buffer) does not fit in the memory limit.
var ErrBudget = errors.New("memory budget exceeded")

// Budget is the daemon's one memory limit. It counts every ring mapping for the life of its
// session and every compression buffer while it is in flight. Each session also reserves,
// at open, enough for the buffers of its largest possible record (a packet is written only
// once all its blocks are compressed, because its header carries the stored length and
// CRC): so a session can always make progress even when other sessions hold the rest of
// the budget, and in-flight buffers wait for budget instead of exceeding it.
type Budget struct {
	mu    sync.Mutex
	cond  *sync.Cond
	limit int64
	used  int64
	// rings is the bytes of open sessions' ring mappings; goSlack > 0 keeps the Go
	// runtime's memory limit at limit - rings + goSlack (LimitGoHeap).
	rings, goSlack int64
	// idle holds the O_DIRECT staging buffers of ended streams for the next stream (Get,
	// Put): counted in used while idle, unmapped when the budget needs their room or
	// StagingKeep after the last one came back.
	idle      []stream.StagingBuf
	idleTimer *time.Timer
	keep      time.Duration
}

// StagingKeep is how long the staging buffers of an ended O_DIRECT stream are kept for
// the next one. A fresh buffer costs the kernel zeroing each of its pages on first
// touch, a third of the daemon's CPU on a 48 MiB capture; a client capturing again
// within this time (its own ring is kept as long) pays that once.
const StagingKeep = 30 * time.Second

// maxIdleStaging is how many staging buffers are kept idle at most: one stream's.
const maxIdleStaging = int(stream.DirectStaging / stream.StagingBufSize)

// LimitGoHeap keeps the Go runtime's soft memory limit (debug.SetMemoryLimit) at the budget
// less the open rings, plus slack, from now on. The Go heap holds the compression buffers
// the budget admits (the rings are shared mappings, outside it); without a limit the
// collector lets garbage grow as large as the live heap (GOGC=100) before it runs, so a
// backlog of buffers could take twice their size. slack covers what the budget does not
// count: codec state, stacks, the runtime's own. No-op for an unlimited budget.
func (b *Budget) LimitGoHeap(slack int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.limit <= 0 || slack <= 0 {
		return
	}
	b.goSlack = slack
	b.setGoLimit()
}

// setGoLimit applies the Go memory limit for the rings open now; b.mu is held.
func (b *Budget) setGoLimit() {
	if b.goSlack > 0 {
		debug.SetMemoryLimit(b.limit - b.rings + b.goSlack)
	}
}

// NewBudget creates a budget of limit bytes (limit <= 0: unlimited).
func NewBudget(limit int64) *Budget {
	b := &Budget{limit: limit, keep: StagingKeep}
	b.cond = sync.NewCond(&b.mu)
	return b
}

// Limit is the configured limit in bytes (<= 0: unlimited).
func (b *Budget) Limit() int64 { return b.limit }

// Used is the bytes counted now (idle staging buffers included).
func (b *Budget) Used() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// fits reports whether n more bytes fit, unmapping the idle staging buffers first when
// only their room is missing; b.mu is held.
func (b *Budget) fits(n int64) bool {
	if b.limit <= 0 || b.used+n <= b.limit {
		return true
	}
	if len(b.idle) > 0 {
		b.dropIdle()
		return b.used+n <= b.limit
	}
	return false
}

// Get lends an O_DIRECT stream a staging buffer: an idle one (whose bytes its stream's
// lease already holds, so they leave the idle count) or a new one.
//
// Idle buffers go out in the order they came back, which is the order the ended stream
// took them: the next stream stages into the one its predecessor filled first, whose
// pages the kernel has already zeroed. A decode capture fills most of its first buffer
// and takes a second only at its end, for the few bytes carried over when the last full
// blocks are written; handed out last-in first, that barely touched buffer became the
// next capture's main one, and the kernel zeroed ≈ 7 MiB of huge pages inside that
// capture's writes (≈ 10 ms of strapd's CPU, issue 38).
func (b *Budget) Get() stream.StagingBuf {
	b.mu.Lock()
	if len(b.idle) > 0 {
		buf := b.idle[0]
		b.idle = append(b.idle[:0], b.idle[1:]...)
		b.used -= stream.StagingBufSize
		b.mu.Unlock()
		return buf
	}
	b.mu.Unlock()
	return stream.NewStagingBuf()
}

// Put takes back a staging buffer of an ending stream: kept idle when it is a mapping,
// fewer than maxIdleStaging are, and it fits in the budget beside the lease that still
// holds it (counted twice until that lease closes); unmapped otherwise.
func (b *Budget) Put(buf stream.StagingBuf) {
	b.mu.Lock()
	if !buf.Mapped() || len(b.idle) >= maxIdleStaging ||
		(b.limit > 0 && b.used+stream.StagingBufSize > b.limit) {
		b.mu.Unlock()
		stream.FreeStagingBuf(buf)
		return
	}
	b.idle = append(b.idle, buf)
	b.used += stream.StagingBufSize
	if b.idleTimer == nil {
		b.idleTimer = time.AfterFunc(b.keep, b.expireIdle)
	} else {
		b.idleTimer.Reset(b.keep)
	}
	b.mu.Unlock()
}

// IdleStaging is the number of idle staging buffers kept now.
func (b *Budget) IdleStaging() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.idle)
}

// expireIdle unmaps the idle staging buffers after StagingKeep without a stream.
func (b *Budget) expireIdle() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.idle) > 0 {
		b.dropIdle()
		b.cond.Broadcast()
	}
}

// dropIdle unmaps every idle staging buffer; b.mu is held.
func (b *Budget) dropIdle() {
	for _, buf := range b.idle {
		stream.FreeStagingBuf(buf)
	}
	b.used -= int64(len(b.idle)) * stream.StagingBufSize
	clear(b.idle)
	b.idle = b.idle[:0]
}

// Lease is one session's share of the budget: its ring, its private reserve, and the
// buffers it has in flight.
type Lease struct {
	b           *Budget
	fixed       int64 // ring + reserve, held for the session's life
	ring        int64
	reserve     int64
	reserveUsed int64
	closed      bool
	// inFlightCap, when > 0, caps the bytes of this session's buffers in flight (shared
	// and reserve grants together): the client's memory hint, clamped. inFlight counts
	// them and peak is the most seen (tests check the cap holds).
	inFlightCap    int64
	inFlight, peak int64
}

// BudgetError is a refused Open: what the session needed and what was free at that
// moment, so the caller can say which smaller ring would have fitted. It matches ErrBudget
// under errors.Is.
type BudgetError struct {
	// Ring and Reserve are the bytes the session asked for: its ring and its compression
	// reserve.
	Ring, Reserve int64
	// Used and Limit are the budget's bytes in use (idle staging buffers already given
	// back) and its limit.
	Used, Limit int64
}

// Free is the bytes that were left in the budget when the session was refused.
func (e *BudgetError) Free() int64 { return max(0, e.Limit-e.Used) }

func (e *BudgetError) Error() string {
	return fmt.Sprintf("%v: session needs %d bytes (ring %d + compression buffers %d), %d of %d in use",
		ErrBudget, e.Ring+e.Reserve, e.Ring, e.Reserve, e.Used, e.Limit)
}

// Unwrap makes errors.Is(err, ErrBudget) hold.
func (e *BudgetError) Unwrap() error { return ErrBudget }

// Open reserves ringSize + reserve bytes for a new session, or fails with a *BudgetError
// (errors.Is ErrBudget).
func (b *Budget) Open(ringSize, reserve int64) (*Lease, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := ringSize + reserve
	if !b.fits(n) {
		return nil, &BudgetError{Ring: ringSize, Reserve: reserve, Used: b.used, Limit: b.limit}
	}
	b.used += n
	b.rings += ringSize
	b.setGoLimit()
	return &Lease{b: b, fixed: n, ring: ringSize, reserve: reserve}, nil
}

// TryHold adds n bytes to the lease's share for the rest of the session when they fit in
// the budget now, and reports whether they did; Release gives them back early.
func (l *Lease) TryHold(n int64) bool {
	b := l.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if l.closed || !b.fits(n) {
		return false
	}
	b.used += n
	l.fixed += n
	b.setGoLimit()
	return true
}

// Unhold gives back n bytes taken by TryHold before the session ends.
func (l *Lease) Unhold(n int64) {
	b := l.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if l.closed {
		return
	}
	b.used -= n
	l.fixed -= n
	b.setGoLimit()
	b.cond.Broadcast()
}

// limitInFlight caps the session's in-flight buffers at hint bytes (hint <= 0: no cap).
// The cap is raised to the lease's reserve, which holds the buffers of the largest record,
// because a lower one could never compress that record; and lowered to the daemon's limit,
// which a session cannot exceed anyway.
func (l *Lease) limitInFlight(hint int64) {
	if hint <= 0 {
		return
	}
	c := max(hint, l.reserve)
	if lim := l.b.limit; lim > 0 {
		c = min(c, max(lim, l.reserve))
	}
	l.inFlightCap = c
}

// grant is one buffer's charge: from the shared budget, or the lease's own reserve.
type grant struct {
	n    int64
	slot bool
}

// acquire waits until n bytes are free in the shared budget or in the lease's reserve,
// whichever comes first, or ctx is done.
func (l *Lease) acquire(ctx context.Context, n int64) (grant, error) {
	b := l.b
	if n > l.reserve {
		return grant{}, fmt.Errorf("buffer of %d bytes exceeds the session's reserve of %d", n, l.reserve)
	}
	// Most grants need no wait (a decoding step's small records: one per record): only a
	// wait registers with ctx, which costs two allocations.
	b.mu.Lock()
	if g, ok := l.grantNow(n); ok {
		b.mu.Unlock()
		return g, nil
	}
	b.mu.Unlock()
	stop := context.AfterFunc(ctx, func() {
		b.mu.Lock()
		b.cond.Broadcast()
		b.mu.Unlock()
	})
	defer stop()
	b.mu.Lock()
	defer b.mu.Unlock()
	for {
		if g, ok := l.grantNow(n); ok {
			return g, nil
		}
		if err := ctx.Err(); err != nil {
			return grant{}, err
		}
		b.cond.Wait()
	}
}

// grantNow takes n bytes when they may be taken now; b.mu is held.
func (l *Lease) grantNow(n int64) (grant, bool) {
	b := l.b
	// Over the client's hint, wait for this session's own buffers to be written.
	underHint := l.inFlightCap <= 0 || l.inFlight+n <= l.inFlightCap
	switch {
	case underHint && b.fits(n):
		b.used += n
		l.took(n)
		return grant{n: n}, true
	case underHint && l.reserveUsed+n <= l.reserve:
		l.reserveUsed += n
		l.took(n)
		return grant{n: n, slot: true}, true
	}
	return grant{}, false
}

// took counts a new grant of n bytes; b.mu is held.
func (l *Lease) took(n int64) {
	l.inFlight += n
	l.peak = max(l.peak, l.inFlight)
}

// release returns a grant.
func (l *Lease) release(g grant) {
	b := l.b
	b.mu.Lock()
	l.inFlight -= g.n
	if g.slot {
		l.reserveUsed -= g.n
	} else {
		b.used -= g.n
	}
	b.cond.Broadcast()
	b.mu.Unlock()
}

// Close returns the lease's fixed reservation. Every grant must have been released.
func (l *Lease) Close() {
	b := l.b
	b.mu.Lock()
	if !l.closed {
		l.closed = true
		b.used -= l.fixed
		b.rings -= l.ring
		b.setGoLimit()
		b.cond.Broadcast()
	}
	b.mu.Unlock()
}
