package pipeline

import (
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/strap-llm/strap/internal/stream"
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

// TestDirectStagingInBudget: a session writing a disk file with O_DIRECT holds its staging
// buffers in the memory budget; where the budget has no room for them it writes through the
// page cache instead, and either way finishing gives every byte back.
func TestDirectStagingInBudget(t *testing.T) {
	if err := probeDirect(t.TempDir()); err != nil {
		t.Skipf("the temp dir's file system takes no O_DIRECT here: %v", err)
	}
	open := func(limit int64) (h *harness, used int64, direct bool) {
		b := NewBudget(limit)
		h = newHarness(t, hopts{budget: b})
		direct, _ = h.s.w.Direct()
		return h, b.Used(), direct
	}
	roomy, withStaging, direct := open(1 << 30)
	if !direct {
		t.Fatal("with room in the budget the session does not write with O_DIRECT")
	}
	tight, without, directTight := open(withStaging - 1)
	if directTight {
		t.Fatalf("budget %d has no room for %d bytes of staging, yet the session writes with O_DIRECT",
			withStaging-1, stream.DirectStaging)
	}
	if withStaging-without != stream.DirectStaging {
		t.Fatalf("O_DIRECT session holds %d bytes, buffered one %d: difference %d, want the staging %d",
			withStaging, without, withStaging-without, stream.DirectStaging)
	}
	for _, h := range []*harness{roomy, tight} {
		if _, err := h.finish(StatusComplete); err != nil {
			t.Fatal(err)
		}
	}
}

// probeDirect reports whether files in dir can be opened with O_DIRECT.
func probeDirect(dir string) error {
	f, err := os.OpenFile(filepath.Join(dir, "probe"), os.O_CREATE|os.O_WRONLY|unix.O_DIRECT, 0o600)
	if err != nil {
		return err
	}
	return f.Close()
}

// TestDirectStagingKept: the staging buffers of an ended O_DIRECT stream stay mapped for
// the next stream, counted in the budget while idle and not twice once a stream takes
// them; the budget unmaps them when it needs their room, and after its keep time.
func TestDirectStagingKept(t *testing.T) {
	if err := probeDirect(t.TempDir()); err != nil {
		t.Skipf("the temp dir's file system takes no O_DIRECT here: %v", err)
	}
	b := NewBudget(1 << 30)
	run := func() (used int64) {
		h := newHarness(t, hopts{budget: b})
		if direct, why := h.s.w.Direct(); !direct {
			t.Fatalf("not O_DIRECT: %s", why)
		}
		used = b.Used()
		if _, err := h.finish(StatusComplete); err != nil {
			t.Fatal(err)
		}
		return used
	}
	first := run()
	idle := b.IdleStaging()
	if idle < 1 || b.Used() != int64(idle)*stream.StagingBufSize {
		t.Fatalf("after the first stream: %d idle buffers, %d bytes used; want >= 1 and exactly their size", idle, b.Used())
	}
	if second := run(); second != first {
		t.Fatalf("a stream on kept buffers holds %d bytes, a stream on fresh ones %d", second, first)
	}
	// A lease that needs their room gets it.
	if b.IdleStaging() == 0 {
		t.Fatal("the second stream's buffers were not kept")
	}
	l, err := b.Open(b.Limit(), 0)
	if err != nil {
		t.Fatalf("a lease of the whole budget beside idle staging buffers: %v", err)
	}
	if b.IdleStaging() != 0 {
		t.Fatalf("%d staging buffers still idle in a full budget", b.IdleStaging())
	}
	l.Close()
	// And after the keep time they go by themselves.
	b.mu.Lock()
	b.keep = 20 * time.Millisecond
	b.mu.Unlock()
	run()
	deadline := time.Now().Add(5 * time.Second)
	for b.IdleStaging() > 0 || b.Used() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d idle buffers, %d bytes used long after the keep time", b.IdleStaging(), b.Used())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestStagingFirstTakenFirstLent: a stream gets back first the staging buffer its
// predecessor took first (the one it filled), not the one it took last for the bytes it
// carried over at its end.
func TestStagingFirstTakenFirstLent(t *testing.T) {
	b := NewBudget(1 << 30)
	first, second := stream.NewStagingBuf(), stream.NewStagingBuf()
	if !first.Mapped() || !second.Mapped() {
		t.Skip("staging buffers are heap memory here: they are not kept")
	}
	b.Put(first) // a stream gives back its buffers in the order it took them
	b.Put(second)
	for i, want := range []stream.StagingBuf{first, second} {
		got := b.Get()
		if !sameBuf(got, want) {
			t.Fatalf("Get %d lent the buffer returned %s", i, map[bool]string{true: "first", false: "second"}[sameBuf(got, first)])
		}
		stream.FreeStagingBuf(got)
	}
	if b.Used() != 0 {
		t.Fatalf("%d bytes used with no buffer idle", b.Used())
	}
}

// sameBuf reports whether two staging buffers are one mapping: StagingBuf keeps its
// memory unexported, and its first word is that slice's data pointer.
func sameBuf(a, b stream.StagingBuf) bool {
	return *(*uintptr)(unsafe.Pointer(&a)) == *(*uintptr)(unsafe.Pointer(&b))
}
