package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/strap-llm/strap/internal/bpf"
	"github.com/strap-llm/strap/internal/trace"
)

// traceConfig is everything `strapd trace` is told on its command line.
type traceConfig struct {
	// IntervalS is the snapshot interval in seconds.
	IntervalS float64
	// Output is the JSONL file snapshots are appended to ("-" for stdout).
	Output string
	// NoOutput prints readable snapshots to the terminal instead of writing JSONL.
	NoOutput bool
	// FlushEvery buffers this many snapshots before one write(2).
	FlushEvery int
	// Fsync fsyncs the output after every flush.
	Fsync bool
	// PIDs and Cgroups are watched by the per-process collectors, besides strapd itself.
	PIDs    []int
	Cgroups []string
	// PerThread adds the per-thread breakdown.
	PerThread bool
	// Count stops after this many snapshots; 0 runs until SIGINT/SIGTERM.
	Count int
	// NoBPF uses only the /proc fallbacks.
	NoBPF bool
	// SampleReadWrite times one read/write syscall in N in the syscall latency
	// histograms (1: every one).
	SampleReadWrite int
	// NUMAMapsS is how often each watched process's resident pages per NUMA node are read
	// from /proc/<pid>/numa_maps, in seconds; 0 never.
	NUMAMapsS float64
	// Spans is a correlation spans file applications append to (llm_instrumentation.correlate);
	// the spans overlapping each snapshot are attached to it. "" for none.
	Spans string
}

func (c *traceConfig) validate() error {
	if !(c.IntervalS >= 0.05) || math.IsInf(c.IntervalS, 0) {
		return fmt.Errorf("--interval %v: must be at least 0.05 seconds", c.IntervalS)
	}
	if c.FlushEvery < 1 {
		return fmt.Errorf("--flush-every %d: must be at least 1", c.FlushEvery)
	}
	if c.Count < 0 {
		return fmt.Errorf("--count %d: must not be negative", c.Count)
	}
	if !c.NoOutput && c.Output == "" {
		return errors.New("--output is empty: give a file, '-' for stdout, or --no-output")
	}
	for _, p := range c.PIDs {
		if p <= 0 {
			return fmt.Errorf("--pid %d: must be positive", p)
		}
	}
	if c.SampleReadWrite < 0 {
		return fmt.Errorf("--sample-read-write %d: must not be negative (0 and 1 time every call)", c.SampleReadWrite)
	}
	if !(c.NUMAMapsS >= 0) || math.IsInf(c.NUMAMapsS, 0) {
		return fmt.Errorf("--numa-maps-interval %v: must be 0 (never) or a positive number of seconds", c.NUMAMapsS)
	}
	return nil
}

func newTraceCmd(logger func() *zap.Logger) *cobra.Command {
	cfg := traceConfig{}
	cmd := &cobra.Command{
		Use:   "trace",
		Short: "Record block I/O, off-CPU time, page faults, syscalls, waits, run-queue latency, TCP, RSS and PSI as JSONL snapshots",
		Long: `trace attaches strapd's eBPF probes and writes one JSON line per interval
(docs/TRACE_FORMAT.md). Block I/O is system-wide; the per-process collectors count strapd
itself and every --pid / --cgroup. Collectors that cannot attach (no CAP_BPF/CAP_PERFMON, no
BTF) are reported once and replaced by /proc fallbacks where those exist.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cfg.validate(); err != nil {
				return err
			}
			return runTrace(cmd.Context(), cfg, logger().With(zap.String("component", "trace")))
		},
	}
	f := cmd.Flags()
	f.Float64Var(&cfg.IntervalS, "interval", 5, "seconds per snapshot")
	f.StringVar(&cfg.Output, "output", "tracepoints.jsonl", "JSONL file to append snapshots to ('-' for stdout)")
	f.BoolVar(&cfg.NoOutput, "no-output", false, "print readable snapshots to the terminal instead of writing JSONL")
	f.IntVar(&cfg.FlushEvery, "flush-every", 1, "snapshots buffered per write(2)")
	f.BoolVar(&cfg.Fsync, "fsync", false, "fsync the output after every flush")
	f.IntSliceVar(&cfg.PIDs, "pid", nil, "process (tgid) to watch; repeatable")
	f.StringSliceVar(&cfg.Cgroups, "cgroup", nil, "cgroup v2 directory whose tasks are watched; repeatable")
	f.BoolVar(&cfg.PerThread, "per-thread", false, "add the per-thread off-CPU / scheduler breakdown")
	f.IntVar(&cfg.Count, "count", 0, "stop after this many snapshots (0: until interrupted)")
	f.BoolVar(&cfg.NoBPF, "no-bpf", false, "do not load eBPF probes; /proc fallbacks only")
	f.StringVar(&cfg.Spans, "spans", "", "correlation spans file (JSONL, appended by llm_instrumentation.correlate) whose spans are attached to the snapshots they overlap")
	f.IntVar(&cfg.SampleReadWrite, "sample-read-write", 1, "time one read/write syscall in N for the latency histograms (counts stay exact)")
	f.Float64Var(&cfg.NUMAMapsS, "numa-maps-interval", bpf.DefaultNUMAMapsInterval.Seconds(),
		"seconds between readings of each watched process's resident pages per NUMA node (/proc/PID/numa_maps; 0: never)")
	return cmd
}

func runTrace(parent context.Context, cfg traceConfig, log *zap.Logger) error {
	if parent == nil {
		parent = context.Background()
	}
	ctx, stop := signal.NotifyContext(parent, os.Interrupt, syscall.SIGTERM)
	defer stop()

	col, err := bpf.Start(bpf.Options{
		PIDs: cfg.PIDs, Cgroups: cfg.Cgroups, WatchSelf: true, PerThread: cfg.PerThread,
		NoBPF: cfg.NoBPF, SampleReadWrite: cfg.SampleReadWrite, Logger: log,
		NUMAMapsInterval: numaMapsInterval(cfg.NUMAMapsS),
	})
	if err != nil {
		return fmt.Errorf("trace: %w", err)
	}
	defer col.Close()

	var w *trace.Writer
	if !cfg.NoOutput {
		wopts := trace.WriterOptions{FlushEvery: cfg.FlushEvery, Fsync: cfg.Fsync}
		if cfg.Output == "-" {
			w = trace.NewWriter(os.Stdout, wopts)
		} else {
			var cut int64
			w, cut, err = trace.OpenFile(cfg.Output, wopts)
			if err != nil {
				return fmt.Errorf("trace: %w", err)
			}
			if cut > 0 {
				log.Warn("cut a torn last line left by a crash", zap.String("output", cfg.Output), zap.Int64("bytes", cut))
			}
		}
	}
	log.Info("tracing", zap.Float64("interval_s", cfg.IntervalS), zap.String("output", cfg.Output),
		zap.Bool("no_output", cfg.NoOutput), zap.Ints("watched", col.Status().Watched))

	var spans *trace.SpanTail
	if cfg.Spans != "" {
		if spans, err = trace.NewSpanTail(cfg.Spans, true); err != nil {
			return fmt.Errorf("trace: %w", err)
		}
	}
	var badSpans uint64
	emit := func() error {
		s := col.Snapshot()
		if spans != nil {
			if err := spans.Poll(); err != nil {
				log.Warn("spans file not read", zap.Error(err))
			}
			s.Spans = spans.Overlapping(s.Timestamp-s.IntervalS, s.Timestamp)
			if n := spans.Bad - badSpans; n > 0 {
				s.Drops["spans_malformed"] = n
				log.Warn("malformed lines in the spans file skipped", zap.Uint64("lines", n), zap.Error(spans.LastErr))
				badSpans = spans.Bad
			}
		}
		if w == nil {
			return trace.FormatText(os.Stdout, s)
		}
		return w.Write(s)
	}
	tick := time.NewTicker(time.Duration(cfg.IntervalS * float64(time.Second)))
	defer tick.Stop()
	var runErr error
	for n := 0; cfg.Count == 0 || n < cfg.Count; n++ {
		select {
		case <-ctx.Done():
			// The partial interval up to the signal is still a snapshot.
			runErr = emit()
			n = -1
		case <-tick.C:
			runErr = emit()
		}
		if runErr != nil || n < 0 {
			break
		}
	}
	if w != nil {
		runErr = errors.Join(runErr, w.Close())
	}
	if runErr != nil {
		return fmt.Errorf("trace: %w", runErr)
	}
	return nil
}

// numaMapsInterval turns --numa-maps-interval's seconds into bpf.Options' interval, where
// a negative value means never.
func numaMapsInterval(s float64) time.Duration {
	if s == 0 {
		return -1
	}
	return max(time.Duration(s*float64(time.Second)), time.Nanosecond)
}
