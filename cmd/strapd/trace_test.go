package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/strap-llm/strap/internal/trace"
)

func TestTraceConfigValidate(t *testing.T) {
	ok := traceConfig{IntervalS: 5, Output: "t.jsonl", FlushEvery: 1}
	for _, tc := range []struct {
		name string
		mod  func(*traceConfig)
		want string // substring of the error; "" for valid
	}{
		{"defaults", func(*traceConfig) {}, ""},
		{"no output", func(c *traceConfig) { c.Output = ""; c.NoOutput = true }, ""},
		{"zero interval", func(c *traceConfig) { c.IntervalS = 0 }, "--interval"},
		{"NaN interval", func(c *traceConfig) { c.IntervalS = zeroF() / zeroF() }, "--interval"},
		{"flush-every 0", func(c *traceConfig) { c.FlushEvery = 0 }, "--flush-every"},
		{"empty output", func(c *traceConfig) { c.Output = "" }, "--output"},
		{"bad pid", func(c *traceConfig) { c.PIDs = []int{-3} }, "--pid"},
		{"negative count", func(c *traceConfig) { c.Count = -1 }, "--count"},
		{"sample read/write 1 in 10", func(c *traceConfig) { c.SampleReadWrite = 10 }, ""},
		{"negative sampling", func(c *traceConfig) { c.SampleReadWrite = -1 }, "--sample-read-write"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := ok
			tc.mod(&c)
			err := c.validate()
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("validate() = %v, want %q", err, tc.want)
			}
		})
	}
}

func zeroF() float64 { return 0 }

// TestRunTraceWritesSnapshots runs the command's loop for three short intervals (with the
// /proc fallbacks, so it needs no privileges) and reads the file back.
func TestRunTraceWritesSnapshots(t *testing.T) {
	out := filepath.Join(t.TempDir(), "tracepoints.jsonl")
	cfg := traceConfig{IntervalS: 0.05, Output: out, FlushEvery: 2, Count: 3, NoBPF: true, PIDs: []int{os.Getpid()}}
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	if err := runTrace(context.Background(), cfg, zap.NewNop()); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	snaps, err := trace.ReadSnapshots(f)
	if err != nil {
		t.Fatal(err)
	}
	if len(snaps) != 3 {
		t.Fatalf("%d snapshots, want 3", len(snaps))
	}
	for _, s := range snaps {
		if s.Collectors[trace.CollectorPageFaults] != trace.SourceProc || len(s.Watched) == 0 || s.IntervalS <= 0 {
			t.Fatalf("snapshot %+v", s)
		}
	}
}
