package faultinject

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestMain(m *testing.M) {
	ChildMain()
	os.Exit(m.Run())
}

// ddResult is what a dd run under a rule did.
type ddResult struct {
	err      error  // dd's exit
	stderr   string // its messages
	size     int64  // the file's size afterwards
	injected uint64 // writes failed with EIO
}

// dd writes count blocks of 4 KiB to path with write(2) under rule.
func dd(t *testing.T, rule Rule, path string, count int) ddResult {
	t.Helper()
	ddPath, err := exec.LookPath("dd")
	if err != nil {
		t.Skipf("no dd: %v", err)
	}
	var errb bytes.Buffer
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _, _ = errb.ReadFrom(r); close(done) }()
	p, err := Start(rule, []string{ddPath, "if=/dev/zero", "of=" + path, "bs=4096", "count=" + strconv.Itoa(count)}, nil, nil, w)
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	werr := p.Wait()
	<-done
	r.Close()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := p.Injected()
	return ddResult{err: werr, stderr: errb.String(), size: st.Size(), injected: n}
}

// TestWriteEIO: a real write(2) of a child fails with EIO once its file in the rule's
// directory holds After bytes; the bytes before stay, files elsewhere and a disarmed rule
// are not touched.
func TestWriteEIO(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir()
	armed := filepath.Join(t.TempDir(), "armed")
	if err := os.WriteFile(armed, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	rule := Rule{Dir: dir, After: 8192, Armed: armed}

	t.Run("fails at After", func(t *testing.T) {
		r := dd(t, rule, filepath.Join(dir, "x"), 16)
		var ee *exec.ExitError
		if !errors.As(r.err, &ee) || !strings.Contains(r.stderr, "Input/output error") {
			t.Fatalf("dd: %v, stderr %q; want a failed write with EIO", r.err, r.stderr)
		}
		if r.size != 8192 || r.injected != 1 {
			t.Fatalf("file size %d after %d injected EIO; want 8192 after 1", r.size, r.injected)
		}
	})
	t.Run("other directory", func(t *testing.T) {
		if r := dd(t, rule, filepath.Join(other, "x"), 16); r.err != nil || r.size != 16*4096 || r.injected != 0 {
			t.Fatalf("dd outside the directory: %+v", r)
		}
	})
	t.Run("disarmed", func(t *testing.T) {
		if err := os.Remove(armed); err != nil {
			t.Fatal(err)
		}
		if r := dd(t, rule, filepath.Join(dir, "y"), 16); r.err != nil || r.size != 16*4096 || r.injected != 0 {
			t.Fatalf("dd with the rule disarmed: %+v", r)
		}
	})
}
