package server

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"

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
	// number, at least 1).
	ConnectRate float64
	// RequestRate is the control messages per second one connection may send (burst: the
	// same number, at least 1); PUBLISH counts, so it must exceed a fast client's records per second.
	RequestRate float64
}

// newBucket is a token bucket of rate tokens per second holding at most as many (at
// least one, so that a rate below 1/s still admits a message every 1/rate seconds), full
// at the start.
func newBucket(r float64) *rate.Limiter {
	return rate.NewLimiter(rate.Limit(r), max(1, int(r)))
}

// bucketFull reports whether b has refilled to its burst by now (forgetting it then
// loses nothing).
func bucketFull(b *rate.Limiter, now time.Time) bool {
	return b.TokensAt(now) >= float64(b.Burst())
}

// uidUsage is what one uid holds.
type uidUsage struct {
	conns, sessions int
	connect         *rate.Limiter
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
	if u.conns == 0 && u.sessions == 0 && (u.connect == nil || bucketFull(u.connect, now)) {
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
			u.connect = newBucket(l.ConnectRate)
		}
		if !u.connect.AllowN(now, 1) {
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
	b    *rate.Limiter // nil: no limit
	rate float64
}

func newRequestLimiter(r float64) *requestLimiter {
	if r <= 0 {
		return &requestLimiter{}
	}
	return &requestLimiter{b: newBucket(r), rate: r}
}

// allow spends one message; the error names the limit.
func (r *requestLimiter) allow() error {
	if r.b == nil || r.b.Allow() {
		return nil
	}
	return perr(control.CodeLimit, "more than %g control messages per second on one connection (--max-request-rate)", r.rate)
}

// Default memory budget (serve --memory-limit unset): a quarter of the memory the daemon may
// use. The budget counts the rings (the clients' own memfd pages, mapped here) and the
// compression buffers in flight; three quarters stay for the models, their data and the
// page cache the streams are written through. docs/DEPLOY.md gives the numbers.
const (
	// MemoryShareDivisor: the default budget is the usable memory divided by this.
	MemoryShareDivisor = 4
	// FallbackMemoryLimit is the default budget where the host's memory cannot be read.
	FallbackMemoryLimit = 4 << 30
	// MinDefaultMemoryLimit keeps the default budget of a very small host (or cgroup)
	// able to open one session of the smallest default ring.
	MinDefaultMemoryLimit = 64 << 20
)

// DefaultMemoryLimit is the daemon's memory budget when --memory-limit is not given: a
// quarter of MemTotal (/proc/meminfo) or of the daemon's cgroup memory.max (v2, the
// lowest along its path) when that is lower, rounded down to a MiB and at least
// MinDefaultMemoryLimit; FallbackMemoryLimit when neither can be read.
func DefaultMemoryLimit() int64 {
	return memoryLimitFor(readMemTotal("/proc/meminfo"), readCgroupMemoryMax("/proc/self/cgroup", "/sys/fs/cgroup"))
}

// memoryLimitFor is DefaultMemoryLimit's rule for memTotal and cgroupMax bytes (0: unknown).
func memoryLimitFor(memTotal, cgroupMax int64) int64 {
	usable := memTotal
	if cgroupMax > 0 && (usable <= 0 || cgroupMax < usable) {
		usable = cgroupMax
	}
	if usable <= 0 {
		return FallbackMemoryLimit
	}
	return max(usable/MemoryShareDivisor>>20<<20, MinDefaultMemoryLimit)
}

// readMemTotal is MemTotal from a /proc/meminfo file in bytes, 0 when it cannot be read.
func readMemTotal(path string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		rest, ok := strings.CutPrefix(line, "MemTotal:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || kb <= 0 || kb > 1<<53 {
			return 0
		}
		return kb << 10
	}
	return 0
}

// readCgroupMemoryMax is the lowest memory.max (cgroup v2) on the path from the process's
// cgroup (named in the selfCgroup file) up to the root under mount; 0 when there is none
// ("max" everywhere, cgroup v1, or nothing readable).
func readCgroupMemoryMax(selfCgroup, mount string) int64 {
	b, err := os.ReadFile(selfCgroup)
	if err != nil {
		return 0
	}
	var dir string
	for line := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			dir = p
		}
	}
	if dir == "" {
		return 0
	}
	var lowest int64
	for d := filepath.Clean("/" + dir); ; d = filepath.Dir(d) {
		if v, err := os.ReadFile(filepath.Join(mount, d, "memory.max")); err == nil {
			n, err := strconv.ParseInt(strings.TrimSpace(string(v)), 10, 64)
			if err == nil && n > 0 && (lowest == 0 || n < lowest) {
				lowest = n
			}
		}
		if d == "/" {
			return lowest
		}
	}
}
