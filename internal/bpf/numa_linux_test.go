//go:build linux && amd64 && privileged

package bpf

import (
	"fmt"
	"runtime"
	"strconv"
	"testing"
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
