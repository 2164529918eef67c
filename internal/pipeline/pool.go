package pipeline

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Pool is the worker pool shared by every session: a fixed number of goroutines running
// compression jobs.
type Pool struct {
	jobs chan func()
	wg   sync.WaitGroup
	once sync.Once
	n    int
	busy atomic.Int32
	// busyNs is each worker's cumulative time in jobs (metrics: CPU per worker).
	busyNs []atomic.Int64
}

// NewPool starts workers goroutines (GOMAXPROCS when workers <= 0). With lockThreads each
// keeps one OS thread for its life, so the thread CPU time a job takes is its own: the CPU
// budget charges that (without a budget the runtime schedules workers freely).
func NewPool(workers int, lockThreads bool) *Pool {
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	p := &Pool{jobs: make(chan func(), 4*workers), n: workers, busyNs: make([]atomic.Int64, workers)}
	p.wg.Add(workers)
	for i := range workers {
		go func() {
			defer p.wg.Done()
			if lockThreads {
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
			}
			for job := range p.jobs {
				p.busy.Add(1)
				start := time.Now()
				job()
				p.busyNs[i].Add(int64(time.Since(start)))
				p.busy.Add(-1)
			}
		}()
	}
	return p
}

// Workers is the number of worker goroutines.
func (p *Pool) Workers() int { return p.n }

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
	select {
	case p.jobs <- job:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close stops the workers after the queued jobs ran. No Submit may follow.
func (p *Pool) Close() {
	p.once.Do(func() {
		close(p.jobs)
		p.wg.Wait()
	})
}
