package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/strap-llm/strap/internal/control"
)

// TestStatusResourcesColumn: the session table shows resource events, "-" without a
// resource log, and lost events with their error.
func TestStatusResourcesColumn(t *testing.T) {
	for _, tc := range []struct {
		name string
		s    control.SessionStatus
		want string
	}{
		{"no log", control.SessionStatus{}, "  -  "},
		{"events", control.SessionStatus{ResourceLog: true, ResourceEvents: 5120}, "  5120  "},
		{"lost", control.SessionStatus{ResourceLog: true, ResourceEvents: 7, ResourceEventsLost: 3,
			ResourceLogError: "no space left on device"}, "7 (3 lost: no space left on device)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.s.LastCheckpointAgeS = -1
			var b bytes.Buffer
			if err := printStatus(&b, control.StatusReply{Daemon: control.DaemonStatus{Sessions: 1},
				Sessions: []control.SessionStatus{tc.s}}); err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimSpace(b.String()), "\n")
			head, row := lines[len(lines)-2], lines[len(lines)-1]
			col := strings.Index(head, "RESOURCES")
			if col < 0 || !strings.Contains(row[col-2:], tc.want) {
				t.Fatalf("RESOURCES column:\n%s\n%s\nwant %q", head, row, tc.want)
			}
		})
	}
}

// TestStatusRankColumn: the session table shows a rank of a distributed job as
// rank/world_size@host, "-" for a single process.
func TestStatusRankColumn(t *testing.T) {
	lr := uint64(1)
	for _, tc := range []struct {
		name string
		d    *control.SessionRank
		want string
	}{
		{"single process", nil, "  -  "},
		{"rank", &control.SessionRank{Rank: 3, WorldSize: 8, LocalRank: &lr, Host: "node07"}, "  3/8@node07  "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := printStatus(&b, control.StatusReply{Daemon: control.DaemonStatus{Sessions: 1},
				Sessions: []control.SessionStatus{{LastCheckpointAgeS: -1, OutputPath: "/o.strap", Distributed: tc.d}}}); err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimSpace(b.String()), "\n")
			head, row := lines[len(lines)-2], lines[len(lines)-1]
			col := strings.Index(head, "RANK")
			if col < 0 || !strings.Contains(row[col-2:], tc.want) {
				t.Fatalf("RANK column:\n%s\n%s\nwant %q", head, row, tc.want)
			}
		})
	}
}
