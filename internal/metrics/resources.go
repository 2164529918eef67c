package metrics

import (
	"bytes"
	"maps"
	"slices"
	"sort"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/strap-llm/strap/internal/resevent"
)

// Resource events arrive with client-chosen strings; only these values become labels, so
// the series stay bounded whatever a client sends. Anything else counts as "other".
var (
	resourceEventTypes = map[string]bool{
		"compute_execution": true, "memory_allocation": true, "mlp_operation": true,
		"component_handoff": true, "kv_cache_update": true,
		"resource_session_start": true, "resource_session_summary": true,
	}
	resourceComponents = map[string]bool{
		"attention": true, "mlp": true, "norm": true, "embedding": true, "model": true, "lm_head": true,
	}
)

const labelOther = "other"

// resourceLabelPairs is every (event, component_type) pair a resource series can carry:
// the documented values, "other", and "none" for a missing component_type.
var resourceLabelPairs = func() []resourceKey {
	events := append(slices.Sorted(maps.Keys(resourceEventTypes)), labelOther)
	comps := append(slices.Sorted(maps.Keys(resourceComponents)), "none", labelOther)
	var out []resourceKey
	for _, e := range events {
		for _, c := range comps {
			out = append(out, resourceKey{e, c})
		}
	}
	return out
}()

type resourceKey struct{ event, component string }

type resourceSums struct {
	events     uint64
	durationUS float64
	timed      uint64
	flops      float64
}

var (
	resLabels         = []string{"event", "component_type"}
	descResEvents     = prometheus.NewDesc("strapd_resource_events_total", "Resource events received in RESOURCES messages (whether or not their log write succeeded: strapd status counts the lost ones), by event type and component_type (types and components outside the documented sets count as \"other\"; component_type \"none\" when absent).", resLabels, nil)
	descResDuration   = prometheus.NewDesc("strapd_resource_duration_seconds_total", "Sum of the measured duration_us of resource events that carry one, in seconds.", resLabels, nil)
	descResTimed      = prometheus.NewDesc("strapd_resource_timed_events_total", "Resource events that carried a measured duration_us (the denominator of a mean duration).", resLabels, nil)
	descResFLOPs      = prometheus.NewDesc("strapd_resource_flops_total", "Sum of the flops field of resource events that carry one (computed from shapes by the client).", resLabels, nil)
	descResUnreadable = prometheus.NewDesc("strapd_resource_events_unreadable_total", "Resource events received but left out of the resource aggregates: their duration_us or flops was not a finite non-negative number, or their component_type not a string.", nil, nil)
)

// ObserveResources adds resource events to the aggregates: lines are the JSON lines the
// daemon appended (one compact object per line, already checked by control.ResourceLines),
// read with resevent, as every Go reader of event lines does.
func (m *Metrics) ObserveResources(lines []byte) {
	if m == nil {
		return
	}
	type parsed struct {
		key        resourceKey
		dur, fl    float64
		hasDur     bool
		hasFLOPs   bool
		unreadable bool
	}
	var batch []parsed
	for len(lines) > 0 {
		i := bytes.IndexByte(lines, '\n')
		var line []byte
		if i < 0 {
			line, lines = lines, nil
		} else {
			line, lines = lines[:i], lines[i+1:]
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		batch = append(batch, parsed{unreadable: true})
		p := &batch[len(batch)-1]
		e, err := resevent.Parse(line)
		if err != nil {
			continue
		}
		comp, hasComp, err := e.Component()
		if err != nil {
			continue
		}
		if p.dur, p.hasDur, err = e.DurationUS(); err != nil {
			continue
		}
		if p.fl, p.hasFLOPs, err = e.FLOPs(); err != nil {
			continue
		}
		p.unreadable = false
		p.key.event = labelOther
		if name := e.Name(); resourceEventTypes[name] {
			p.key.event = name
		}
		switch {
		case !hasComp:
			p.key.component = "none"
		case resourceComponents[comp]:
			p.key.component = comp
		default:
			p.key.component = labelOther
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.resources == nil {
		m.resources = map[resourceKey]*resourceSums{}
	}
	for _, p := range batch {
		if p.unreadable {
			m.resourcesUnreadable++
			continue
		}
		s := m.resources[p.key]
		if s == nil {
			s = &resourceSums{}
			m.resources[p.key] = s
		}
		s.events++
		if p.hasDur {
			s.durationUS += p.dur
			s.timed++
		}
		if p.hasFLOPs {
			s.flops += p.fl
		}
	}
}

// collectResources sends the resource aggregates; called with m.mu not held.
func (m *Metrics) collectResources(ch chan<- prometheus.Metric) {
	m.mu.Lock()
	sums := make(map[resourceKey]resourceSums, len(resourceLabelPairs))
	keys := append([]resourceKey(nil), resourceLabelPairs...)
	for _, k := range keys {
		sums[k] = resourceSums{}
	}
	for k, s := range m.resources {
		if _, ok := sums[k]; !ok {
			keys = append(keys, k)
		}
		sums[k] = *s
	}
	unreadable := m.resourcesUnreadable
	m.mu.Unlock()
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].event != keys[j].event {
			return keys[i].event < keys[j].event
		}
		return keys[i].component < keys[j].component
	})
	counter := func(desc *prometheus.Desc, v float64, lv ...string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, v, lv...)
	}
	// Every label pair is known in advance (the sets above), so every series is exported
	// from start-up, at 0 until an event counts: a panel or rule reading one never finds
	// it missing, and a first event is an increase Prometheus sees.
	counter(descResUnreadable, float64(unreadable))
	for _, k := range keys {
		s := sums[k]
		counter(descResEvents, float64(s.events), k.event, k.component)
		counter(descResTimed, float64(s.timed), k.event, k.component)
		counter(descResDuration, s.durationUS/1e6, k.event, k.component)
		counter(descResFLOPs, s.flops, k.event, k.component)
	}
}
