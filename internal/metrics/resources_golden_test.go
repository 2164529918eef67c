package metrics

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"
)

// TestResourceAggregatesGolden feeds each golden resource-event file (written by the
// Python builders, testdata/resource_events) to the aggregates, as strapd does with the
// lines it appends, and checks every series against sums computed with encoding/json:
// no event is unreadable, and counts, timed counts, durations and FLOPs match per label.
func TestResourceAggregatesGolden(t *testing.T) {
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
			want := map[string]float64{}
			for _, l := range bytes.Split(bytes.TrimSuffix(b, []byte("\n")), []byte("\n")) {
				var ev struct {
					Event      string   `json:"event"`
					Component  *string  `json:"component_type"`
					DurationUS *float64 `json:"duration_us"`
					FLOPs      *float64 `json:"flops"`
				}
				if err := json.Unmarshal(l, &ev); err != nil {
					t.Fatal(err)
				}
				event, comp := ev.Event, "none"
				if !resourceEventTypes[event] {
					event = labelOther
				}
				if ev.Component != nil {
					comp = *ev.Component
					if !resourceComponents[comp] {
						comp = labelOther
					}
				}
				labels := fmt.Sprintf("{component_type=%s,event=%s}", comp, event)
				want["strapd_resource_events_total"+labels]++
				want["strapd_resource_timed_events_total"+labels] += 0
				want["strapd_resource_duration_seconds_total"+labels] += 0
				want["strapd_resource_flops_total"+labels] += 0
				if ev.DurationUS != nil {
					want["strapd_resource_timed_events_total"+labels]++
					want["strapd_resource_duration_seconds_total"+labels] += *ev.DurationUS / 1e6
				}
				if ev.FLOPs != nil {
					want["strapd_resource_flops_total"+labels] += *ev.FLOPs
				}
			}
			want["strapd_resource_events_unreadable_total"] = 0
			m := New(Options{Status: (&fakeDaemon{}).status})
			m.ObserveResources(b)
			got, _ := gather(t, m)
			for k, w := range want {
				if g, ok := got[k]; !ok || math.Abs(g-w) > 1e-9*math.Max(1, math.Abs(w)) {
					t.Errorf("%s = %v (present %v), want %v", k, g, ok, w)
				}
			}
		})
	}
}
