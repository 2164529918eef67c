//go:build linux && privileged

package bpf

import (
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/strap-llm/strap/internal/trace"
)

// TestUnprivilegedFallback runs the collector as nobody (no CAP_BPF, no CAP_PERFMON):
// Start succeeds, every BPF collector reports why it is not on bpf, and the /proc
// fallbacks produce numbers.
func TestUnprivilegedFallback(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root to start a child as an unprivileged user")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// The test binary may sit in a 0700 build dir: copy it somewhere nobody can run it.
	dir, err := os.MkdirTemp("", "strap-unpriv-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "bpf.test")
	src, err := os.Open(exe)
	if err != nil {
		t.Fatal(err)
	}
	dst, err := os.OpenFile(bin, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	src.Close()
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), unprivEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	cmd.Stderr = os.Stderr
	b, err := cmd.Output()
	if err != nil {
		t.Fatalf("unprivileged child: %v", err)
	}
	var got struct {
		Status   Status
		Snapshot trace.Snapshot
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("child output %q: %v", b, err)
	}
	for _, st := range got.Status.Collectors {
		if st.Name == trace.CollectorPressure || st.Name == trace.CollectorMemory {
			continue // /proc only, with or without privileges
		}
		if st.Source == trace.SourceBPF || !strings.Contains(st.Error, "CAP_BPF") {
			t.Errorf("collector %s as nobody: source %q, error %q; want a fallback with a reason", st.Name, st.Source, st.Error)
		}
		t.Logf("%s: %s (%s)", st.Name, st.Source, st.Error)
	}
	if got.Snapshot.Collectors[trace.CollectorPageFaults] != trace.SourceProc || len(got.Snapshot.Watched) != 1 {
		t.Errorf("snapshot collectors %v watched %v: want page faults from proc for the child itself", got.Snapshot.Collectors, got.Snapshot.Watched)
	} else if m := got.Snapshot.Memory[pidKey(got.Snapshot.Watched[0])]; m.RSSBytes == 0 || m.RSSPeakBytes < m.RSSBytes {
		t.Errorf("memory of the child itself %+v: want its RSS from /proc", m)
	}
}
