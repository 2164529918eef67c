package pipeline

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// The Go runtime's processors (Ps) follow the work. While one session decodes, all of the
// daemon's work per message runs on the connection's goroutine (the batch is compressed and
// written there, the RELEASE sent there): a second P only costs wake-ups. With two Ps, each
// message that readies the connection's goroutine makes the runtime wake a second thread to
// look for more work (wakep from a spinning M), which finds none and parks again, and the
// runtime's monitor thread (sysmon) naps every 20 µs while any P is busy. On one P the
// goroutine that is woken runs on the thread that woke it. Measured on a 2-core AMD EPYC
// (PERFORMANCE.md, "One P while one session decodes"): strapd's context switches per decode
// token about halved and its CPU per record fell by a fifth to two fifths.
//
// Prefill-size records are cut into blocks that the pool compresses on every core, and
// several sessions compress their batches on their own goroutines: for those the runtime
// gets its Ps back (widen, before the job is queued), and keeps them until the pool has
// had no job for narrowAfter while at most one session is open.

// narrowAfter is how long the pool must have had no job (and at most one session be open)
// before the runtime goes back to one P: longer than the pauses within a prefill (a forward
// pass's records come in bursts), short against a decode.
const narrowAfter = time.Second

// procs narrows and widens the runtime's GOMAXPROCS for one pool (nil: never touched).
type procs struct {
	mu       sync.Mutex
	wide     int  // GOMAXPROCS when wide: the runtime's when the pool started
	narrow   bool // GOMAXPROCS is 1
	sessions int  // sessions open on the pool
	armed    bool // the narrowing check is scheduled
	stopped  bool // the pool closed: wide for good
	timer    *time.Timer
	pool     *Pool
	after    time.Duration // narrowAfter (shorter in tests)
	// last is when a job was last submitted (UnixNano); read by the narrowing check.
	last atomic.Int64
	// wideA mirrors !narrow for Submit's fast path.
	wideA atomic.Bool
	// changes counts GOMAXPROCS changes (tests, logs).
	changes atomic.Uint64
}

// newProcs returns the governor of p, starting narrow when the runtime has more than one P
// (no session is open yet); nil when it has one P already.
func newProcs(p *Pool) *procs {
	wide := runtime.GOMAXPROCS(0)
	if wide <= 1 {
		return nil
	}
	g := &procs{wide: wide, pool: p, after: narrowAfter}
	g.timer = time.AfterFunc(time.Hour, g.check)
	g.timer.Stop()
	g.mu.Lock()
	g.setNarrow(true)
	g.mu.Unlock()
	return g
}

// setNarrow moves GOMAXPROCS to 1 or back to wide; g.mu is held.
func (g *procs) setNarrow(n bool) {
	if g.narrow == n {
		return
	}
	g.narrow = n
	g.wideA.Store(!n)
	g.changes.Add(1)
	if n {
		runtime.GOMAXPROCS(1)
	} else {
		runtime.GOMAXPROCS(g.wide)
	}
}

// jobSubmitted widens before a pool job is queued; when wide already it only notes the time.
func (g *procs) jobSubmitted() {
	if g == nil {
		return
	}
	g.last.Store(time.Now().UnixNano())
	if g.wideA.Load() {
		return
	}
	g.mu.Lock()
	g.setNarrow(false)
	g.armLocked(g.after)
	g.mu.Unlock()
}

// sessionOpened counts a session; from the second one on the runtime is wide (each session
// compresses its batches on its own goroutine).
func (g *procs) sessionOpened() {
	if g == nil {
		return
	}
	g.mu.Lock()
	g.sessions++
	if g.sessions > 1 {
		g.setNarrow(false)
	}
	g.mu.Unlock()
}

// sessionClosed uncounts a session and, when wide, schedules the narrowing check.
func (g *procs) sessionClosed() {
	if g == nil {
		return
	}
	g.mu.Lock()
	g.sessions--
	if !g.narrow {
		g.armLocked(g.after)
	}
	g.mu.Unlock()
}

// armLocked schedules check after d unless it is scheduled already; g.mu is held.
func (g *procs) armLocked(d time.Duration) {
	if g.armed {
		return
	}
	g.armed = true
	g.timer.Reset(d)
}

// check narrows once the pool has had no job for narrowAfter, no job is queued or running
// and at most one session is open; otherwise it looks again when that period could end.
func (g *procs) check() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.armed = false
	if g.narrow || g.sessions > 1 || g.stopped {
		return // a session's end arms it again
	}
	idle := time.Duration(time.Now().UnixNano() - g.last.Load())
	if idle < g.after || g.pool.busy.Load() != 0 || len(g.pool.jobs) != 0 {
		g.armLocked(max(g.after-idle, g.after/10))
		return
	}
	g.setNarrow(true)
}

// stop leaves the runtime wide (the pool is closing).
func (g *procs) stop() {
	if g == nil {
		return
	}
	g.mu.Lock()
	g.stopped = true
	g.timer.Stop()
	g.setNarrow(false)
	g.mu.Unlock()
}
