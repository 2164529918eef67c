package metrics

import (
	"math"
	"strings"
	"testing"
)

func TestResourceAggregates(t *testing.T) {
	var nilM *Metrics
	nilM.ObserveResources([]byte(`{"event":"compute_execution"}` + "\n"))
	m := New(Options{Status: (&fakeDaemon{}).status})
	m.ObserveResources([]byte(
		`{"event":"compute_execution","component_type":"mlp","module":"model.layers.0.mlp.up_proj","duration_us":1500,"flops":2000}` + "\n" +
			`{"event":"compute_execution","component_type":"mlp","module":"model.layers.1.mlp.up_proj","duration_us":500.5,"flops":null}` + "\n" +
			`{"event":"compute_execution","component_type":"q_rotary_xyz","duration_us":2}` + "\n" +
			`{"event":"made_up_by_a_client","component_type":"attention"}` + "\n" +
			`{"event":"resource_session_start"}` + "\n" +
			`{"event":"compute_execution","component_type":"mlp","duration_us":"fast"}` + "\n" +
			`{"event":"compute_execution","component_type":"mlp","flops":-1}` + "\n"))
	m.ObserveResources([]byte(`{"event":"kv_cache_update","component_type":"attention","layer_id":3}` + "\n"))
	v, _ := gather(t, m)
	for k, want := range map[string]float64{
		"strapd_resource_events_total{component_type=mlp,event=compute_execution}":           2,
		"strapd_resource_timed_events_total{component_type=mlp,event=compute_execution}":     2,
		"strapd_resource_duration_seconds_total{component_type=mlp,event=compute_execution}": 2000.5e-6,
		"strapd_resource_flops_total{component_type=mlp,event=compute_execution}":            2000,
		"strapd_resource_events_total{component_type=other,event=compute_execution}":         1,
		"strapd_resource_events_total{component_type=attention,event=other}":                 1,
		"strapd_resource_events_total{component_type=none,event=resource_session_start}":     1,
		"strapd_resource_events_total{component_type=attention,event=kv_cache_update}":       1,
		"strapd_resource_timed_events_total{component_type=attention,event=kv_cache_update}": 0,
		"strapd_resource_events_unreadable_total":                                            2,
	} {
		got, ok := v[k]
		if !ok {
			t.Errorf("%s: missing", k)
			continue
		}
		if math.Abs(got-want) > 1e-12 {
			t.Errorf("%s = %g, want %g", k, got, want)
		}
	}
	for k := range v {
		for _, bad := range []string{"q_rotary_xyz", "made_up_by_a_client", "up_proj"} {
			if strings.Contains(k, bad) {
				t.Errorf("series %s carries a client string outside the bounded label sets", k)
			}
		}
	}
}

// TestResourceSeriesFromStart: before any resource event every label pair is exported at 0
// (a dashboard panel reads 0, not "No data"), and nothing outside the bounded sets.
func TestResourceSeriesFromStart(t *testing.T) {
	m := New(Options{Status: (&fakeDaemon{}).status})
	v, _ := gather(t, m)
	n := 0
	for k, x := range v {
		if !strings.HasPrefix(k, "strapd_resource_") {
			continue
		}
		n++
		if x != 0 {
			t.Errorf("%s = %g before any event", k, x)
		}
	}
	// 4 labelled families × (7 event types + other) × (6 components + none + other), and
	// the unlabelled unreadable counter.
	if want := 4*8*8 + 1; n != want {
		t.Errorf("%d resource series before any event, want %d", n, want)
	}
	for _, k := range []string{
		"strapd_resource_events_total{component_type=mlp,event=compute_execution}",
		"strapd_resource_flops_total{component_type=other,event=other}",
		"strapd_resource_duration_seconds_total{component_type=none,event=resource_session_summary}",
		"strapd_resource_events_unreadable_total",
	} {
		if _, ok := v[k]; !ok {
			t.Errorf("%s: missing before any event", k)
		}
	}
}
