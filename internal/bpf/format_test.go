package bpf

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/procfs"

	"github.com/strap-llm/strap/internal/trace"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/trace")

const testdataDir = "../../testdata/trace"

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join(testdataDir, name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create)", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s differs from the golden file:\ngot:\n%s\nwant:\n%s", name, got, want)
	}
}

// psiFS lays b out as <tmp>/pressure/cpu, the layout procfs reads.
func psiFS(t testing.TB, b []byte) procfs.FS {
	root := t.TempDir()
	if err := os.Mkdir(filepath.Join(root, "pressure"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "pressure", "cpu"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	fs, err := procfs.NewFS(root)
	if err != nil {
		t.Fatal(err)
	}
	return fs
}

// TestReadPSIGolden reads every file in testdata/trace/psi as a /proc/pressure file and
// compares the results (values or error) with psi.golden.json.
func TestReadPSIGolden(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(testdataDir, "psi", "*.txt"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no PSI fixtures: %v", err)
	}
	type result struct {
		Parsed *trace.PSIResource `json:"parsed,omitempty"`
		Error  string             `json:"error,omitempty"`
	}
	results := map[string]result{}
	for _, f := range files {
		name := filepath.Base(f)
		t.Run(name, func(t *testing.T) {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			r, err := readPSIResource(psiFS(t, b), "cpu")
			bad := strings.HasPrefix(name, "bad-")
			switch {
			case bad && err == nil:
				t.Fatalf("parsed malformed input: %+v", r)
			case bad && !errors.Is(err, ErrBadPSI):
				t.Fatalf("error %v is not ErrBadPSI", err)
			case !bad && err != nil:
				t.Fatalf("parse: %v", err)
			}
			if err != nil {
				results[name] = result{Error: err.Error()}
			} else {
				results[name] = result{Parsed: &r}
			}
		})
	}
	got, err := json.MarshalIndent(results, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "psi.golden.json", append(got, '\n'))
}

func TestReadPSIAbsent(t *testing.T) {
	got, err := ReadPSI(filepath.Join(t.TempDir(), "no-pressure"))
	if err != nil || got != nil {
		t.Fatalf("absent /proc/pressure: %v, %v; want nil, nil", got, err)
	}
}

// TestReadProcFaults reads the fixtures of testdata/trace/procstat as /proc/<pid>/stat.
func TestReadProcFaults(t *testing.T) {
	for _, tc := range []struct {
		file         string
		minor, major uint64
		wantErr      bool
	}{
		{file: "paren-in-comm.txt", minor: 1234, major: 56},
		{file: "self.txt", minor: 117, major: 0},
		{file: "bad-short.txt", wantErr: true},
	} {
		t.Run(tc.file, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join(testdataDir, "procstat", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			root := t.TempDir()
			const pid = 4242
			if err := os.MkdirAll(filepath.Join(root, "4242"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(root, "4242", "stat"), b, 0o644); err != nil {
				t.Fatal(err)
			}
			fs, err := procfs.NewFS(root)
			if err != nil {
				t.Fatal(err)
			}
			got, err := readProcFaults(fs, pid)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if !tc.wantErr && (got.Minor != tc.minor || got.Major != tc.major) {
				t.Fatalf("got %+v, want minor %d major %d", got, tc.minor, tc.major)
			}
		})
	}
}

// TestSnapshotEmptyCollections: a fresh Snapshot has [] and {} rather than null, so
// consumers can iterate without checks.
func TestSnapshotEmptyCollections(t *testing.T) {
	c, err := Start(Options{NoBPF: true, ProcRoot: t.TempDir(), SysRoot: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b, err := json.Marshal(c.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(b, []byte("null")) {
		t.Fatalf("null in an empty snapshot: %s", b)
	}
	for _, st := range c.Status().Collectors {
		if st.Name == trace.CollectorPressure && st.Source != trace.SourceOff {
			t.Errorf("pressure without /proc/pressure: source %q", st.Source)
		}
	}
}

// TestWatchContextSwitchBaseline: Watch reads a process's context switches from /proc (a
// sum over its threads' status files) only where Snapshot counts them from there, i.e.
// when sched is not on bpf.
func TestWatchContextSwitchBaseline(t *testing.T) {
	c, err := Start(Options{NoBPF: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pid := os.Getpid()
	for _, tc := range []struct {
		source string
		want   bool
	}{{trace.SourceProc, true}, {trace.SourceBPF, false}} {
		t.Run(tc.source, func(t *testing.T) {
			c.status[trace.CollectorSched].Source = tc.source
			if err := c.Watch(pid); err != nil {
				t.Fatal(err)
			}
			defer c.Unwatch(pid)
			if _, got := c.prevCtx[pid]; got != tc.want {
				t.Fatalf("sched on %s: baseline read %v, want %v", tc.source, got, tc.want)
			}
			if _, got := c.prevProc[pid]; !got {
				t.Fatal("no page-fault baseline")
			}
		})
	}
}
