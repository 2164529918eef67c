package pipeline

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Pool is the worker pool shared by every session: a fixed number of goroutines running
// compression jobs.
//
// With IdleWorkers the workers' threads run under SCHED_IDLE: on a host whose cores the
// model's own threads use (torch's intra-op team, ggml's), compression then runs in the
// gaps the model leaves instead of preempting one of its threads, which stalls the whole
// operator (PERFORMANCE.md, "the daemon under SCHED_IDLE"). The ring is the buffer. So
// that a host saturated by other work cannot starve a capture, a monitor notices when the
// jobs queued a grace period ago have not all started, and then as many rescuers at normal
// priority as there are workers take jobs too, for RescueHold after the last time the
// monitor found the workers starved. The queue is longer then (a job only points into the ring), so that a
// forward pass's burst of records waits there rather than in the session's fan-out.
type Pool struct {
	jobs chan func()
	wg   sync.WaitGroup
	once sync.Once
	n    int
	busy atomic.Int32
	// busyNs is each worker's cumulative time in jobs (metrics: CPU per worker).
	busyNs []atomic.Int64

	idle    bool
	idleErr error         // why the workers could not go idle (they run at normal priority)
	started atomic.Uint64 // jobs begun, by workers and rescuers
	rescued atomic.Uint64 // jobs the rescuers ran
	kick    chan struct{} // a job was queued (to the monitor)
	rescue  chan struct{} // the workers are starved (one token per rescuer)
	stop    chan struct{}
	grace   time.Duration
	// procs narrows the runtime to one P while the pool is idle (PoolOptions.NarrowProcs).
	procs *procs
}

// PoolOptions configures NewPool.
type PoolOptions struct {
	// Workers is the number of worker goroutines (GOMAXPROCS when <= 0).
	Workers int
	// LockThreads keeps each worker on one OS thread for its life, so the thread CPU time a
	// job takes is its own: the CPU budget charges that (without a budget the runtime
	// schedules workers freely).
	LockThreads bool
	// IdleWorkers runs the workers' threads under SCHED_IDLE, with rescuers at normal
	// priority (Pool).
	IdleWorkers bool
	// RescueAfter is the monitor's grace period (DefaultRescueAfter when 0).
	RescueAfter time.Duration
	// NarrowProcs runs the Go runtime on one P (GOMAXPROCS 1) while at most one session
	// is open and the pool has had no job for a second, and on every P otherwise
	// (procs.go). Ignored with IdleWorkers: an idle worker's thread holding the only P
	// could stall the connections behind the model's threads.
	NarrowProcs bool
}

// DefaultRescueAfter is how long queued jobs may wait for idle workers before the
// rescuers run them: long enough to span a decode step of a small model (the gaps between
// steps are where idle workers run), short against a checkpoint's fdatasync.
const DefaultRescueAfter = 20 * time.Millisecond

// RescueHold is how long the rescuers stay on once woken (renewed while the workers are
// still starved).
const RescueHold = 500 * time.Millisecond

// NewPool starts workers goroutines (GOMAXPROCS when workers <= 0); see PoolOptions.
func NewPool(workers int, lockThreads bool) *Pool {
	return NewPoolWith(PoolOptions{Workers: workers, LockThreads: lockThreads})
}

// NewPoolWith starts a pool as o says.
func NewPoolWith(o PoolOptions) *Pool {
	workers := o.Workers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	depth := 4 * workers
	if o.IdleWorkers {
		depth = 64 * workers
	}
	p := &Pool{jobs: make(chan func(), depth), n: workers, busyNs: make([]atomic.Int64, workers),
		idle: o.IdleWorkers, kick: make(chan struct{}, 1), rescue: make(chan struct{}, workers),
		stop: make(chan struct{}), grace: o.RescueAfter}
	if p.grace <= 0 {
		p.grace = DefaultRescueAfter
	}
	var idleErr atomic.Pointer[error]
	var ready sync.WaitGroup
	ready.Add(workers)
	p.wg.Add(workers)
	for i := range workers {
		go func() {
			defer p.wg.Done()
			switch {
			case p.idle:
				// An idle worker's thread stays its own: the worker never unlocks it, so
				// the thread dies with the worker, and the runtime starts new threads
				// from a template thread, not from a locked one. SCHED_IDLE never
				// spreads to the daemon's other goroutines.
				runtime.LockOSThread()
				if err := setThreadIdle(); err != nil {
					idleErr.CompareAndSwap(nil, &err)
				}
			case o.LockThreads:
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
			}
			ready.Done()
			for job := range p.jobs {
				p.started.Add(1)
				p.busy.Add(1)
				start := time.Now()
				job()
				p.busyNs[i].Add(int64(time.Since(start)))
				p.busy.Add(-1)
			}
		}()
	}
	ready.Wait()
	if e := idleErr.Load(); e != nil {
		p.idleErr = *e
	}
	if o.NarrowProcs && !o.IdleWorkers {
		p.procs = newProcs(p)
	}
	if p.idle {
		p.wg.Add(1 + workers)
		go p.monitor()
		for range workers {
			go p.rescuer(o.LockThreads)
		}
	}
	return p
}

// setThreadIdle puts the calling thread under SCHED_IDLE (any user may lower its own
// priority; a seccomp filter or an old kernel may refuse).
func setThreadIdle() error {
	return unix.SchedSetAttr(0, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_IDLE}, 0)
}

// monitor wakes the rescuers when the idle workers are starved: the jobs queued a grace
// period ago have not all started.
func (p *Pool) monitor() {
	defer p.wg.Done()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-p.kick:
		}
		starved, stop := p.waitStarved(timer)
		if stop {
			return
		}
		if starved {
			for range p.n {
				select {
				case p.rescue <- struct{}{}:
				default: // as many tokens as rescuers are waiting already
				}
			}
		}
	}
}

// rescuer runs at normal priority: woken by the monitor, it takes jobs like a worker for
// RescueHold, a period renewed while the monitor still finds the workers starved. On a host
// other work keeps busy the rescuers so stay on, and the pool runs at the throughput of
// normal-priority workers, losing one grace period per hold, not one per burst of jobs.
func (p *Pool) rescuer(lockThread bool) {
	defer p.wg.Done()
	if lockThread {
		// The CPU budget measures a job by its thread's CPU time.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
	}
	hold := time.NewTimer(time.Hour)
	hold.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-p.rescue:
		}
		hold.Reset(RescueHold)
	active:
		for {
			select {
			case <-p.stop:
				hold.Stop()
				return
			case <-p.rescue: // still starved: stay on
				hold.Reset(RescueHold)
			case <-hold.C:
				break active
			case job, ok := <-p.jobs:
				if !ok {
					hold.Stop()
					return
				}
				p.started.Add(1)
				p.rescued.Add(1)
				job()
			}
		}
	}
}

// waitStarved waits grace periods while jobs are queued. It reports starved when the
// jobs queued at the start of a period have not all started by its end (the queue is
// FIFO); not starved once the queue is empty. A full queue blocks the fan-out in Submit,
// not the client: the ring holds what comes meanwhile.
func (p *Pool) waitStarved(timer *time.Timer) (starved, stop bool) {
	for {
		queued := uint64(len(p.jobs))
		if queued == 0 {
			return false, false
		}
		before := p.started.Load()
		timer.Reset(p.grace)
		select {
		case <-p.stop:
			timer.Stop()
			return false, true
		case <-timer.C:
		}
		if p.started.Load()-before < queued {
			return true, false
		}
	}
}

// Workers is the number of worker goroutines.
func (p *Pool) Workers() int { return p.n }

// Idle reports whether the workers run under SCHED_IDLE, and why not when that was asked
// for and refused.
func (p *Pool) Idle() (bool, error) { return p.idle && p.idleErr == nil, p.idleErr }

// Rescued counts the jobs the rescuers ran at normal priority because the idle workers
// were starved.
func (p *Pool) Rescued() uint64 { return p.rescued.Load() }

// Load reports the workers running a job, the jobs queued, and each worker's cumulative
// seconds in jobs.
func (p *Pool) Load() (busy, queued int, busySeconds []float64) {
	busySeconds = make([]float64, len(p.busyNs))
	for i := range p.busyNs {
		busySeconds[i] = time.Duration(p.busyNs[i].Load()).Seconds()
	}
	return int(p.busy.Load()), len(p.jobs), busySeconds
}

// Submit queues job, waiting for queue space until ctx is done.
func (p *Pool) Submit(ctx context.Context, job func()) error {
	p.procs.jobSubmitted() // every P before the job can wait for one
	select {
	case p.jobs <- job:
	case <-ctx.Done():
		return ctx.Err()
	}
	if p.idle {
		select {
		case p.kick <- struct{}{}:
		default:
		}
	}
	return nil
}

// Close stops the workers after the queued jobs ran. No Submit may follow.
func (p *Pool) Close() {
	p.once.Do(func() {
		p.procs.stop()
		close(p.jobs)
		close(p.stop)
		p.wg.Wait()
	})
}
