package server

import (
	"strings"
	"testing"
	"time"
)

func TestBucket(t *testing.T) {
	t0 := time.Unix(1000, 0)
	b := newBucket(10, t0)
	for i := range 10 {
		if !b.take(t0) {
			t.Fatalf("burst token %d refused", i)
		}
	}
	if b.take(t0) {
		t.Fatal("11th token in the same instant allowed")
	}
	if !b.take(t0.Add(100 * time.Millisecond)) {
		t.Fatal("no token after 100ms at 10/s")
	}
	if b.full(t0.Add(200 * time.Millisecond)) {
		t.Fatal("full after 200ms")
	}
	if !b.full(t0.Add(2 * time.Second)) {
		t.Fatal("not full after 2s")
	}
	var nilBucket *bucket
	if !nilBucket.take(t0) {
		t.Fatal("a nil bucket (no limit) refused")
	}
}

func TestQuotas(t *testing.T) {
	t0 := time.Unix(1000, 0)
	tests := []struct {
		name    string
		limits  ClientLimits
		steps   func(q *quotas) error
		wantSub string
	}{
		{"conns per uid", ClientLimits{MaxConnsPerUID: 2}, func(q *quotas) error {
			q.connect(ClientLimits{MaxConnsPerUID: 2}, 7, t0)
			q.connect(ClientLimits{MaxConnsPerUID: 2}, 7, t0)
			if err := q.connect(ClientLimits{MaxConnsPerUID: 2}, 8, t0); err != nil {
				return err // another uid is not affected
			}
			return q.connect(ClientLimits{MaxConnsPerUID: 2}, 7, t0)
		}, "--max-conns-per-uid"},
		{"conns total", ClientLimits{MaxConns: 2}, func(q *quotas) error {
			l := ClientLimits{MaxConns: 2}
			q.connect(l, 1, t0)
			q.connect(l, 2, t0)
			return q.connect(l, 3, t0)
		}, "--max-conns"},
		{"disconnect frees", ClientLimits{MaxConns: 1}, func(q *quotas) error {
			l := ClientLimits{MaxConns: 1}
			q.connect(l, 1, t0)
			q.disconnect(1, t0)
			return q.connect(l, 1, t0)
		}, ""},
		{"connect rate", ClientLimits{ConnectRate: 3}, func(q *quotas) error {
			l := ClientLimits{ConnectRate: 3}
			for range 3 {
				q.connect(l, 1, t0)
				q.disconnect(1, t0)
			}
			return q.connect(l, 1, t0)
		}, "--max-connect-rate"},
		{"sessions per uid", ClientLimits{MaxSessionsPerUID: 1}, func(q *quotas) error {
			l := ClientLimits{MaxSessionsPerUID: 1}
			q.openSession(l, 1)
			if err := q.openSession(l, 2); err != nil {
				return err
			}
			return q.openSession(l, 1)
		}, "--max-sessions-per-uid"},
		{"closed session frees", ClientLimits{MaxSessionsPerUID: 1}, func(q *quotas) error {
			l := ClientLimits{MaxSessionsPerUID: 1}
			q.openSession(l, 1)
			q.closeSession(1)
			return q.openSession(l, 1)
		}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var q quotas
			err := tc.steps(&q)
			if tc.wantSub == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantSub) {
				t.Fatalf("err = %v, want %q", err, tc.wantSub)
			}
		})
	}
	t.Run("idle uids are forgotten", func(t *testing.T) {
		var q quotas
		l := ClientLimits{ConnectRate: 5}
		q.connect(l, 9, t0)
		q.disconnect(9, t0.Add(time.Minute))
		if len(q.uids) != 0 {
			t.Fatalf("%d uids kept", len(q.uids))
		}
	})
}
