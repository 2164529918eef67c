package metrics

import (
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/strap-llm/strap/internal/control"
)

// PoolStats are the compression pool's numbers at one instant.
type PoolStats struct {
	// Workers is the pool's size.
	Workers int
	// Busy is the workers running a job now.
	Busy int
	// Queued is the jobs waiting for a worker.
	Queued int
	// BusySeconds is each worker's cumulative time spent in jobs, by worker index.
	BusySeconds []float64
	// Idle: the workers run under SCHED_IDLE; Rescued counts the jobs a normal-priority
	// thread ran because they were starved.
	Idle    bool
	Rescued uint64
}

// Options are what Metrics reads at each scrape.
type Options struct {
	// Status returns the daemon's whole status: every session, unfiltered.
	Status func() control.StatusReply
	// Pool returns the compression pool's numbers; nil: no worker series.
	Pool func() PoolStats
	// Detail adds per-session series labelled with session id, uid and pid
	// (serve --http-metrics-detail); off, nothing in /metrics names a user.
	Detail bool
	// Codecs are exported at zero from the start, so a codec's first drops are an
	// increase Prometheus sees (a counter born non-zero reads as no increase).
	Codecs []string
	// SelfPID is strapd's tgid, counted as process="strapd" in the per-process kernel
	// series; every other watched tgid is process="clients". 0: os.Getpid().
	SelfPID int
}

// Process classes of the per-process kernel series. Two values only: a label per pid
// would grow without bound as clients come and go.
const (
	classDaemon  = "strapd"
	classClients = "clients"
)

// latencyBuckets spans 50 µs to ~26 s: a page-cache write is tens of µs, an fdatasync
// behind a backlog of dirty pages on a slow disk seconds.
var latencyBuckets = prometheus.ExponentialBuckets(50e-6, 2, 20)

// Metrics is strapd's Prometheus registry with the collectors of this package. Its
// Observe methods are safe for concurrent use and do nothing on a nil *Metrics, so
// callers hold one without checking whether --http is on.
type Metrics struct {
	opts Options
	reg  *prometheus.Registry

	write, sync, checkpoint, token prometheus.Histogram

	mu        sync.Mutex
	ended     map[string]*counts // totals of ended sessions, by codec
	live      map[uint64]*liveSession
	endedIDs  map[uint64]bool // sessions whose totals are in ended: a late scrape must not count them again
	endedFIFO []uint64
	lastToken map[uint64]time.Time

	resources           map[resourceKey]*resourceSums // resource-event aggregates since start
	resourcesUnreadable uint64

	kernel kernelState
}

// maxEndedIDs bounds the memory of ended session ids; ids grow monotonically, so only the
// most recent can race a scrape.
const maxEndedIDs = 4096

type counts struct {
	bytesIn, bytesOut, packets, drops, tokens, checkpoints uint64
}

func (c *counts) add(o counts) {
	c.bytesIn += o.bytesIn
	c.bytesOut += o.bytesOut
	c.packets += o.packets
	c.drops += o.drops
	c.tokens += o.tokens
	c.checkpoints += o.checkpoints
}

// raise keeps the larger of each field: a session's counters only grow, and a status
// taken before a later one may arrive after it.
func (c *counts) raise(o counts) {
	c.bytesIn = max(c.bytesIn, o.bytesIn)
	c.bytesOut = max(c.bytesOut, o.bytesOut)
	c.packets = max(c.packets, o.packets)
	c.drops = max(c.drops, o.drops)
	c.tokens = max(c.tokens, o.tokens)
	c.checkpoints = max(c.checkpoints, o.checkpoints)
}

type liveSession struct {
	codec string
	counts
}

func countsOf(s control.SessionStatus) counts {
	return counts{bytesIn: s.BytesIn, bytesOut: s.BytesOut, packets: s.Packets, drops: s.Drops,
		tokens: s.Tokens, checkpoints: s.Checkpoints}
}

// New builds the registry: this package's collectors plus the Go runtime's and the
// process's (process_cpu_seconds_total, process_resident_memory_bytes).
func New(o Options) *Metrics {
	if o.SelfPID == 0 {
		o.SelfPID = os.Getpid()
	}
	m := &Metrics{opts: o, reg: prometheus.NewRegistry(), ended: map[string]*counts{},
		live: map[uint64]*liveSession{}, endedIDs: map[uint64]bool{}, lastToken: map[uint64]time.Time{}}
	m.kernel.init()
	for _, c := range o.Codecs {
		m.totals(c)
	}
	h := func(name, help string) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: latencyBuckets})
	}
	m.write = h("strapd_write_seconds", "Time to write one packet to its stream file (writev calls, page cache included).")
	m.sync = h("strapd_fdatasync_seconds", "Time of each fdatasync of a stream file (checkpoints and close).")
	m.checkpoint = h("strapd_checkpoint_seconds", "Time from a CHECKPOINT request to the durable checkpoint it answers.")
	m.token = h("strapd_token_interval_seconds", "Time between consecutive TOKEN records of one session: the generation latency per token as the capture sees it.")
	m.reg.MustRegister(m.write, m.sync, m.checkpoint, m.token,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		captureCollector{m}, kernelCollector{m})
	return m
}

// Handler serves the registry in the Prometheus exposition format. A collector that fails
// is reported in the scrape and the others still served.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError, MaxRequestsInFlight: 8})
}

// Registry is the underlying registry (tests gather from it directly).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// ObserveWrite records the time one packet took to reach the file.
func (m *Metrics) ObserveWrite(d time.Duration) {
	if m != nil {
		m.write.Observe(d.Seconds())
	}
}

// ObserveSync records one fdatasync.
func (m *Metrics) ObserveSync(d time.Duration) {
	if m != nil {
		m.sync.Observe(d.Seconds())
	}
}

// ObserveCheckpoint records one durable checkpoint's latency.
func (m *Metrics) ObserveCheckpoint(d time.Duration) {
	if m != nil {
		m.checkpoint.Observe(d.Seconds())
	}
}

// ObserveToken records a TOKEN of session arriving at at; from the second one on, the
// interval since the previous one is observed.
func (m *Metrics) ObserveToken(session uint64, at time.Time) {
	if m == nil {
		return
	}
	m.mu.Lock()
	prev, ok := m.lastToken[session]
	m.lastToken[session] = at
	m.mu.Unlock()
	if ok && at.After(prev) {
		m.token.Observe(at.Sub(prev).Seconds())
	}
}

// SessionEnded folds a finished session's final counters into the totals, so the
// counters keep them after the session leaves the status.
func (m *Metrics) SessionEnded(final control.SessionStatus) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.lastToken, final.Session)
	if m.endedIDs[final.Session] {
		return
	}
	c := countsOf(final)
	if l := m.live[final.Session]; l != nil {
		c.raise(l.counts)
		delete(m.live, final.Session)
	}
	m.totals(final.Codec).add(c)
	m.endedIDs[final.Session] = true
	m.endedFIFO = append(m.endedFIFO, final.Session)
	if len(m.endedFIFO) > maxEndedIDs {
		delete(m.endedIDs, m.endedFIFO[0])
		m.endedFIFO = m.endedFIFO[1:]
	}
}

func (m *Metrics) totals(codec string) *counts {
	c := m.ended[codec]
	if c == nil {
		c = &counts{}
		m.ended[codec] = c
	}
	return c
}

func label(v uint64) string { return strconv.FormatUint(v, 10) }
