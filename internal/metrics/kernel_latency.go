package metrics

import (
	"math"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/strap-llm/strap/internal/trace"
)

// log2Hist is a latency distribution folded from the probes' log2 µs buckets. Its sum is
// exact when the probes timed the events (LatencyStats.TotalNs).
type log2Hist struct {
	slots [maxSlot + 2]uint64
	count uint64
	sumS  float64
}

func (h *log2Hist) addStats(l trace.LatencyStats) {
	for _, b := range l.Buckets {
		h.slots[min(max(b.Slot, 0), maxSlot+1)] += b.Count
	}
	h.count += l.Timed
	h.sumS += float64(l.TotalNs) / 1e9
}

func (h *log2Hist) metric(desc *prometheus.Desc, lv ...string) prometheus.Metric {
	buckets := map[float64]uint64{}
	var cum uint64
	for s := 0; s <= maxSlot; s++ {
		cum += h.slots[s]
		buckets[math.Ldexp(1, s)/1e6] = cum
	}
	return prometheus.MustNewConstHistogram(desc, h.count, h.sumS, buckets, lv...)
}

// latencyState holds the per-syscall, wait, run-queue, nvidia-ioctl, TCP and memory
// collectors' numbers by process class.
type latencyState struct {
	sysCalls  map[[2]string]uint64 // (class, syscall)
	sysErrors map[[2]string]uint64
	sysLat    map[string]*log2Hist // class: every timed syscall
	syncWait  map[[2]string]*log2Hist
	runq      map[string]*log2Hist
	nvIoctl   map[string]*log2Hist
	nvErrors  map[string]uint64
	tcpBytes  map[[2]string]uint64 // (class, tx|rx)
	retrans   map[string]uint64
	rss       map[string]uint64 // latest, summed over the class
}

func (l *latencyState) init() {
	l.sysCalls = map[[2]string]uint64{}
	l.sysErrors = map[[2]string]uint64{}
	l.sysLat = map[string]*log2Hist{}
	l.syncWait = map[[2]string]*log2Hist{}
	l.runq = map[string]*log2Hist{}
	l.nvIoctl = map[string]*log2Hist{}
	l.nvErrors = map[string]uint64{}
	l.tcpBytes = map[[2]string]uint64{}
	l.retrans = map[string]uint64{}
	l.rss = map[string]uint64{}
}

func hist[K comparable](m map[K]*log2Hist, k K) *log2Hist {
	h := m[k]
	if h == nil {
		h = &log2Hist{}
		m[k] = h
	}
	return h
}

func (l *latencyState) observe(s *trace.Snapshot, class func(string) string) {
	for pid, calls := range s.SyscallLatency {
		c := class(pid)
		for name, st := range calls {
			l.sysCalls[[2]string{c, name}] += st.Count
			l.sysErrors[[2]string{c, name}] += st.Errors
			hist(l.sysLat, c).addStats(st)
		}
	}
	for pid, kinds := range s.SyncWait {
		c := class(pid)
		for kind, st := range kinds {
			hist(l.syncWait, [2]string{c, kind}).addStats(st)
		}
	}
	for pid, st := range s.RunqueueLatency {
		hist(l.runq, class(pid)).addStats(st)
	}
	for pid, st := range s.NvidiaIoctl {
		c := class(pid)
		hist(l.nvIoctl, c).addStats(st)
		l.nvErrors[c] += st.Errors
	}
	for pid, t := range s.TCP {
		c := class(pid)
		l.tcpBytes[[2]string{c, "tx"}] += t.TxBytes
		l.tcpBytes[[2]string{c, "rx"}] += t.RxBytes
		l.retrans[c] += t.Retransmits
	}
	if s.Memory != nil {
		clear(l.rss)
		for pid, m := range s.Memory {
			l.rss[class(pid)] += m.RSSBytes
		}
	}
}

// zero creates class c's series of the running collectors at 0 (kernelState.zeroRunning).
func (l *latencyState) zero(c string, on func(collector string) bool) {
	if on(trace.CollectorSyscallLatency) {
		hist(l.sysLat, c)
	}
	if on(trace.CollectorRunqueue) {
		hist(l.runq, c)
	}
	if on(trace.CollectorNvidiaIoctl) {
		hist(l.nvIoctl, c)
		l.nvErrors[c] += 0
	}
	if on(trace.CollectorMemory) {
		l.rss[c] += 0
	}
	if on(trace.CollectorTCP) {
		l.tcpBytes[[2]string{c, "tx"}] += 0
		l.tcpBytes[[2]string{c, "rx"}] += 0
		l.retrans[c] += 0
	}
}

var (
	descSysCalls  = prometheus.NewDesc("strapd_syscall_calls_total", "Syscalls of watched processes by name (x86_64 names).", []string{"process", "syscall"}, nil)
	descSysErrors = prometheus.NewDesc("strapd_syscall_errors_total", "Syscalls of watched processes that returned -errno, by name.", []string{"process", "syscall"}, nil)
	descSysLat    = prometheus.NewDesc("strapd_syscall_latency_seconds", "Entry-to-exit time of every timed syscall of watched processes (read/write possibly sampled).", []string{"process"}, nil)
	descSyncWait  = prometheus.NewDesc("strapd_sync_wait_seconds", "Blocking waits of watched processes by kind (futex, epoll_wait, poll, ppoll, clock_nanosleep).", []string{"process", "kind"}, nil)
	descRunq      = prometheus.NewDesc("strapd_runqueue_latency_seconds", "How long watched threads waited for a CPU once runnable.", []string{"process"}, nil)
	descNvIoctl   = prometheus.NewDesc("strapd_nvidia_ioctl_seconds", "ioctl calls on nvidia-named files by watched processes.", []string{"process"}, nil)
	descNvErrors  = prometheus.NewDesc("strapd_nvidia_ioctl_errors_total", "nvidia ioctls that returned -errno.", []string{"process"}, nil)
	descTCPBytes  = prometheus.NewDesc("strapd_tcp_bytes_total", "Bytes watched processes moved over TCP sockets, by direction.", []string{"process", "direction"}, nil)
	descRetrans   = prometheus.NewDesc("strapd_tcp_retransmits_total", "TCP segment retransmissions on sockets watched processes moved data on.", []string{"process"}, nil)
	descRSS       = prometheus.NewDesc("strapd_watched_resident_bytes", "Resident memory of the watched processes at the last snapshot, summed per class.", []string{"process"}, nil)
)

func (l *latencyState) collect(ch chan<- prometheus.Metric) {
	for k, n := range l.sysCalls {
		ch <- prometheus.MustNewConstMetric(descSysCalls, prometheus.CounterValue, float64(n), k[0], k[1])
	}
	for k, n := range l.sysErrors {
		ch <- prometheus.MustNewConstMetric(descSysErrors, prometheus.CounterValue, float64(n), k[0], k[1])
	}
	for c, h := range l.sysLat {
		ch <- h.metric(descSysLat, c)
	}
	for k, h := range l.syncWait {
		ch <- h.metric(descSyncWait, k[0], k[1])
	}
	for c, h := range l.runq {
		ch <- h.metric(descRunq, c)
	}
	for c, h := range l.nvIoctl {
		ch <- h.metric(descNvIoctl, c)
	}
	for c, n := range l.nvErrors {
		ch <- prometheus.MustNewConstMetric(descNvErrors, prometheus.CounterValue, float64(n), c)
	}
	for k, n := range l.tcpBytes {
		ch <- prometheus.MustNewConstMetric(descTCPBytes, prometheus.CounterValue, float64(n), k[0], k[1])
	}
	for c, n := range l.retrans {
		ch <- prometheus.MustNewConstMetric(descRetrans, prometheus.CounterValue, float64(n), c)
	}
	for c, n := range l.rss {
		ch <- prometheus.MustNewConstMetric(descRSS, prometheus.GaugeValue, float64(n), c)
	}
}
