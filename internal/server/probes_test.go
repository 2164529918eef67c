package server

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/strap-llm/strap/internal/control"
	"github.com/strap-llm/strap/internal/trace"
)

// probeConfig runs the real collector: kernel probes as root, the /proc fallbacks
// otherwise (the session wiring under test is the same).
func probeConfig(interval time.Duration) Config {
	return Config{Probes: Probes{Enabled: true, Interval: interval, NoBPF: os.Geteuid() != 0}}
}

func traceFile(t *testing.T) *os.File {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(t.TempDir(), "out.trace.jsonl"), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func TestSessionTrace(t *testing.T) {
	ts := startServer(t, probeConfig(150*time.Millisecond))
	c := ts.dial(t)
	out, tf := outFile(t), traceFile(t)
	st, o, err := openWith(t, c, control.Open{Metadata: map[string]any{"output_path": "/x/run.strap"}}, out, tf)
	if err != nil {
		t.Fatal(err)
	}
	tf.Close() // the daemon holds its own copy, as a real client does
	sc := ts.dial(t)
	waitFor(t, func() bool {
		rep, err := sc.Status()
		return err == nil && rep.Daemon.Probes != nil && rep.Daemon.Probes.TraceSessions == 1 &&
			rep.Daemon.Probes.Snapshots >= 2
	})
	a := tensor("a", 1, 100)
	if err := st.Put(&a); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Finish(); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(tf.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	snaps, err := trace.ReadSnapshots(f)
	if err != nil {
		t.Fatalf("trace: %v", err)
	}
	if len(snaps) < 2 {
		t.Fatalf("%d snapshots, want >= 2 (interval ticks plus the final one)", len(snaps))
	}
	id := strconv.FormatUint(o.Session, 10)
	for i, s := range snaps {
		if !slices.ContainsFunc(s.Sessions, func(x trace.Session) bool {
			return x.ID == id && x.PID == os.Getpid() && x.Output == "/x/run.strap"
		}) {
			t.Errorf("snapshot %d names sessions %+v, want id %s", i, s.Sessions, id)
		}
		if !slices.Contains(s.Watched, os.Getpid()) {
			t.Errorf("snapshot %d watches %v, want %d", i, s.Watched, os.Getpid())
		}
	}
	rep, err := sc.Status()
	if err != nil {
		t.Fatal(err)
	}
	p := rep.Daemon.Probes
	if p == nil || !p.Enabled || p.TraceSessions != 0 || len(p.Collectors) != 12 || p.IntervalS != 0.15 {
		t.Fatalf("probes status %+v", p)
	}
	if os.Geteuid() == 0 && p.Collectors[0].Source == trace.SourceBPF && len(p.BPFStats) == 0 {
		t.Errorf("block_io on bpf but no run statistics: %+v", p)
	}
}

// TestSessionTraceRefusals: a trace descriptor that is not a writable regular file, or one
// sent to a daemon without probes, is refused with bad_output.
func TestSessionTraceRefusals(t *testing.T) {
	readOnly := func(t *testing.T) *os.File {
		f, err := os.Open(traceFile(t).Name())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	pipe := func(t *testing.T) *os.File {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close(); w.Close() })
		return w
	}
	tests := []struct {
		name   string
		cfg    Config
		trace  func(t *testing.T) *os.File
		substr string
	}{
		{"read-only", probeConfig(time.Second), readOnly, "not open for writing"},
		{"pipe", probeConfig(time.Second), pipe, "expected a regular file"},
		{"no probes", Config{}, traceFile, "without probes"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ts := startServer(t, tc.cfg)
			_, _, err := openWith(t, ts.dial(t), control.Open{}, outFile(t), tc.trace(t))
			var e *control.Error
			if !errors.As(err, &e) || e.Code != control.CodeBadOutput || !strings.Contains(e.Message, tc.substr) {
				t.Fatalf("got %v, want bad_output mentioning %q", err, tc.substr)
			}
		})
	}
}

// TestIdleSnapshots: with no traced session and no metrics observer the ticker takes a
// snapshot only every idleSnapshotEvery intervals; a traced session brings back one per
// interval (issue 38: the thrown-away snapshots were a tenth or more of strapd's CPU).
func TestIdleSnapshots(t *testing.T) {
	const interval = 10 * time.Millisecond
	ts := startServer(t, probeConfig(interval))
	sc := ts.dial(t)
	snapshots := func() uint64 {
		t.Helper()
		rep, err := sc.Status()
		if err != nil || rep.Daemon.Probes == nil {
			t.Fatalf("status: %v, probes %+v", err, rep.Daemon.Probes)
		}
		return rep.Daemon.Probes.Snapshots
	}
	c := ts.dial(t)
	st, _, err := openWith(t, c, control.Open{}, outFile(t)) // untraced
	if err != nil {
		t.Fatal(err)
	}
	n0 := snapshots()
	time.Sleep(idleSnapshotEvery * interval * 2)
	// At most two idle snapshots fit (and one more from a tick already past its check).
	if d := snapshots() - n0; d > 3 {
		t.Fatalf("%d snapshots in %d intervals with no reader, want at most 3", d, idleSnapshotEvery*2)
	}
	if _, err := st.Finish(); err != nil {
		t.Fatal(err)
	}
	tc := ts.dial(t)
	tst, _, err := openWith(t, tc, control.Open{}, outFile(t), traceFile(t))
	if err != nil {
		t.Fatal(err)
	}
	n1 := snapshots()
	waitFor(t, func() bool { return snapshots()-n1 >= idleSnapshotEvery })
	if _, err := tst.Finish(); err != nil {
		t.Fatal(err)
	}
}
