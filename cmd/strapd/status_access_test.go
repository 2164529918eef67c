package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/strap-llm/strap/internal/control"
)

// TestPrintStatusHiddenSessions: when the daemon counts more sessions than it lists (they
// belong to other users), `strapd status` says how many are not shown.
func TestPrintStatusHiddenSessions(t *testing.T) {
	tests := []struct {
		name   string
		rep    control.StatusReply
		want   string
		absent bool
	}{
		{"all listed", control.StatusReply{Daemon: control.DaemonStatus{Sessions: 1},
			Sessions: []control.SessionStatus{{Session: 1, LastCheckpointAgeS: -1}}}, "not shown", true},
		{"two hidden", control.StatusReply{Daemon: control.DaemonStatus{Sessions: 3},
			Sessions: []control.SessionStatus{{Session: 1, LastCheckpointAgeS: -1}}}, "2 session(s) of other users not shown", false},
		{"none listed", control.StatusReply{Daemon: control.DaemonStatus{Sessions: 1}}, "1 session(s) of other users not shown", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := printStatus(&b, tc.rep); err != nil {
				t.Fatal(err)
			}
			if strings.Contains(b.String(), tc.want) == tc.absent {
				t.Fatalf("output (want %q present=%v):\n%s", tc.want, !tc.absent, b.String())
			}
		})
	}
}
