//go:build linux

package trace

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

const killWriterEnv = "STRAP_TRACE_TEST_KILL_WRITER"

// TestMain turns the test binary into the writer TestSIGKILLWholeOrAbsent kills, when
// started with killWriterEnv set.
func TestMain(m *testing.M) {
	if path := os.Getenv(killWriterEnv); path != "" {
		killWriterChild(path) // never returns
	}
	os.Exit(m.Run())
}

// killWriterChild appends large snapshot lines as fast as it can until it is killed.
func killWriterChild(path string) {
	w, _, err := OpenFile(path, WriterOptions{})
	if err != nil {
		os.Stderr.WriteString(err.Error())
		os.Exit(3)
	}
	s := bigSnapshot()
	for {
		if err := w.Write(s); err != nil {
			os.Exit(4)
		}
	}
}

// bigSnapshot makes ~200 KiB lines: a write(2) spans many pages, so a kill can cut it.
func bigSnapshot() Snapshot {
	s := sampleSnapshot()
	for i := range 3000 {
		s.Threads = append(s.Threads, Thread{TID: 100000 + i, PID: 4242, OffCPU: OffCPU{SleepNs: uint64(i)}})
	}
	return s
}

// TestSIGKILLWholeOrAbsent kills a writer mid-stream several times, restarting it on the
// same file as strapd would: every line in the file is whole, the only possible damage
// is one torn tail, and reopening removes it.
func TestSIGKILLWholeOrAbsent(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "jsonl")
	torn := 0
	line, err := jsonLine(bigSnapshot())
	if err != nil {
		t.Fatal(err)
	}
	for round := range 4 {
		cmd := exec.Command(exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), killWriterEnv+"="+path)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Let it write a few lines; vary the moment of the kill.
		deadline := time.Now().Add(5 * time.Second)
		var start int64
		if st, err := os.Stat(path); err == nil {
			start = st.Size()
		}
		for time.Now().Before(deadline) {
			if st, err := os.Stat(path); err == nil && st.Size() >= start+int64(round%2+2)*int64(len(line)) {
				break
			}
			time.Sleep(time.Millisecond)
		}
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() {
			t.Fatalf("round %d: writer exited on its own: %v", round, cmd.ProcessState)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		got, err := ReadSnapshots(bytes.NewReader(b))
		switch {
		case errors.Is(err, ErrTornLine):
			torn++
		case err != nil:
			t.Fatalf("round %d: a line other than the last is damaged: %v", round, err)
		}
		if len(got) == 0 {
			t.Fatalf("round %d: no whole line written", round)
		}
		if bytes.IndexByte(b, 0) >= 0 {
			t.Fatalf("round %d: NUL bytes in the file", round)
		}
	}
	// What a restarted strapd does: reopen, which repairs.
	w, _, err := OpenFile(path, WriterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got, err := ReadSnapshots(f)
	if err != nil {
		t.Fatalf("after repair: %v", err)
	}
	t.Logf("%d whole lines after 4 kills; %d kills left a torn tail (repaired on reopen)", len(got), torn)
}
