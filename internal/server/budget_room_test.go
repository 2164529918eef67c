package server

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/strap-llm/strap/internal/control"
	"github.com/strap-llm/strap/internal/shm"
)

// TestMemoryBudgetRoomLeft: an OPEN refused for want of budget says in fits_ring_size the
// largest ring that fits what is left (for its codec and block size): an OPEN with that
// ring succeeds, one a page larger is refused; with
// no room at all it says 0. The message names --memory-limit.
func TestMemoryBudgetRoomLeft(t *testing.T) {
	sealed := func(t *testing.T, size uint64) *os.File {
		p, err := shm.NewProducer(size, shm.ProducerOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		return p.File()
	}
	refusal := func(t *testing.T, ts *testServer, ring uint64, codec string) (fits uint64) {
		t.Helper()
		_, err := ts.dial(t).Open(sealed(t, ring), outFile(t), control.Open{RingSize: ring, Codec: codec, Policy: "block"})
		var e *control.Error
		if !errors.As(err, &e) || e.Code != control.CodeMemoryBudget || !strings.Contains(e.Message, "(--memory-limit)") {
			t.Fatalf("OPEN of a %d-byte ring: err = %v, want memory_budget naming --memory-limit", ring, err)
		}
		if e.FitsRingSize == nil {
			t.Fatalf("memory_budget ERROR without fits_ring_size: %+v", e)
		}
		return *e.FitsRingSize
	}
	opens := func(t *testing.T, ts *testServer, ring uint64, codec string) {
		t.Helper()
		if _, err := ts.dial(t).Open(sealed(t, ring), outFile(t), control.Open{RingSize: ring, Codec: codec, Policy: "block"}); err != nil {
			t.Fatalf("OPEN of a %d-byte ring: %v", ring, err)
		}
	}
	for _, codec := range []string{"zstd", "none"} {
		t.Run(codec, func(t *testing.T) {
			ts := startServer(t, Config{MemoryLimit: 16 << 20, MaxRingSize: 64 << 20})
			opens(t, ts, shm.HeaderSize+3<<20, codec)
			fits := refusal(t, ts, shm.HeaderSize+16<<20, codec)
			if fits == 0 || fits%4096 != 0 {
				t.Fatalf("fits_ring_size %d, want a positive multiple of 4096", fits)
			}
			if got := refusal(t, ts, fits+4096, codec); got != fits {
				t.Fatalf("a ring one page over fits_ring_size: refused with fits_ring_size %d, want %d", got, fits)
			}
			opens(t, ts, fits, codec)
			if got := refusal(t, ts, shm.HeaderSize+4096, codec); got != 0 {
				t.Fatalf("with the budget spent: fits_ring_size %d, want 0", got)
			}
		})
	}
}

// TestDefaultMemoryLimit: the default budget is a quarter of MemTotal, or of the cgroup's
// memory.max when that is lower, rounded down to a MiB, never under
// MinDefaultMemoryLimit, and FallbackMemoryLimit when neither is known; the files are
// read as the kernel writes them.
func TestDefaultMemoryLimit(t *testing.T) {
	const gib = int64(1) << 30
	for _, tc := range []struct {
		name             string
		memTotal, cgroup int64
		want             int64
	}{
		{"24 GiB host", 24 * gib, 0, 6 * gib},
		{"2 TiB host", 2048 * gib, 0, 512 * gib},
		{"cgroup lower", 2048 * gib, 32 * gib, 8 * gib},
		{"cgroup higher", 16 * gib, 64 * gib, 4 * gib},
		{"rounded to MiB", 24*gib + 12345, 0, 6 * gib},
		{"tiny host", 128 << 20, 0, MinDefaultMemoryLimit},
		{"unknown", 0, 0, FallbackMemoryLimit},
		{"only cgroup", 0, 8 * gib, 2 * gib},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := memoryLimitFor(tc.memTotal, tc.cgroup); got != tc.want {
				t.Fatalf("memoryLimitFor(%d, %d) = %d, want %d", tc.memTotal, tc.cgroup, got, tc.want)
			}
		})
	}

	dir := t.TempDir()
	write := func(p, s string) string {
		p = filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	meminfo := write("meminfo", "MemTotal:       24683784 kB\nMemFree:         1000 kB\n")
	if got := readMemTotal(meminfo); got != 24683784<<10 {
		t.Fatalf("readMemTotal = %d", got)
	}
	if got := readMemTotal(write("bad", "MemTotal: lots\n")); got != 0 {
		t.Fatalf("readMemTotal of a malformed line = %d, want 0", got)
	}
	self := write("self-cgroup", "0::/system.slice/strapd.service\n")
	mount := filepath.Join(dir, "cg")
	write("cg/memory.max", "max\n")
	write("cg/system.slice/memory.max", "34359738368\n")
	write("cg/system.slice/strapd.service/memory.max", "max\n")
	if got := readCgroupMemoryMax(self, mount); got != 32*gib {
		t.Fatalf("readCgroupMemoryMax = %d, want the slice's 32 GiB", got)
	}
	if got := readCgroupMemoryMax(write("v1", "4:memory:/user.slice\n"), mount); got != 0 {
		t.Fatalf("readCgroupMemoryMax under cgroup v1 = %d, want 0", got)
	}
	if got := DefaultMemoryLimit(); got < MinDefaultMemoryLimit || got%(1<<20) != 0 {
		t.Fatalf("DefaultMemoryLimit() = %d on this host", got)
	}
}
