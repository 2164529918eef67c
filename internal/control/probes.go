package control

// ProbesStatus is STATUS_REPLY's daemon.probes (PROTOCOL.md 4): the one eBPF collector
// that runs beside the captures (docs/TRACE_FORMAT.md): each collector's source (bpf, proc
// fallback or off) with the reason, the watched pids and the probes' cumulative run
// statistics per program. The fields are copied from the collector by the server so that
// this package, which every client links, carries no eBPF code.
type ProbesStatus struct {
	// Enabled is false when the collector failed to start (Error says why).
	Enabled bool `json:"enabled"`
	// Error is why the collector did not start.
	Error string `json:"error,omitempty"`
	// IntervalS is the time between snapshots, in seconds.
	IntervalS float64 `json:"interval_s"`
	// Snapshots counts the snapshots taken since start.
	Snapshots uint64 `json:"snapshots"`
	// TraceSessions counts the live sessions writing a trace.
	TraceSessions int `json:"trace_sessions"`
	// Collectors are in the collector's fixed order (block_io, off_cpu, sched,
	// page_faults, syscalls, pressure).
	Collectors []ProbeCollector `json:"collectors"`
	// Watched are the watched tgids, sorted; Cgroups the watched cgroup directories.
	Watched []int    `json:"watched"`
	Cgroups []string `json:"cgroups,omitempty"`
	// BPFStats are cumulative since load.
	BPFStats []ProbeProgStats `json:"bpf_stats"`
	// StatsError says why run statistics are unavailable, if they are.
	StatsError string `json:"stats_error,omitempty"`
	// Drops are cumulative events lost by the probes, by reason.
	Drops map[string]uint64 `json:"drops"`
}

// Probe sources as ProbeCollector.Source reports them.
const (
	// ProbeSourceBPF: counted by the kernel probes.
	ProbeSourceBPF = "bpf"
	// ProbeSourceProc: read from /proc (the fallback, or PSI).
	ProbeSourceProc = "proc"
	// ProbeSourceOff: not collected; ProbeCollector.Error says why.
	ProbeSourceOff = "off"
)

// ProbeCollector is how one collector runs.
type ProbeCollector struct {
	// Name is the collector (block_io, off_cpu, ...).
	Name string `json:"name"`
	// Source is ProbeSourceBPF, ProbeSourceProc or ProbeSourceOff.
	Source string `json:"source"`
	// Programs are the BPF programs the collector uses.
	Programs []string `json:"programs,omitempty"`
	// Error says why the BPF probes are not used (empty when Source is bpf).
	Error string `json:"error,omitempty"`
}

// ProbeProgStats are one BPF program's run statistics: the probes' measured overhead.
type ProbeProgStats struct {
	// Program is the BPF program name.
	Program string `json:"program"`
	// Events is the number of runs in the last interval; RunTimeNs their total time.
	Events    uint64 `json:"events"`
	RunTimeNs uint64 `json:"run_time_ns"`
	// NsPerEvent is RunTimeNs/Events (0 with no events).
	NsPerEvent float64 `json:"ns_per_event"`
	// TotalEvents and TotalRunTimeNs are cumulative since the program was loaded.
	TotalEvents    uint64 `json:"total_events"`
	TotalRunTimeNs uint64 `json:"total_run_time_ns"`
	// RecursionMisses counts runs skipped because another program ran on the CPU.
	RecursionMisses uint64 `json:"recursion_misses"`
}
