package server

import (
	"strings"
	"testing"
	"time"
)

func TestBucket(t *testing.T) {
	t0 := time.Unix(1000, 0)
	for _, tc := range []struct {
		name  string
		rate  float64
		burst int
		every time.Duration // a token comes back after this long
	}{
		{"10 per second", 10, 10, 100 * time.Millisecond},
		{"below one per second", 0.5, 1, 2 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBucket(tc.rate)
			// rate.Limiter starts full at its first use, whenever that is.
			for i := range tc.burst {
				if !b.AllowN(t0, 1) {
					t.Fatalf("burst token %d refused", i)
				}
			}
			if b.AllowN(t0, 1) {
				t.Fatalf("token %d in the same instant allowed", tc.burst+1)
			}
			if b.AllowN(t0.Add(tc.every/2), 1) {
				t.Fatalf("token after %v at %g/s", tc.every/2, tc.rate)
			}
			if !b.AllowN(t0.Add(tc.every), 1) {
				t.Fatalf("no token after %v at %g/s", tc.every, tc.rate)
			}
			if bucketFull(b, t0.Add(tc.every*3/2)) {
				t.Fatalf("full after %v", tc.every*3/2)
			}
			if !bucketFull(b, t0.Add(time.Duration(tc.burst+1)*tc.every)) {
				t.Fatal("not full after a whole refill")
			}
		})
	}
	if err := newRequestLimiter(0).allow(); err != nil {
		t.Fatalf("rate 0 (no limit) refused: %v", err)
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
