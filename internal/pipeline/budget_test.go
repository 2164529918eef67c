package pipeline

import (
	"math"
	"runtime/debug"
	"testing"
)

// TestBudgetGoLimit: with LimitGoHeap the Go memory limit follows the budget less the open
// rings, and an unlimited budget leaves it alone.
func TestBudgetGoLimit(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	debug.SetMemoryLimit(math.MaxInt64)

	NewBudget(0).LimitGoHeap(1 << 20)
	if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
		t.Fatalf("unlimited budget set the Go limit to %d", got)
	}

	b := NewBudget(100 << 20)
	b.LimitGoHeap(8 << 20)
	want := func(v int64) {
		t.Helper()
		if got := debug.SetMemoryLimit(-1); got != v {
			t.Fatalf("Go memory limit %d MiB, want %d MiB", got>>20, v>>20)
		}
	}
	want(108 << 20)
	l1, err := b.Open(30<<20, 10<<20)
	if err != nil {
		t.Fatal(err)
	}
	want(78 << 20)
	l2, err := b.Open(20<<20, 0)
	if err != nil {
		t.Fatal(err)
	}
	want(58 << 20)
	l1.Close()
	l1.Close() // a second close changes nothing
	want(88 << 20)
	l2.Close()
	want(108 << 20)
}
