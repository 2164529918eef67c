package bpf

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/strap-llm/strap/internal/trace"
)

// readCPUNodes maps each CPU to its node from sysRoot/devices/system/node/node*/cpulist;
// empty when sysfs has no node directories (then no migration is cross-node).
func readCPUNodes(sysRoot string) map[int]int {
	out := map[int]int{}
	dirs, _ := filepath.Glob(filepath.Join(sysRoot, "devices/system/node/node[0-9]*"))
	for _, d := range dirs {
		node, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(d), "node"))
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(d, "cpulist"))
		if err != nil {
			continue
		}
		for _, cpu := range parseCPUList(strings.TrimSpace(string(b))) {
			out[cpu] = node
		}
	}
	return out
}

// parseCPUList expands a kernel cpulist ("0-3,8,10-11"); malformed parts are skipped.
func parseCPUList(s string) []int {
	var cpus []int
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			continue
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a || b-a > 1<<16 {
				continue
			}
		}
		for cpu := a; cpu <= b; cpu++ {
			cpus = append(cpus, cpu)
		}
	}
	return cpus
}

func countNodes(nodes map[int]int) int {
	seen := map[int]bool{}
	for _, n := range nodes {
		seen[n] = true
	}
	return len(seen)
}

// threadCPU fills s.ThreadCPU[key] from /proc/<pid>/task/*/{comm,schedstat}. A process's
// first reading is only the baseline; a thread created since the previous snapshot counts
// from its start; a thread that exited during the interval loses its last partial interval.
func (c *Collector) threadCPU(s *trace.Snapshot, pid int, key string) {
	threads, err := c.procFS.AllThreads(pid)
	if err != nil {
		return
	}
	prev, seen := c.prevThreadCPU[pid]
	cur := make(map[int]uint64, len(threads))
	byName := map[string]trace.ThreadCPU{}
	for _, t := range threads {
		st, err := t.Schedstat()
		if err != nil {
			continue
		}
		name, err := t.Comm()
		if err != nil {
			continue
		}
		cur[t.PID] = st.RunningNanoseconds
		e := byName[name]
		e.Threads++
		if seen {
			e.CPUNs += dropSub(st.RunningNanoseconds, prev[t.PID])
		}
		byName[name] = e
	}
	c.prevThreadCPU[pid] = cur
	if !seen || len(byName) == 0 {
		return
	}
	if s.ThreadCPU == nil {
		s.ThreadCPU = map[string]map[string]trace.ThreadCPU{}
	}
	s.ThreadCPU[key] = byName
}

// forgetThreadCPU drops the baselines of processes no longer reported.
func (c *Collector) forgetThreadCPU(reported map[int]bool) {
	for pid := range c.prevThreadCPU {
		if !reported[pid] {
			delete(c.prevThreadCPU, pid)
		}
	}
}
