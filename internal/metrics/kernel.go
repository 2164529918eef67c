package metrics

import (
	"math"
	"sort"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/strap-llm/strap/internal/trace"
)

// maxSlot is the last log2 latency slot given its own bucket: slot s holds latencies up to
// 2^s - 1 µs, so slot 26 ends near 67 s; slower requests land in +Inf.
const maxSlot = 26

// kernelState is the snapshots' interval deltas folded into cumulative values (a snapshot
// is taken every --trace-interval by the probe ticker; Prometheus wants counters).
type kernelState struct {
	seen     bool
	lastTS   float64
	interval float64

	lat      map[string]*devLatency // by device name
	inflight map[string]int64       // every device seen in any block series: 0 while idle
	ios      map[[2]string]uint64   // (device, op)
	ioBytes  map[[2]string]uint64

	offCPU   map[[2]string]uint64 // (process class, reason) -> ns
	faults   map[string]uint64
	major    map[string]uint64
	sysCount map[[2]string]uint64 // (process class, syscall)
	sysBytes map[[2]string]uint64
	openFail map[string]uint64
	nvidia   map[string]uint64
	csw      map[[2]string]uint64 // (process class, voluntary|involuntary)
	migr     map[string]uint64
	psi      map[[2]string]trace.PSIValues // (resource, some|full), latest

	latency latencyState // per-syscall, waits, run queue, nvidia ioctls, TCP, RSS
}

type devLatency struct {
	slots [maxSlot + 2]uint64 // [0..maxSlot] plus one for slower
	count uint64
	sumS  float64
}

func (k *kernelState) init() {
	k.lat = map[string]*devLatency{}
	k.inflight = map[string]int64{}
	k.ios = map[[2]string]uint64{}
	k.ioBytes = map[[2]string]uint64{}
	k.offCPU = map[[2]string]uint64{}
	k.faults = map[string]uint64{}
	k.major = map[string]uint64{}
	k.sysCount = map[[2]string]uint64{}
	k.sysBytes = map[[2]string]uint64{}
	k.openFail = map[string]uint64{}
	k.nvidia = map[string]uint64{}
	k.csw = map[[2]string]uint64{}
	k.migr = map[string]uint64{}
	k.psi = map[[2]string]trace.PSIValues{}
	k.latency.init()
}

// ObserveSnapshot folds one kernel snapshot into the cumulative kernel series. Call it
// with every snapshot the probe ticker takes, once each: the snapshot's counters are
// deltas over its interval.
func (m *Metrics) ObserveSnapshot(s trace.Snapshot) {
	if m == nil {
		return
	}
	self := strconv.Itoa(m.opts.SelfPID)
	class := func(pid string) string {
		if pid == self {
			return classDaemon
		}
		return classClients
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	k := &m.kernel
	k.seen = true
	k.lastTS = s.Timestamp
	k.interval = s.IntervalS
	for _, h := range s.LatencyHistogram {
		d := k.lat[h.DeviceName]
		if d == nil {
			d = &devLatency{}
			k.lat[h.DeviceName] = d
		}
		for _, b := range h.Buckets {
			slot := min(max(b.Slot, 0), maxSlot+1)
			d.slots[slot] += b.Count
			d.count += b.Count
			// The probes keep log2 buckets, not sums: each request counts at its bucket's
			// midpoint, so _sum / _count is an estimate within a factor of 1.5.
			d.sumS += float64(b.Count) * (float64(b.BucketLow) + float64(b.BucketHigh)) / 2 / 1e6
		}
	}
	// A gauge of every disk seen so far: a snapshot lists only disks with requests in
	// flight or completed, and an idle disk's in-flight count is 0, not unknown.
	for dev := range k.inflight {
		k.inflight[dev] = 0
	}
	for _, h := range s.LatencyHistogram {
		k.inflight[h.DeviceName] = 0
	}
	for _, io := range s.BlockIO {
		k.inflight[io.DeviceName] = 0
	}
	for _, c := range s.Inflight {
		k.inflight[c.DeviceName] = c.Count
	}
	for _, io := range s.BlockIO {
		for _, x := range []struct {
			op       string
			n, bytes uint64
		}{{"read", io.ReadIOs, io.ReadBytes}, {"write", io.WriteIOs, io.WriteBytes}, {"other", io.OtherIOs, io.OtherBytes}} {
			k.ios[[2]string{io.DeviceName, x.op}] += x.n
			k.ioBytes[[2]string{io.DeviceName, x.op}] += x.bytes
		}
	}
	for pid, o := range s.OffCPU {
		c := class(pid)
		k.offCPU[[2]string{c, "runnable"}] += o.RunnableNs
		k.offCPU[[2]string{c, "sleep"}] += o.SleepNs
		k.offCPU[[2]string{c, "io"}] += o.IONs
	}
	for pid, n := range s.PageFaults {
		k.faults[class(pid)] += n
	}
	for pid, d := range s.PageFaultsDetail {
		k.major[class(pid)] += d.Major
	}
	for pid, sc := range s.Syscalls {
		c := class(pid)
		k.sysCount[[2]string{c, "mmap"}] += sc.MmapCount
		k.sysCount[[2]string{c, "mlock"}] += sc.MlockCount
		k.sysCount[[2]string{c, "munlock"}] += sc.MunlockCount
		k.sysCount[[2]string{c, "openat"}] += sc.OpenatCount
		k.sysBytes[[2]string{c, "mmap"}] += sc.MmapBytes
		k.sysBytes[[2]string{c, "mlock"}] += sc.MlockBytes
		k.sysBytes[[2]string{c, "munlock"}] += sc.MunlockBytes
		k.openFail[c] += sc.OpenatFailed
		k.nvidia[c] += sc.NvidiaOpens
	}
	for pid, sc := range s.Sched {
		c := class(pid)
		k.csw[[2]string{c, "voluntary"}] += sc.Voluntary
		k.csw[[2]string{c, "involuntary"}] += sc.Involuntary
		k.migr[c] += sc.Migrations
	}
	k.latency.observe(&s, class)
	k.zeroRunning(s.Collectors)
	for res, r := range s.Pressure {
		if r.Some != nil {
			k.psi[[2]string{res, "some"}] = *r.Some
		}
		if r.Full != nil {
			k.psi[[2]string{res, "full"}] = *r.Full
		}
	}
}

// zeroRunning makes sure each series keyed by process class (and a fixed second label)
// exists for both classes once its collector runs: "no clients' TCP bytes" is a 0, and a
// dashboard panel or alert reading it should see that 0, not "No data". A collector that
// is off gets no series (its numbers were never measured; strapd_probe_collector_up says
// so).
func (k *kernelState) zeroRunning(collectors map[string]string) {
	on := func(c string) bool { s, ok := collectors[c]; return ok && s != trace.SourceOff }
	for _, c := range []string{classDaemon, classClients} {
		if on(trace.CollectorOffCPU) {
			for _, r := range []string{"runnable", "sleep", "io"} {
				k.offCPU[[2]string{c, r}] += 0
			}
		}
		if on(trace.CollectorPageFaults) {
			k.faults[c] += 0
			k.major[c] += 0
		}
		if on(trace.CollectorSyscalls) {
			for _, sc := range []string{"mmap", "mlock", "munlock", "openat"} {
				k.sysCount[[2]string{c, sc}] += 0
			}
			for _, sc := range []string{"mmap", "mlock", "munlock"} {
				k.sysBytes[[2]string{c, sc}] += 0
			}
			k.openFail[c] += 0
			k.nvidia[c] += 0
		}
		if on(trace.CollectorSched) {
			k.csw[[2]string{c, "voluntary"}] += 0
			k.csw[[2]string{c, "involuntary"}] += 0
			k.migr[c] += 0
		}
		k.latency.zero(c, on)
	}
}

// kernelCollector exposes kernelState. Before the first snapshot it exposes nothing: no
// zeros that were never measured.
type kernelCollector struct{ m *Metrics }

func (kernelCollector) Describe(chan<- *prometheus.Desc) {}

var (
	descLastSnap = prometheus.NewDesc("strapd_probe_last_snapshot_timestamp_seconds", "Unix time of the end of the last kernel snapshot.", nil, nil)
	descSnapInt  = prometheus.NewDesc("strapd_probe_snapshot_interval_seconds", "Length of the last kernel snapshot's interval.", nil, nil)
	descBlockLat = prometheus.NewDesc("strapd_block_io_latency_seconds", "Block request issue-to-complete latency per disk, from the probes' log2 buckets (_sum estimated from bucket midpoints).", []string{"device"}, nil)
	descInflight = prometheus.NewDesc("strapd_block_io_inflight", "Block requests issued and not completed, per disk, at the last snapshot.", []string{"device"}, nil)
	descIOs      = prometheus.NewDesc("strapd_block_io_requests_total", "Completed block requests per disk and direction.", []string{"device", "op"}, nil)
	descIOBytes  = prometheus.NewDesc("strapd_block_io_bytes_total", "Bytes of completed block requests per disk and direction.", []string{"device", "op"}, nil)
	descOffCPU   = prometheus.NewDesc("strapd_offcpu_seconds_total", "Time watched threads spent off CPU: runnable (waiting for a CPU), sleep (interruptible) or io (uninterruptible).", []string{"process", "reason"}, nil)
	descFaults   = prometheus.NewDesc("strapd_page_faults_total", "User page faults of watched processes.", []string{"process"}, nil)
	descMajor    = prometheus.NewDesc("strapd_page_faults_major_total", "Major page faults of watched processes (from /proc).", []string{"process"}, nil)
	descSys      = prometheus.NewDesc("strapd_syscalls_total", "Model-loading syscalls of watched processes: mmap, mlock, munlock, openat.", []string{"process", "syscall"}, nil)
	descSysBytes = prometheus.NewDesc("strapd_syscall_bytes_total", "Length arguments of successful mmap, mlock and munlock calls.", []string{"process", "syscall"}, nil)
	descOpenFail = prometheus.NewDesc("strapd_openat_failed_total", "openat calls of watched processes that returned an error.", []string{"process"}, nil)
	descNvidia   = prometheus.NewDesc("strapd_nvidia_opens_total", "openat calls of nvidia-named paths by watched processes.", []string{"process"}, nil)
	descCSW      = prometheus.NewDesc("strapd_context_switches_total", "Context switches of watched processes: voluntary (blocked) or involuntary (preempted).", []string{"process", "kind"}, nil)
	descMigr     = prometheus.NewDesc("strapd_cpu_migrations_total", "CPU migrations of watched threads (bpf only).", []string{"process"}, nil)
	descPSIAvg10 = prometheus.NewDesc("strapd_pressure_avg10_ratio", "PSI: share of the last 10 s some (or all) tasks stalled on the resource.", []string{"resource", "kind"}, nil)
	descPSITotal = prometheus.NewDesc("strapd_pressure_stall_seconds_total", "PSI: cumulative stall time on the resource.", []string{"resource", "kind"}, nil)
)

func (c kernelCollector) Collect(ch chan<- prometheus.Metric) {
	m := c.m
	m.mu.Lock()
	defer m.mu.Unlock()
	k := &m.kernel
	if !k.seen {
		return
	}
	gauge := func(desc *prometheus.Desc, v float64, lv ...string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, v, lv...)
	}
	counter := func(desc *prometheus.Desc, v float64, lv ...string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, v, lv...)
	}
	gauge(descLastSnap, k.lastTS)
	gauge(descSnapInt, k.interval)
	for _, dev := range sortedKeys(k.lat) {
		d := k.lat[dev]
		buckets := map[float64]uint64{}
		var cum uint64
		for s := 0; s <= maxSlot; s++ {
			cum += d.slots[s]
			// Slot s holds latencies <= 2^s - 1 µs, so every one is below 2^s µs.
			buckets[math.Ldexp(1, s)/1e6] = cum
		}
		ch <- prometheus.MustNewConstHistogram(descBlockLat, d.count, d.sumS, buckets, dev)
	}
	for _, dev := range sortedKeys(k.inflight) {
		gauge(descInflight, float64(k.inflight[dev]), dev)
	}
	for key, n := range k.ios {
		counter(descIOs, float64(n), key[0], key[1])
	}
	for key, n := range k.ioBytes {
		counter(descIOBytes, float64(n), key[0], key[1])
	}
	for key, ns := range k.offCPU {
		counter(descOffCPU, float64(ns)/1e9, key[0], key[1])
	}
	for c, n := range k.faults {
		counter(descFaults, float64(n), c)
	}
	for c, n := range k.major {
		counter(descMajor, float64(n), c)
	}
	for key, n := range k.sysCount {
		counter(descSys, float64(n), key[0], key[1])
	}
	for key, n := range k.sysBytes {
		counter(descSysBytes, float64(n), key[0], key[1])
	}
	for c, n := range k.openFail {
		counter(descOpenFail, float64(n), c)
	}
	for c, n := range k.nvidia {
		counter(descNvidia, float64(n), c)
	}
	for key, n := range k.csw {
		counter(descCSW, float64(n), key[0], key[1])
	}
	for c, n := range k.migr {
		counter(descMigr, float64(n), c)
	}
	for key, v := range k.psi {
		gauge(descPSIAvg10, v.Avg10/100, key[0], key[1])
		counter(descPSITotal, float64(v.Total)/1e6, key[0], key[1])
	}
	k.latency.collect(ch)
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
