package server

import (
	"fmt"
	"sync"
	"time"

	"github.com/strap-llm/strap/internal/control"
)

// ClientLimits bound what one client (connection) or one user (uid) may take, so a buggy
// or hostile client cannot starve the others. Zero fields take DefaultConfig's values; a
// negative value switches that limit off.
type ClientLimits struct {
	// MaxConns is the most connections open at once, all users together.
	MaxConns int
	// MaxConnsPerUID is the most connections one uid may hold open.
	MaxConnsPerUID int
	// MaxSessionsPerUID is the most sessions one uid may hold open (MaxSessions bounds
	// all users together).
	MaxSessionsPerUID int
	// ConnectRate is the new connections per second one uid may open (burst: the same
	// number).
	ConnectRate float64
	// RequestRate is the control messages per second one connection may send (burst: the
	// same number); PUBLISH counts, so it must exceed a fast client's records per second.
	RequestRate float64
}

// bucket is a token bucket: rate tokens per second, at most burst stored.
type bucket struct {
	rate, burst, tokens float64
	last                time.Time
}

func newBucket(rate float64, now time.Time) *bucket {
	return &bucket{rate: rate, burst: rate, tokens: rate, last: now}
}

// take spends one token if there is one.
func (b *bucket) take(now time.Time) bool {
	if b == nil {
		return true
	}
	b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// full reports whether the bucket has refilled to its burst by now (forgetting it then
// loses nothing).
func (b *bucket) full(now time.Time) bool {
	return b.tokens+now.Sub(b.last).Seconds()*b.rate >= b.burst
}

// uidUsage is what one uid holds.
type uidUsage struct {
	conns, sessions int
	connect         *bucket
}

// quotas tracks per-uid usage; the zero value is ready.
type quotas struct {
	mu    sync.Mutex
	conns int
	uids  map[uint32]*uidUsage
}

func (q *quotas) get(uid uint32) *uidUsage {
	if q.uids == nil {
		q.uids = map[uint32]*uidUsage{}
	}
	u := q.uids[uid]
	if u == nil {
		u = &uidUsage{}
		q.uids[uid] = u
	}
	return u
}

// forget drops a uid's entry once it holds nothing and its connect bucket is full again.
func (q *quotas) forget(uid uint32, u *uidUsage, now time.Time) {
	if u.conns == 0 && u.sessions == 0 && (u.connect == nil || u.connect.full(now)) {
		delete(q.uids, uid)
	}
}

// connect counts a new connection of uid, or says which limit it exceeds.
func (q *quotas) connect(l ClientLimits, uid uint32, now time.Time) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	u := q.get(uid)
	if l.ConnectRate > 0 {
		if u.connect == nil {
			u.connect = newBucket(l.ConnectRate, now)
		}
		if !u.connect.take(now) {
			return fmt.Errorf("uid %d opens more than %g connections per second (--max-connect-rate)", uid, l.ConnectRate)
		}
	}
	if l.MaxConns > 0 && q.conns >= l.MaxConns {
		return fmt.Errorf("%d connections already open (--max-conns)", q.conns)
	}
	if l.MaxConnsPerUID > 0 && u.conns >= l.MaxConnsPerUID {
		return fmt.Errorf("uid %d already holds %d connections (--max-conns-per-uid)", uid, u.conns)
	}
	q.conns++
	u.conns++
	return nil
}

func (q *quotas) disconnect(uid uint32, now time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	u := q.get(uid)
	q.conns--
	u.conns--
	q.forget(uid, u, now)
}

// openSession counts a session of uid against MaxSessionsPerUID.
func (q *quotas) openSession(l ClientLimits, uid uint32) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	u := q.get(uid)
	if l.MaxSessionsPerUID > 0 && u.sessions >= l.MaxSessionsPerUID {
		return fmt.Errorf("uid %d already holds %d sessions (--max-sessions-per-uid)", uid, u.sessions)
	}
	u.sessions++
	return nil
}

func (q *quotas) closeSession(uid uint32) {
	q.mu.Lock()
	defer q.mu.Unlock()
	u := q.get(uid)
	u.sessions--
	q.forget(uid, u, time.Now())
}

// requestLimiter rate-limits one connection's control messages.
type requestLimiter struct {
	b    *bucket
	rate float64
}

func newRequestLimiter(rate float64) *requestLimiter {
	if rate <= 0 {
		return &requestLimiter{}
	}
	return &requestLimiter{b: newBucket(rate, time.Now()), rate: rate}
}

// allow spends one message; the error names the limit.
func (r *requestLimiter) allow() error {
	if r.b.take(time.Now()) {
		return nil
	}
	return perr(control.CodeLimit, "more than %g control messages per second on one connection (--max-request-rate)", r.rate)
}
