package bpf

// ThreadCPU is the CPU time of one process's threads that share a name (torch's
// intra-op pool, a tokenizer worker, the main thread) over the interval.
type ThreadCPU struct {
	// Threads is how many threads had the name at the snapshot.
	Threads int `json:"threads"`
	// CPUNs is their on-CPU time in the interval (schedstat run time deltas).
	CPUNs uint64 `json:"cpu_ns"`
}

// threadCPU fills s.ThreadCPU[key] from /proc/<pid>/task/*/{comm,schedstat}. A process's
// first reading is only the baseline; a thread created since the previous snapshot counts
// from its start; a thread that exited during the interval loses its last partial interval.
func (c *Collector) threadCPU(s *Snapshot, pid int, key string) {
	threads, err := c.procFS.AllThreads(pid)
	if err != nil {
		return
	}
	prev, seen := c.prevThreadCPU[pid]
	cur := make(map[int]uint64, len(threads))
	byName := map[string]ThreadCPU{}
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
		s.ThreadCPU = map[string]map[string]ThreadCPU{}
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
