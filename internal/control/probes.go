package control

import "github.com/strap-llm/strap/internal/bpf"

// ProbesStatus is STATUS_REPLY's daemon.probes (PROTOCOL.md 4): the one eBPF collector
// that runs beside the captures (docs/TRACE_FORMAT.md). The embedded bpf.Status gives each
// collector's source (bpf, proc fallback or off) with the reason, the watched pids and
// the probes' cumulative run statistics (events, ns per event) per program.
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
	bpf.Status
}
