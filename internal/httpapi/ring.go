package httpapi

import (
	"sync"

	"github.com/strap-llm/strap/internal/trace"
)

// SnapshotRing keeps the most recent kernel snapshots for /api/v1/trace. The probe ticker
// adds each snapshot it takes; the API reads copies.
type SnapshotRing struct {
	mu   sync.Mutex
	buf  []trace.Snapshot
	next int
	full bool
}

// NewSnapshotRing keeps the last size snapshots (at least 1).
func NewSnapshotRing(size int) *SnapshotRing {
	return &SnapshotRing{buf: make([]trace.Snapshot, max(size, 1))}
}

// Add stores s, evicting the oldest when full.
func (r *SnapshotRing) Add(s trace.Snapshot) {
	r.mu.Lock()
	r.buf[r.next] = s
	r.next = (r.next + 1) % len(r.buf)
	r.full = r.full || r.next == 0
	r.mu.Unlock()
}

// Snapshots returns up to n of the most recent snapshots, oldest first. ok is always true:
// a ring exists only when the daemon runs probes.
func (r *SnapshotRing) Snapshots(n int) ([]trace.Snapshot, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	have := r.next
	if r.full {
		have = len(r.buf)
	}
	n = min(n, have)
	out := make([]trace.Snapshot, 0, n)
	for i := n; i > 0; i-- {
		out = append(out, r.buf[(r.next-i+len(r.buf))%len(r.buf)])
	}
	return out, true
}
