//go:build linux

package bpf

// Helpers shared by the tests that need root (files built with -tags privileged: see
// `make test-privileged`) and those that do not, plus TestMain's child modes.

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/strap-llm/strap/internal/trace"
)

func TestMain(m *testing.M) {
	if os.Getenv(unprivEnv) != "" {
		unprivChild() // never returns
	}
	os.Exit(m.Run())
}

// requireBPF skips the test only when the kernel probes truly cannot run here, naming
// what is missing; anything else that fails is a test failure.
func requireBPF(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		var caps unix.CapUserHeader
		caps.Version = unix.LINUX_CAPABILITY_VERSION_3
		var data [2]unix.CapUserData
		if err := unix.Capget(&caps, &data[0]); err != nil || data[1].Effective&(1<<(unix.CAP_BPF-32)) == 0 {
			t.Skip("skipping: needs root or CAP_BPF+CAP_PERFMON")
		}
	}
	if _, err := os.Stat("/sys/kernel/btf/vmlinux"); err != nil {
		t.Skip("skipping: kernel has no BTF (/sys/kernel/btf/vmlinux)")
	}
}

const unprivEnv = "STRAP_BPF_TEST_UNPRIV"

// unprivChild starts a Collector as whoever it runs as and prints its Status and one
// Snapshot as JSON.
func unprivChild() {
	c, err := Start(Options{WatchSelf: true})
	if err != nil {
		os.Stderr.WriteString(err.Error())
		os.Exit(3)
	}
	out := struct {
		Status   Status
		Snapshot trace.Snapshot
	}{c.Status(), c.Snapshot()}
	c.Close()
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		os.Exit(4)
	}
	os.Exit(0)
}

// startAttached starts a Collector with every probe attached, failing (not skipping)
// when a probe that should attach here does not.
func startAttached(t *testing.T, opts Options) *Collector {
	t.Helper()
	requireBPF(t)
	c, err := Start(opts)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	for _, st := range c.Status().Collectors {
		if st.Source == trace.SourceBPF || st.Name == trace.CollectorPressure || st.Name == trace.CollectorMemory {
			continue
		}
		if strings.Contains(st.Error, "operation not permitted") {
			t.Skipf("skipping: loading BPF programs is not permitted here: %s", st.Error)
		}
		t.Fatalf("collector %s not on bpf: %s", st.Name, st.Error)
	}
	return c
}

// gatedChild starts `sh -c 'read x; exec <cmd>'`: the child waits on stdin until release,
// so the test can watch its pid before the measured work begins.
type gatedChild struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	pid   int
}

func startGated(t *testing.T, script string, env ...string) *gatedChild {
	t.Helper()
	cmd := exec.Command("sh", "-c", "read x; exec "+script)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	g := &gatedChild{cmd: cmd, stdin: in, pid: cmd.Process.Pid}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return g
}

// releaseAndWait lets the child run and waits for it to exit successfully.
func (g *gatedChild) releaseAndWait(t *testing.T) {
	t.Helper()
	if _, err := io.WriteString(g.stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	g.stdin.Close()
	done := make(chan error, 1)
	go func() { done <- g.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("child %d: %v", g.pid, err)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("child %d did not finish", g.pid)
	}
}

func python(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"python3", "/usr/bin/python3"} {
		if path, err := exec.LookPath(p); err == nil {
			return path
		}
	}
	t.Skip("skipping: no python3 to run the child workload")
	return ""
}

const touchPages = `import mmap, sys
n = int(sys.argv[1])
m = mmap.mmap(-1, n * 4096, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
m.madvise(mmap.MADV_NOHUGEPAGE)
for i in range(n):
    m[i * 4096] = 1
`

// TestProcFallbacks: with the probes off, page faults and context switches still come
// from /proc and the collectors say so.
func TestProcFallbacks(t *testing.T) {
	py := python(t)
	c, err := Start(Options{NoBPF: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	want := map[string]string{trace.CollectorBlockIO: trace.SourceProc, trace.CollectorOffCPU: trace.SourceOff, trace.CollectorSched: trace.SourceProc,
		trace.CollectorPageFaults: trace.SourceProc, trace.CollectorSyscalls: trace.SourceOff}
	for _, st := range c.Status().Collectors {
		if w, ok := want[st.Name]; ok && (st.Source != w || st.Error == "") {
			t.Errorf("collector %s: source %q error %q, want %q with a reason", st.Name, st.Source, st.Error, w)
		}
	}
	const pages = 2000
	// The child must still exist when the snapshot reads /proc, so it waits on stdin
	// again after touching its pages.
	g := startGated(t, fmt.Sprintf("%s -c '%s%s' %d", py, touchPages, "\nsys.stdin.readline()\n", pages))
	if err := c.Watch(g.pid); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(g.stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	key := strconv.Itoa(g.pid)
	deadline := time.Now().Add(10 * time.Second)
	var total uint64
	for total < pages && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		s := c.Snapshot()
		total += s.PageFaults[key]
		if d := s.PageFaultsDetail[key]; d.Source != trace.SourceProc {
			t.Fatalf("source %q, want proc", d.Source)
		}
	}
	if total < pages {
		t.Fatalf("proc fallback counted %d faults, want >= %d", total, pages)
	}
	g.releaseAndWait(t)
}

// measure watches the gated child, releases it and returns the snapshot of its run alone
// (the snapshot taken first drops what came before). The unwatched children are released
// right after it and run the same work unwatched, so a test can show that they do not count.
func measure(t *testing.T, c *Collector, watched *gatedChild, unwatched ...*gatedChild) trace.Snapshot {
	t.Helper()
	if err := c.Watch(watched.pid); err != nil {
		t.Fatal(err)
	}
	c.Snapshot()
	watched.releaseAndWait(t)
	for _, g := range unwatched {
		g.releaseAndWait(t)
	}
	return c.Snapshot()
}
