package httpapi

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"testing"
)

// TestResourceLogGolden serves each golden resource-event file (written by the Python
// builders, testdata/resource_events) as a session's resource log: every line comes back
// unchanged with its number and none is malformed, and the event, layer and since filters
// select exactly the lines a decode with encoding/json selects.
func TestResourceLogGolden(t *testing.T) {
	files, err := filepath.Glob("../../testdata/resource_events/*.jsonl")
	if err != nil || len(files) < 5 {
		t.Fatalf("golden resource-event files: %v, %v", files, err)
	}
	for _, p := range files {
		t.Run(filepath.Base(p), func(t *testing.T) {
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(t.TempDir(), "run.strap")
			if err := os.WriteFile(out+ResourceSuffix, b, 0o644); err != nil {
				t.Fatal(err)
			}
			lines := bytes.Split(bytes.TrimSuffix(b, []byte("\n")), []byte("\n"))
			type ref struct {
				event, layer string
				hasLayer     bool
				ts           int64
			}
			refs := make([]ref, len(lines))
			var stamps []int64
			for i, l := range lines {
				var m map[string]json.RawMessage
				if err := json.Unmarshal(l, &m); err != nil {
					t.Fatal(err)
				}
				_ = json.Unmarshal(m["event"], &refs[i].event)
				for _, k := range []string{"layer_id", "layer"} {
					if v, ok := m[k]; ok && string(v) != "null" {
						refs[i].layer, refs[i].hasLayer = string(v), true
						var s string
						if json.Unmarshal(v, &s) == nil {
							refs[i].layer = s
						}
						break
					}
				}
				if refs[i].ts, err = strconv.ParseInt(string(m["timestamp"]), 10, 64); err != nil {
					t.Fatalf("line %d timestamp: %v", i+1, err)
				}
				stamps = append(stamps, refs[i].ts)
			}
			sort.Slice(stamps, func(i, j int) bool { return stamps[i] < stamps[j] })
			since := stamps[len(stamps)/2]
			for _, tc := range []struct {
				name string
				f    Filter
				keep func(r ref) bool
			}{
				{"all", Filter{}, func(ref) bool { return true }},
				{"event", Filter{Event: "compute_execution"}, func(r ref) bool { return r.event == "compute_execution" }},
				{"layer", Filter{Layer: "0"}, func(r ref) bool { return r.hasLayer && r.layer == "0" }},
				{"since", Filter{SinceUS: since, HasSince: true}, func(r ref) bool { return r.ts >= since }},
			} {
				t.Run(tc.name, func(t *testing.T) {
					var want []int
					for i, r := range refs {
						if tc.keep(r) {
							want = append(want, i+1)
						}
					}
					if len(want) == 0 {
						t.Fatal("the filter selects no line of the golden file: the test would prove nothing")
					}
					tl := newTailer(1, uint32(os.Getuid()), out)
					defer tl.close()
					var got []int
					err := tl.poll(func(e Event) {
						if !bytes.Equal(e.Event, lines[e.Line-1]) {
							t.Errorf("line %d changed: %s", e.Line, e.Event)
						}
						got = append(got, e.Line)
					}, func(m Malformed) { t.Errorf("line %d malformed: %s", m.Line, m.Error) }, &tc.f)
					if err != nil {
						t.Fatal(err)
					}
					if !slices.Equal(got, want) {
						t.Fatalf("lines %v, want %v", got, want)
					}
				})
			}
		})
	}
}
