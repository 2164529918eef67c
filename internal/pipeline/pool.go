package pipeline

import (
	"context"
	"runtime"
	"sync"
)

// Pool is the worker pool shared by every session: a fixed number of goroutines running
// compression jobs.
type Pool struct {
	jobs chan func()
	wg   sync.WaitGroup
	once sync.Once
	n    int
}

// NewPool starts workers goroutines (GOMAXPROCS when workers <= 0).
func NewPool(workers int) *Pool {
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	p := &Pool{jobs: make(chan func(), 4*workers), n: workers}
	p.wg.Add(workers)
	for range workers {
		go func() {
			defer p.wg.Done()
			// One thread per worker for its life, so a job's thread CPU time is its own
			// (threadCPU, which the CPU budget charges).
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			for job := range p.jobs {
				job()
			}
		}()
	}
	return p
}

// Workers is the number of worker goroutines.
func (p *Pool) Workers() int { return p.n }

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
