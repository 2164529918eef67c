package pipeline

import (
	"context"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func threadPolicy(t *testing.T) uint32 {
	a, err := unix.SchedGetAttr(0, 0)
	if err != nil {
		t.Errorf("sched_getattr: %v", err)
		return 0
	}
	return a.Policy
}

// Idle workers run their jobs under SCHED_IDLE; the daemon's other goroutines do not.
func TestPoolIdleWorkersRunUnderSchedIdle(t *testing.T) {
	p := NewPoolWith(PoolOptions{Workers: 2, IdleWorkers: true, RescueAfter: time.Minute})
	defer p.Close()
	if idle, err := p.Idle(); !idle {
		t.Skipf("SCHED_IDLE refused here: %v", err)
	}
	got := make(chan uint32, 8)
	for range 8 {
		if err := p.Submit(context.Background(), func() { got <- threadPolicy(t) }); err != nil {
			t.Fatal(err)
		}
	}
	for range 8 {
		if pol := <-got; pol != unix.SCHED_IDLE {
			t.Fatalf("a worker ran a job under policy %d, want SCHED_IDLE (%d)", pol, unix.SCHED_IDLE)
		}
	}
	// Threads the runtime starts later are not cloned from an idle worker's.
	var wg sync.WaitGroup
	pols := make(chan uint32, 64)
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Millisecond) // park, so goroutines spread over threads
			pols <- threadPolicy(t)
		}()
	}
	wg.Wait()
	close(pols)
	for pol := range pols {
		if pol == unix.SCHED_IDLE {
			t.Fatal("a goroutine outside the pool ran on a SCHED_IDLE thread")
		}
	}
	if r := p.Rescued(); r != 0 {
		t.Fatalf("rescued %d jobs from workers that kept up", r)
	}
}

// Jobs the workers cannot start within the grace period (here: every worker is held by a
// job that waits) are run by the rescuer, at normal priority; once the workers are free
// again, nothing more is rescued.
func TestPoolRescuesStarvedJobs(t *testing.T) {
	p := NewPoolWith(PoolOptions{Workers: 2, IdleWorkers: true, RescueAfter: 20 * time.Millisecond})
	defer p.Close()
	hold := make(chan struct{})
	defer close(hold) // before Close: the workers wait on it
	var started sync.WaitGroup
	started.Add(2)
	for range 2 {
		if err := p.Submit(context.Background(), func() { started.Done(); <-hold }); err != nil {
			t.Fatal(err)
		}
	}
	started.Wait()
	done := make(chan uint32, 5)
	t0 := time.Now()
	for range 5 {
		if err := p.Submit(context.Background(), func() { done <- threadPolicy(t) }); err != nil {
			t.Fatal(err)
		}
	}
	for range 5 {
		select {
		case pol := <-done:
			if pol == unix.SCHED_IDLE {
				t.Fatal("a rescued job ran under SCHED_IDLE")
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("starved jobs not rescued after 10s (rescued %d)", p.Rescued())
		}
	}
	if waited := time.Since(t0); waited < 20*time.Millisecond {
		t.Fatalf("rescued after %v, before the grace period", waited)
	}
	if r := p.Rescued(); r != 5 {
		t.Fatalf("rescued %d jobs, want 5", r)
	}
}

// With normal-priority workers that keep up, the rescuer never takes a job (its check is
// about jobs not starting, not about the queue holding some).
func TestPoolRescuerLeavesWorkingWorkersAlone(t *testing.T) {
	p := NewPoolWith(PoolOptions{Workers: 2, IdleWorkers: true, RescueAfter: 2 * time.Second})
	defer p.Close()
	var wg sync.WaitGroup
	for i := range 2000 {
		wg.Add(1)
		if err := p.Submit(context.Background(), func() { wg.Done() }); err != nil {
			t.Fatal(err)
		}
		if i%100 == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	wg.Wait()
	if r := p.Rescued(); r != 0 {
		t.Logf("rescued %d of 2000 jobs: the idle workers were starved for 2s on this machine", r)
	}
}

// Close runs every queued job, idle workers or not.
func TestPoolCloseRunsQueuedJobs(t *testing.T) {
	for _, idle := range []bool{false, true} {
		p := NewPoolWith(PoolOptions{Workers: 2, IdleWorkers: idle})
		var mu sync.Mutex
		n := 0
		for range 100 {
			if err := p.Submit(context.Background(), func() { mu.Lock(); n++; mu.Unlock() }); err != nil {
				t.Fatal(err)
			}
		}
		p.Close()
		if n != 100 {
			t.Fatalf("idle=%v: %d of 100 jobs ran", idle, n)
		}
	}
}
