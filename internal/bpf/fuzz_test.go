package bpf

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/strap-llm/strap/internal/trace"
)

// addSeeds adds every file of testdata/trace/<dir> to the fuzz corpus.
func addSeeds(f *testing.F, dir string) {
	files, err := filepath.Glob(filepath.Join(testdataDir, dir, "*"))
	if err != nil || len(files) == 0 {
		f.Fatalf("no seeds in %s: %v", dir, err)
	}
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
}

// FuzzReadPSI: whatever a pressure file holds, ReadPSI's checks on top of procfs either
// refuse it or return a some line and averages within 0..100.
func FuzzReadPSI(f *testing.F) {
	addSeeds(f, "psi")
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := readPSIResource(psiFS(t, b), "cpu")
		if err != nil {
			if !errors.Is(err, ErrBadPSI) {
				t.Fatalf("error %v is not ErrBadPSI", err)
			}
			return
		}
		if r.Some == nil {
			t.Fatal("parsed without a some line")
		}
		for _, v := range []*trace.PSIValues{r.Some, r.Full} {
			if v != nil && (v.Avg10 < 0 || v.Avg10 > 100 || v.Avg60 < 0 || v.Avg60 > 100 || v.Avg300 < 0 || v.Avg300 > 100) {
				t.Fatalf("average out of range: %+v", v)
			}
		}
	})
}

// FuzzParseNUMAMaps: whatever /proc/<pid>/numa_maps holds, parseNUMAMaps either refuses
// it with ErrBadNUMAMaps or returns per-node sums whose bytes are whole KiB and at least
// 4 KiB per page.
func FuzzParseNUMAMaps(f *testing.F) {
	addSeeds(f, "numa_maps")
	f.Fuzz(func(t *testing.T, b []byte) {
		nodes, err := parseNUMAMaps(b)
		if err != nil {
			if !errors.Is(err, ErrBadNUMAMaps) {
				t.Fatalf("error %v is not ErrBadNUMAMaps", err)
			}
			return
		}
		for n, p := range nodes {
			if n < 0 || p.Bytes%1024 != 0 || p.Bytes < p.Pages*1024 {
				t.Fatalf("node %d: %+v", n, p)
			}
		}
	})
}

// FuzzParseProcIO: whatever /proc/<pid>/io holds, parseProcIO returns its two values or
// ErrBadProcIO, never anything else.
func FuzzParseProcIO(f *testing.F) {
	addSeeds(f, "procio")
	f.Fuzz(func(t *testing.T, b []byte) {
		if _, _, err := parseProcIO(b); err != nil && !errors.Is(err, ErrBadProcIO) {
			t.Fatalf("error %v is not ErrBadProcIO", err)
		}
	})
}
