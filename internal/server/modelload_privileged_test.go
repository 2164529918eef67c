//go:build linux && amd64 && privileged

package server

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/strap-llm/strap/internal/control"
	"github.com/strap-llm/strap/internal/trace"
)

// TestModelLoadPhase: a process opens x.safetensors, "loads" for 300 ms, then opens a
// traced capture session and publishes its first forward pass. The session's trace holds
// one model_load from that open to that PUBLISH: at least the 300 ms slept, at most the
// time measured around the open and the PUBLISH. A second PUBLISH ends nothing.
func TestModelLoadPhase(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipping: the weight-open probe needs root (CAP_BPF+CAP_PERFMON)")
	}
	ts := startServer(t, probeConfig(time.Hour)) // only the session's final line
	c := ts.dial(t)
	sc := ts.dial(t)
	rep, err := sc.Status()
	if err != nil {
		t.Fatal(err)
	}
	for _, col := range rep.Daemon.Probes.Collectors {
		if col.Name == trace.CollectorSyscalls && col.Source != trace.SourceBPF {
			t.Skipf("skipping: syscalls collector on %s: %s", col.Source, col.Error)
		}
	}

	weights := filepath.Join(t.TempDir(), "x.safetensors")
	if err := os.WriteFile(weights, make([]byte, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	const load = 300 * time.Millisecond
	before := time.Now()
	f, err := os.Open(weights)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	time.Sleep(load)

	out, tf := outFile(t), traceFile(t)
	st, o, err := openWith(t, c, control.Open{Metadata: map[string]any{"output_path": "/x/run.strap"}}, out, tf)
	if err != nil {
		t.Fatal(err)
	}
	tf.Close()
	a := tensor("a", 1, 100)
	if err := st.Put(&a); err != nil {
		t.Fatal(err)
	}
	// The daemon handles this connection's messages in order, so its CLOSED comes after
	// both PUBLISHes were handled: the time until Finish returns bounds the phase's end.
	b := tensor("b", 1, 100)
	if err := st.Put(&b); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Finish(); err != nil {
		t.Fatal(err)
	}
	bound := time.Since(before)

	rf, err := os.Open(tf.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer rf.Close()
	snaps, err := trace.ReadSnapshots(rf)
	if err != nil {
		t.Fatalf("trace: %v", err)
	}
	var loads []trace.ModelLoad
	for _, s := range snaps {
		loads = append(loads, s.ModelLoad...)
	}
	if len(loads) != 1 {
		t.Fatalf("model_load entries %+v, want exactly one", loads)
	}
	ml := loads[0]
	t.Logf("model_load %+v (bound %.6f s)", ml, bound.Seconds())
	if ml.Session != strconv.FormatUint(o.Session, 10) || ml.PID != os.Getpid() || ml.Path != weights {
		t.Errorf("model_load %+v: want session %d, pid %d, path %s", ml, o.Session, os.Getpid(), weights)
	}
	if ml.DurationS < load.Seconds() || ml.DurationS > bound.Seconds() {
		t.Errorf("duration %.6f s, want within [%.3f, %.6f]", ml.DurationS, load.Seconds(), bound.Seconds())
	}
	if d := ml.End - ml.Start; d < ml.DurationS-1e-5 || d > ml.DurationS+1e-5 {
		t.Errorf("end - start = %.6f, duration %.6f", d, ml.DurationS)
	}
	// The probe's start is a kernel monotonic time turned into wall time by an offset the daemon
	// took earlier; on a VM the two clocks drift apart by a millisecond or so (seen: 1.05 ms), so
	// the start may precede the test's own reading by that much.
	if b := float64(before.UnixMicro()) / 1e6; ml.Start < b-10e-3 || ml.Start > b+bound.Seconds() {
		t.Errorf("start %.6f outside [%.6f, +%.3f s]", ml.Start, b, bound.Seconds())
	}
	if !strings.HasSuffix(ml.Path, ".safetensors") {
		t.Errorf("path %q", ml.Path)
	}
}

// TestModelLoadTakenByUntracedSession: the load ends at the first PUBLISH of any session of
// the client, so a traced session opened after an untraced one has published reports none;
// opening a weight file again starts a new load, which the next traced session reports.
func TestModelLoadTakenByUntracedSession(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipping: the weight-open probe needs root (CAP_BPF+CAP_PERFMON)")
	}
	ts := startServer(t, probeConfig(time.Hour))
	weights := filepath.Join(t.TempDir(), "y.gguf")
	session := func(traced bool) []trace.ModelLoad {
		t.Helper()
		fds := []*os.File{outFile(t)}
		var tf *os.File
		if traced {
			tf = traceFile(t)
			fds = append(fds, tf)
		}
		st, _, err := openWith(t, ts.dial(t), control.Open{Metadata: map[string]any{"output_path": "/x/a.strap"}}, fds...)
		if err != nil {
			t.Fatal(err)
		}
		a := tensor("a", 1, 100)
		if err := st.Put(&a); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Finish(); err != nil {
			t.Fatal(err)
		}
		if !traced {
			return nil
		}
		rf, err := os.Open(tf.Name())
		if err != nil {
			t.Fatal(err)
		}
		defer rf.Close()
		snaps, err := trace.ReadSnapshots(rf)
		if err != nil || len(snaps) == 0 {
			t.Fatalf("trace: %d lines, %v", len(snaps), err)
		}
		var loads []trace.ModelLoad
		for _, s := range snaps {
			loads = append(loads, s.ModelLoad...)
		}
		return loads
	}
	if err := os.WriteFile(weights, []byte("GGUF"), 0o644); err != nil {
		t.Fatal(err)
	}
	session(false)
	if loads := session(true); len(loads) != 0 {
		t.Fatalf("model_load %+v after an untraced session's PUBLISH ended the load", loads)
	}
	if err := os.WriteFile(weights, []byte("GGUF"), 0o644); err != nil {
		t.Fatal(err)
	}
	if loads := session(true); len(loads) != 1 || loads[0].Path != weights {
		t.Fatalf("model_load %+v after a new open of %s, want exactly that one", loads, weights)
	}
}
