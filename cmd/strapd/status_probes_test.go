package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/strap-llm/strap/internal/control"
)

func TestPrintProbes(t *testing.T) {
	tests := []struct {
		name string
		p    *control.ProbesStatus
		want []string
	}{
		{"off", nil, []string{"probes: off"}},
		{"not started", &control.ProbesStatus{Error: "cgroup /x: no such file"}, []string{"not started: cgroup /x"}},
		{"running", &control.ProbesStatus{Enabled: true, IntervalS: 5, Snapshots: 3, TraceSessions: 1,
			Collectors: []control.ProbeCollector{
				{Name: "block_io", Source: "bpf"},
				{Name: "syscalls", Source: "off", Error: "attach sys_enter: permission denied"},
				{Name: "pressure", Source: "proc"},
			},
			Watched:  []int{42, 1234},
			BPFStats: []control.ProbeProgStats{{Program: "sched_switch", TotalEvents: 1000, NsPerEvent: 501.4}},
			Drops:    map[string]uint64{"ringbuf_full": 2, "rq_stale": 1},
		}, []string{
			"probes: every 5s, 3 snapshots, 1 sessions tracing, watching [42 1234]",
			"block_io     bpf      attached",
			"syscalls     off      not attached, fallback off: attach sys_enter: permission denied",
			"pressure     proc     reads /proc",
			"sched_switch  1000    501",
			"dropped events ringbuf_full: 2\n  dropped events rq_stale: 1",
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			printProbes(&buf, tc.p)
			for _, w := range tc.want {
				if !strings.Contains(buf.String(), w) {
					t.Errorf("missing %q in:\n%s", w, buf.String())
				}
			}
		})
	}
}
