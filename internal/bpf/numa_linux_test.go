//go:build linux && amd64 && privileged

package bpf

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// hopCPUs moves the process between CPU 0 and CPU 1 n times by changing its affinity; each
// change migrates it.
const hopCPUs = `import os, sys
for i in range(int(sys.argv[1])):
    os.sched_setaffinity(0, {i % 2})
    x = sum(range(2000))
`

func TestCrossNodeMigrations(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Skip("skipping: needs two CPUs")
	}
	py := python(t)
	const hops = 40
	for _, tc := range []struct {
		name  string
		nodes map[int]int
		cross bool
	}{
		// A fake two-node topology: CPU 0 on node 0, CPU 1 on node 1.
		{"two nodes", map[int]int{0: 0, 1: 1}, true},
		// Both CPUs on one node: migrations, none of them cross-node, no numa field.
		{"one node", map[int]int{0: 0, 1: 0}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := startAttached(t, Options{CPUNodes: tc.nodes})
			g := startGated(t, fmt.Sprintf("%s -c '%s' %d", py, hopCPUs, hops))
			s := measure(t, c, g)
			key := strconv.Itoa(g.pid)
			t.Logf("sched %+v numa %+v", s.Sched[key], s.NUMA)
			if s.Sched[key].Migrations < hops-2 {
				t.Fatalf("migrations %d, want about %d", s.Sched[key].Migrations, hops)
			}
			n, ok := s.NUMA[key]
			if !tc.cross {
				if ok {
					t.Fatalf("numa %+v on a one-node topology", n)
				}
				return
			}
			// Each affinity change crosses; other migrations (wakeup balancing between the
			// two CPUs) cross too, so the count is at least the hops, at most the migrations.
			if n.CrossNodeMigrations < hops-2 || n.CrossNodeMigrations > s.Sched[key].Migrations {
				t.Fatalf("cross-node %d of %d migrations, want at least %d", n.CrossNodeMigrations, s.Sched[key].Migrations, hops-2)
			}
		})
	}
}

// TestNUMAMapsNotReadAfterUnwatch: a client whose session ended still appears in the next
// snapshot with its counts, but its numa_maps (tens of ms of page-table walk for a torch
// process) is not read for it before the interval since its Watch is over.
func TestNUMAMapsNotReadAfterUnwatch(t *testing.T) {
	if _, err := os.Stat("/proc/self/numa_maps"); err != nil {
		t.Skipf("skipping: kernel without numa_maps: %v", err)
	}
	py := python(t)
	const mib = 16
	c := startAttached(t, Options{NUMAMapsInterval: time.Hour})
	g := startGated(t, fmt.Sprintf("%s -c '%s' %d", py, holdPages, mib<<8))
	if err := c.Watch(g.pid); err != nil {
		t.Fatal(err)
	}
	c.Snapshot()
	if _, err := io.WriteString(g.stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for rssKiB(t, g.pid) < mib<<10 {
		if time.Now().After(deadline) {
			t.Fatalf("the child never held %d MiB", mib)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := c.Unwatch(g.pid); err != nil {
		t.Fatal(err)
	}
	s := c.Snapshot()
	key := strconv.Itoa(g.pid)
	if _, ok := s.PageFaults[key]; !ok {
		t.Fatalf("the unwatched child is not in the snapshot after its faults (page faults %v)", s.PageFaults)
	}
	if n, ok := s.NUMAPages[key]; ok {
		t.Fatalf("numa_maps read for an unwatched process within the interval: %+v", n)
	}
	g.stdin.Close()
}

// rssKiB is pid's VmRSS in KiB (0 when /proc has none).
func rssKiB(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return n
		}
	}
	return 0
}
