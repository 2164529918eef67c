package pipeline

import (
	"context"
	"runtime"
	"testing"
	"time"
)

// waitProcs waits up to 2 s for GOMAXPROCS to be want.
func waitProcs(t *testing.T, want int, what string) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if runtime.GOMAXPROCS(0) == want {
			return
		}
	}
	t.Fatalf("%s: GOMAXPROCS %d, want %d", what, runtime.GOMAXPROCS(0), want)
}

func TestNarrowProcs(t *testing.T) {
	old := runtime.GOMAXPROCS(2)
	defer runtime.GOMAXPROCS(old)

	p := NewPoolWith(PoolOptions{Workers: 2, NarrowProcs: true})
	p.procs.after = 50 * time.Millisecond
	if got := runtime.GOMAXPROCS(0); got != 1 {
		t.Fatalf("idle pool, no session: GOMAXPROCS %d, want 1", got)
	}

	t.Run("a job widens until the pool has been idle", func(t *testing.T) {
		release, ran := make(chan struct{}), make(chan struct{})
		if err := p.Submit(context.Background(), func() { close(ran); <-release }); err != nil {
			t.Fatal(err)
		}
		if got := runtime.GOMAXPROCS(0); got != 2 {
			t.Fatalf("after Submit: GOMAXPROCS %d, want 2 (widened before the job is queued)", got)
		}
		<-ran
		time.Sleep(3 * p.procs.after)
		if got := runtime.GOMAXPROCS(0); got != 2 {
			t.Fatalf("job still running: GOMAXPROCS %d, want 2", got)
		}
		close(release)
		waitProcs(t, 1, "pool idle again")
	})

	t.Run("two sessions keep every P", func(t *testing.T) {
		p.procs.sessionOpened()
		if got := runtime.GOMAXPROCS(0); got != 1 {
			t.Fatalf("one session: GOMAXPROCS %d, want 1", got)
		}
		p.procs.sessionOpened()
		if got := runtime.GOMAXPROCS(0); got != 2 {
			t.Fatalf("two sessions: GOMAXPROCS %d, want 2", got)
		}
		time.Sleep(3 * p.procs.after)
		if got := runtime.GOMAXPROCS(0); got != 2 {
			t.Fatalf("two sessions, idle pool: GOMAXPROCS %d, want 2", got)
		}
		p.procs.sessionClosed()
		waitProcs(t, 1, "back to one session")
		p.procs.sessionClosed()
	})

	t.Run("sessions count through Open and Finish", func(t *testing.T) {
		a := newHarness(t, hopts{pool: p, codec: "zstd"})
		if got := runtime.GOMAXPROCS(0); got != 1 {
			t.Fatalf("one open session: GOMAXPROCS %d, want 1", got)
		}
		b := newHarness(t, hopts{pool: p, codec: "zstd"})
		if got := runtime.GOMAXPROCS(0); got != 2 {
			t.Fatalf("two open sessions: GOMAXPROCS %d, want 2", got)
		}
		if _, err := b.finish(StatusComplete); err != nil {
			t.Fatal(err)
		}
		waitProcs(t, 1, "one session left")
		// A prefill-size record goes to the pool: every P before its blocks are queued.
		big := f32Tensor("big", 1, 1, 128, 1024)
		if err := a.put(&big); err != nil {
			t.Fatal(err)
		}
		if got := runtime.GOMAXPROCS(0); got != 2 {
			t.Fatalf("after a pool job: GOMAXPROCS %d, want 2", got)
		}
		res, err := a.finish(StatusComplete)
		if err != nil || res.BytesIn != 128*1024*4 {
			t.Fatalf("finish: %+v, %v; want the record's 512 KiB in", res, err)
		}
		waitProcs(t, 1, "sessions finished, pool idle")
	})

	p.Close()
	if got := runtime.GOMAXPROCS(0); got != 2 {
		t.Fatalf("closed pool: GOMAXPROCS %d, want the runtime's 2 back", got)
	}

	idle := NewPoolWith(PoolOptions{Workers: 1, NarrowProcs: true, IdleWorkers: true})
	defer idle.Close()
	if idle.procs != nil || runtime.GOMAXPROCS(0) != 2 {
		t.Fatalf("idle workers: narrowed (GOMAXPROCS %d); an idle worker holding the only P could stall the connections", runtime.GOMAXPROCS(0))
	}
}
