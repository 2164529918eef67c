package pipeline

import (
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// CPUBudget bounds the time the worker pool spends compressing, shared by every session:
// a token bucket filled at Cores seconds per second. A block may be compressed only while
// the bucket holds time; otherwise it is stored raw (lossless, and a copy costs a small
// fraction of compressing it), so compression never takes more than the budget plus one
// burst, however fast clients publish. Each compression is charged the CPU time of its
// worker's thread (with a budget, NewPool locks each worker to one thread; a batch of small
// records compressed on a session's reader goroutine locks it meanwhile, batch.go), so the
// bound is on CPU, not on the wall time a loaded machine stretches a compression to.
type CPUBudget struct {
	cores float64

	mu     sync.Mutex
	tokens float64 // nanoseconds of compression that may start now (may go negative)
	burst  float64 // most the bucket holds
	last   time.Time
	now    func() time.Time

	raw atomic.Uint64 // blocks stored raw because the bucket was empty
}

// cpuBurst is how much unused budget the bucket keeps: enough for a few blocks at full
// speed, short enough that an idle spell does not let a later burst exceed the budget for
// long.
const cpuBurst = 100 * time.Millisecond

// NewCPUBudget returns a budget of cores CPUs (0: nothing is compressed).
func NewCPUBudget(cores float64) *CPUBudget {
	b := &CPUBudget{cores: max(cores, 0), now: time.Now}
	b.burst = b.cores * float64(cpuBurst)
	b.tokens = b.burst
	b.last = b.now()
	return b
}

// Cores is the budget in CPUs.
func (b *CPUBudget) Cores() float64 { return b.cores }

// RawBlocks counts the blocks stored raw, over all sessions, because the budget was spent
// (0 for a nil, unlimited, budget).
func (b *CPUBudget) RawBlocks() uint64 {
	if b == nil {
		return 0
	}
	return b.raw.Load()
}

// take reports whether a block may be compressed now. A nil budget is unlimited.
func (b *CPUBudget) take() bool {
	if b == nil {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	b.tokens = min(b.burst, b.tokens+b.cores*float64(now.Sub(b.last)))
	b.last = now
	if b.cores > 0 && b.tokens > 0 {
		return true
	}
	b.raw.Add(1)
	return false
}

// threadCPU is the CPU time of the calling thread; ok false where the clock is missing.
func threadCPU() (time.Duration, bool) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0, false
	}
	return time.Duration(ts.Nano()), true
}

// meter measures one compression for charge: thread CPU time where the clock works, else
// wall time (an upper bound on it).
type meter struct {
	wall     time.Time
	cpu      time.Duration
	cpuClock bool
}

func startMeter() meter {
	c, ok := threadCPU()
	return meter{wall: time.Now(), cpu: c, cpuClock: ok}
}

func (m meter) elapsed() time.Duration {
	if m.cpuClock {
		if c, ok := threadCPU(); ok && c >= m.cpu {
			return c - m.cpu
		}
	}
	return time.Since(m.wall)
}

// charge takes the time one compression took out of the bucket.
func (b *CPUBudget) charge(d time.Duration) {
	if b == nil {
		return
	}
	b.mu.Lock()
	b.tokens -= float64(d)
	b.mu.Unlock()
}
