package metrics

import (
	"io"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/strap-llm/strap/internal/control"
	"github.com/strap-llm/strap/internal/trace"
)

// fakeDaemon is a status whose sessions the test moves along.
type fakeDaemon struct {
	mu  sync.Mutex
	rep control.StatusReply
}

func (f *fakeDaemon) status() control.StatusReply {
	f.mu.Lock()
	defer f.mu.Unlock()
	rep := f.rep
	rep.Sessions = append([]control.SessionStatus(nil), f.rep.Sessions...)
	return rep
}

func (f *fakeDaemon) set(sessions ...control.SessionStatus) {
	f.mu.Lock()
	f.rep.Sessions = sessions
	f.rep.Daemon.Sessions = len(sessions)
	f.mu.Unlock()
}

// gather returns name{labels} -> value for counters and gauges, and name -> histogram.
func gather(t *testing.T, m *Metrics) (map[string]float64, map[string]*dto.Histogram) {
	t.Helper()
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	vals := map[string]float64{}
	hists := map[string]*dto.Histogram{}
	for _, f := range fams {
		for _, mt := range f.GetMetric() {
			var lv []string
			for _, l := range mt.GetLabel() {
				lv = append(lv, l.GetName()+"="+l.GetValue())
			}
			key := f.GetName()
			if len(lv) > 0 {
				key += "{" + strings.Join(lv, ",") + "}"
			}
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				vals[key] = mt.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				vals[key] = mt.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				hists[key] = mt.GetHistogram()
			}
		}
	}
	return vals, hists
}

func sess(id uint64, codec string, in, out, drops uint64, fill float64) control.SessionStatus {
	return control.SessionStatus{Session: id, PID: 4242, UID: 1000, Codec: codec, BytesIn: in, BytesOut: out,
		Packets: in / 100, Drops: drops, RingSize: 1000, RingUsed: uint64(fill * 1000), RingFill: fill}
}

// TestCaptureCountersSurviveSessionEnd: the per-codec counters add the live sessions to
// the ended ones, never go down when a session leaves the status (before or after
// SessionEnded), and count a session once.
func TestCaptureCountersSurviveSessionEnd(t *testing.T) {
	f := &fakeDaemon{}
	f.rep.Daemon = control.DaemonStatus{Version: "9.9", MemoryLimit: 1 << 30, MemoryUsed: 1 << 20}
	m := New(Options{Status: f.status, SelfPID: 1})
	f.set(sess(1, "zstd", 1000, 500, 0, 0.5), sess(2, "none", 300, 300, 2, 0.9))
	steps := []struct {
		name     string
		act      func()
		zstdIn   float64
		noneDrop float64
	}{
		{"both live", func() {}, 1000, 2},
		{"session 1 grows", func() { f.set(sess(1, "zstd", 4000, 2000, 0, 0.5), sess(2, "none", 300, 300, 2, 0.9)) }, 4000, 2},
		// Gone from the status before SessionEnded: its last seen values stay counted.
		{"session 1 leaves the status", func() { f.set(sess(2, "none", 300, 300, 2, 0.9)) }, 4000, 2},
		{"session 1 ended with more", func() { m.SessionEnded(sess(1, "zstd", 5000, 2500, 0, 0)) }, 5000, 2},
		// A status taken before the end, read after it, must not count it twice.
		{"late status", func() { f.set(sess(1, "zstd", 4500, 2200, 0, 0.5), sess(2, "none", 300, 300, 2, 0.9)) }, 5000, 2},
		{"session 2 ended", func() { f.set(); m.SessionEnded(sess(2, "none", 300, 300, 3, 0)) }, 5000, 3},
		{"new zstd session", func() { f.set(sess(3, "zstd", 10, 5, 0, 0.1)) }, 5010, 3},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			st.act()
			v, _ := gather(t, m)
			if got := v["strapd_capture_bytes_in_total{codec=zstd}"]; got != st.zstdIn {
				t.Errorf("zstd bytes in %v, want %v", got, st.zstdIn)
			}
			if got := v["strapd_capture_drops_total{codec=none}"]; got != st.noneDrop {
				t.Errorf("none drops %v, want %v", got, st.noneDrop)
			}
			if v["strapd_build_info{version=9.9}"] != 1 || v["strapd_memory_budget_bytes"] != 1<<30 {
				t.Errorf("daemon series: %v", v)
			}
			for k := range v {
				if strings.Contains(k, "uid=") || strings.Contains(k, "session=") {
					t.Errorf("per-user series %s without Detail", k)
				}
			}
		})
	}
}

func TestDetailAddsSessionSeries(t *testing.T) {
	f := &fakeDaemon{}
	m := New(Options{Status: f.status, Detail: true, Pool: func() PoolStats {
		return PoolStats{Workers: 2, Busy: 1, Queued: 3, BusySeconds: []float64{1.5, 0.25}}
	}})
	// Session 8 is rank 3 of a job of 8 processes (OPEN's metadata.distributed).
	ranked := sess(8, "none", 50, 50, 2, 0.125)
	ranked.Distributed = &control.SessionRank{Rank: 3, WorldSize: 8, Host: "node07", JobID: "j1"}
	f.set(sess(7, "lz4", 100, 80, 0, 0.25), ranked)
	v, _ := gather(t, m)
	for k, want := range map[string]float64{
		"strapd_session_ring_fill_ratio{codec=lz4,host=,pid=4242,rank=,session=7,uid=1000}":         0.25,
		"strapd_session_ring_fill_ratio{codec=none,host=node07,pid=4242,rank=3,session=8,uid=1000}": 0.125,
		"strapd_session_drops{codec=none,host=node07,pid=4242,rank=3,session=8,uid=1000}":           2,
		"strapd_session_info{job_id=,rank=,session=7,world_size=}":                                  1,
		"strapd_session_info{job_id=j1,rank=3,session=8,world_size=8}":                              1,
		"strapd_ring_fill_max_ratio":                 0.25,
		"strapd_workers_busy":                        1,
		"strapd_pool_queue_depth":                    3,
		"strapd_worker_busy_seconds_total{worker=1}": 0.25,
		"strapd_probes_enabled":                      0,
	} {
		if got, ok := v[k]; !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", k, got, ok, want)
		}
	}
	// Without Detail, neither the rank labels nor the session info exist.
	plain := New(Options{Status: f.status})
	pv, _ := gather(t, plain)
	for k := range pv {
		if strings.Contains(k, "rank=") || strings.Contains(k, "host=") || strings.HasPrefix(k, "strapd_session_") {
			t.Errorf("%s without Detail", k)
		}
	}
}

// TestSnapshotsFoldIntoCounters: interval deltas add up; the latency histogram's buckets
// are cumulative with le = 2^slot µs; per-pid maps fold into two process classes.
func TestSnapshotsFoldIntoCounters(t *testing.T) {
	m := New(Options{Status: (&fakeDaemon{}).status, SelfPID: 10})
	if v, _ := gather(t, m); v["strapd_probe_last_snapshot_timestamp_seconds"] != 0 {
		t.Fatal("kernel series before any snapshot")
	}
	snap := trace.Snapshot{Timestamp: 100, IntervalS: 1,
		LatencyHistogram: []trace.DeviceHistogram{{DeviceName: "vda", Total: 5, Buckets: []trace.Bucket{
			{Slot: 10, Count: 3, BucketLow: 512, BucketHigh: 1023}, {Slot: 12, Count: 2, BucketLow: 2048, BucketHigh: 4095}}}},
		Inflight:   []trace.DeviceCount{{DeviceName: "vda", Count: 4}},
		BlockIO:    []trace.DeviceIO{{DeviceName: "vda", WriteIOs: 5, WriteBytes: 5 << 20}},
		OffCPU:     map[string]trace.OffCPU{"10": {RunnableNs: 5e8}, "11": {IONs: 2e9}, "12": {IONs: 1e9}},
		PageFaults: map[string]uint64{"10": 1, "11": 7},
		Syscalls:   map[string]trace.Syscalls{"11": {MmapCount: 2, MmapBytes: 8192, MlockCount: 1}},
		Sched:      map[string]trace.Sched{"10": {Voluntary: 3, Involuntary: 1, Migrations: 2}},
		Pressure:   map[string]trace.PSIResource{"io": {Some: &trace.PSIValues{Avg10: 12.5, Total: 3e6}}},
		RunqueueLatency: map[string]trace.LatencyStats{"11": {Count: 4, Timed: 3, TotalNs: 6e6,
			Buckets: []trace.Bucket{{Slot: 11, Count: 3, BucketLow: 1024, BucketHigh: 2047}}}},
		SyscallLatency: map[string]map[string]trace.LatencyStats{"10": {"futex": {Count: 5, Errors: 2}}},
		TCP:            map[string]trace.TCP{"11": {TxBytes: 100, RxBytes: 7}},
		Memory:         map[string]trace.Memory{"10": {RSSBytes: 1000}, "11": {RSSBytes: 20}, "12": {RSSBytes: 3}},
	}
	m.ObserveSnapshot(snap)
	snap.Timestamp = 101
	snap.Inflight[0].Count = 1
	m.ObserveSnapshot(snap)
	v, h := gather(t, m)
	for k, want := range map[string]float64{
		"strapd_probe_last_snapshot_timestamp_seconds":                101,
		"strapd_block_io_inflight{device=vda}":                        1,
		"strapd_block_io_requests_total{device=vda,op=write}":         10,
		"strapd_offcpu_seconds_total{process=strapd,reason=runnable}": 1,
		"strapd_offcpu_seconds_total{process=clients,reason=io}":      6,
		"strapd_page_faults_total{process=clients}":                   14,
		"strapd_syscalls_total{process=clients,syscall=mlock}":        2,
		"strapd_syscall_bytes_total{process=clients,syscall=mmap}":    16384,
		"strapd_cpu_migrations_total{process=strapd}":                 4,
		"strapd_pressure_avg10_ratio{kind=some,resource=io}":          0.125,
		"strapd_pressure_stall_seconds_total{kind=some,resource=io}":  3,
		"strapd_syscall_calls_total{process=strapd,syscall=futex}":    10,
		"strapd_syscall_errors_total{process=strapd,syscall=futex}":   4,
		"strapd_tcp_bytes_total{direction=tx,process=clients}":        200,
		"strapd_watched_resident_bytes{process=clients}":              23, // a gauge: the last snapshot only
		"strapd_watched_resident_bytes{process=strapd}":               1000,
	} {
		if got, ok := v[k]; !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", k, got, ok, want)
		}
	}
	if rq := h["strapd_runqueue_latency_seconds{process=clients}"]; rq.GetSampleCount() != 6 || rq.GetSampleSum() != 0.012 {
		t.Errorf("run-queue histogram: count %d sum %v, want 6 timed and the exact 0.012 s", rq.GetSampleCount(), rq.GetSampleSum())
	}
	lat := h["strapd_block_io_latency_seconds{device=vda}"]
	if lat == nil || lat.GetSampleCount() != 10 {
		t.Fatalf("latency histogram %v", lat)
	}
	for _, b := range lat.GetBucket() {
		want := uint64(0)
		switch ub := b.GetUpperBound(); {
		case ub >= 4096e-6:
			want = 10
		case ub >= 1024e-6:
			want = 6
		}
		if b.GetCumulativeCount() != want {
			t.Errorf("bucket le=%g: %d, want %d", b.GetUpperBound(), b.GetCumulativeCount(), want)
		}
	}
}

// TestKernelZerosWhileIdle: a disk seen once keeps its in-flight gauge, at 0, in the
// snapshots that no longer list it (idle); the per-class series of a running collector
// exist for both classes at 0 from the first snapshot; a collector that is off gets none.
func TestKernelZerosWhileIdle(t *testing.T) {
	m := New(Options{Status: (&fakeDaemon{}).status, SelfPID: 10})
	m.ObserveSnapshot(trace.Snapshot{Timestamp: 100, IntervalS: 1,
		Inflight:   []trace.DeviceCount{{DeviceName: "vda", Count: 2}},
		Collectors: map[string]string{trace.CollectorTCP: trace.SourceBPF, trace.CollectorNvidiaIoctl: trace.SourceBPF, trace.CollectorSched: trace.SourceOff}})
	m.ObserveSnapshot(trace.Snapshot{Timestamp: 101, IntervalS: 1,
		Collectors: map[string]string{trace.CollectorTCP: trace.SourceBPF, trace.CollectorNvidiaIoctl: trace.SourceBPF, trace.CollectorSched: trace.SourceOff,
			trace.CollectorMemory: trace.SourceProc},
		Memory: map[string]trace.Memory{"10": {RSSBytes: 1000}}})
	v, h := gather(t, m)
	if got := v["strapd_watched_resident_bytes{process=strapd}"]; got != 1000 {
		t.Errorf("strapd's resident bytes %v, want 1000", got)
	}
	for _, k := range []string{
		"strapd_block_io_inflight{device=vda}",
		"strapd_tcp_bytes_total{direction=rx,process=clients}", "strapd_tcp_bytes_total{direction=tx,process=strapd}",
		"strapd_tcp_retransmits_total{process=clients}", "strapd_nvidia_ioctl_errors_total{process=strapd}",
		"strapd_watched_resident_bytes{process=clients}",
	} {
		if got, ok := v[k]; !ok || got != 0 {
			t.Errorf("%s = %v (present %v), want 0", k, got, ok)
		}
	}
	if nv := h["strapd_nvidia_ioctl_seconds{process=clients}"]; nv == nil || nv.GetSampleCount() != 0 {
		t.Errorf("nvidia ioctl histogram of clients: %v, want present and empty", nv)
	}
	for k := range v {
		if strings.HasPrefix(k, "strapd_context_switches_total") || strings.HasPrefix(k, "strapd_cpu_migrations_total") {
			t.Errorf("%s exported while its collector is off", k)
		}
	}
}

func TestLatencyObserversAndNil(t *testing.T) {
	var nilM *Metrics
	nilM.ObserveWrite(time.Millisecond) // a daemon without --http holds a nil *Metrics
	nilM.ObserveSnapshot(trace.Snapshot{})
	nilM.SessionEnded(control.SessionStatus{})
	m := New(Options{Status: (&fakeDaemon{}).status})
	m.ObserveSync(3 * time.Millisecond)
	t0 := time.Now()
	for i := range 4 {
		m.ObserveToken(1, t0.Add(time.Duration(i)*20*time.Millisecond))
	}
	_, h := gather(t, m)
	if h["strapd_fdatasync_seconds"].GetSampleCount() != 1 || h["strapd_token_interval_seconds"].GetSampleCount() != 3 {
		t.Fatalf("histograms: sync %v token %v", h["strapd_fdatasync_seconds"], h["strapd_token_interval_seconds"])
	}
	if s := h["strapd_token_interval_seconds"].GetSampleSum(); s < 0.0599 || s > 0.0601 {
		t.Fatalf("token interval sum %v, want 0.06", s)
	}
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	if rec.Code != 200 || !strings.Contains(string(body), "process_resident_memory_bytes") {
		t.Fatalf("exposition %d:\n%.500s", rec.Code, body)
	}
}

// TestEverySeriesDocumented: each strapd_* family the package can expose (every source
// fed, detail on, object storage configured) is named in docs/HTTP_API.md, and the doc names no family that does
// not exist.
func TestEverySeriesDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/HTTP_API.md")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeDaemon{}
	f.rep.Daemon.Probes = &control.ProbesStatus{Enabled: true,
		Collectors: []control.ProbeCollector{{Name: "block_io", Source: "bpf"}},
		BPFStats:   []control.ProbeProgStats{{Program: "block_rq_issue", TotalEvents: 1}}, Drops: map[string]uint64{"ringbuf": 0}}
	f.rep.Daemon.Upload = &control.UploadDaemonStatus{Target: "s3://caps/run"}
	m := New(Options{Status: f.status, Detail: true, Codecs: []string{"none"},
		Pool: func() PoolStats { return PoolStats{Workers: 1, BusySeconds: []float64{0}} }})
	f.set(sess(1, "none", 1, 1, 0, 0))
	m.ObserveSnapshot(trace.Snapshot{
		LatencyHistogram: []trace.DeviceHistogram{{DeviceName: "vda", Buckets: []trace.Bucket{{Slot: 1, Count: 1}}}},
		Inflight:         []trace.DeviceCount{{DeviceName: "vda"}}, BlockIO: []trace.DeviceIO{{DeviceName: "vda"}},
		OffCPU: map[string]trace.OffCPU{"1": {}}, PageFaults: map[string]uint64{"1": 0},
		PageFaultsDetail: map[string]trace.PageFaults{"1": {}}, Syscalls: map[string]trace.Syscalls{"1": {}},
		Sched: map[string]trace.Sched{"1": {}}, Pressure: map[string]trace.PSIResource{"io": {Some: &trace.PSIValues{}}},
		SyscallLatency:  map[string]map[string]trace.LatencyStats{"1": {"read": {}}},
		SyncWait:        map[string]map[string]trace.LatencyStats{"1": {"futex": {}}},
		RunqueueLatency: map[string]trace.LatencyStats{"1": {}}, NvidiaIoctl: map[string]trace.LatencyStats{"1": {}},
		TCP: map[string]trace.TCP{"1": {}}, Memory: map[string]trace.Memory{"1": {}}})
	m.ObserveResources([]byte(`{"event":"compute_execution","component_type":"mlp","duration_us":1,"flops":2}` + "\n"))
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	exposed := map[string]bool{}
	for _, fam := range fams {
		if name := fam.GetName(); strings.HasPrefix(name, "strapd_") {
			exposed[name] = true
			if !strings.Contains(string(doc), "`"+name+"`") {
				t.Errorf("%s is exposed but not in docs/HTTP_API.md", name)
			}
		}
	}
	for _, name := range regexp.MustCompile("`(strapd_[a-z0-9_]+)`").FindAllStringSubmatch(string(doc), -1) {
		if !exposed[name[1]] {
			t.Errorf("docs/HTTP_API.md names %s, which is not exposed", name[1])
		}
	}
}

// The upload series come from STATUS: totals from daemon.upload, lag and counts from the
// uploads not yet complete; without object storage there are none.
func TestUploadSeries(t *testing.T) {
	f := &fakeDaemon{}
	m := New(Options{Status: f.status, SelfPID: 1})
	v, _ := gather(t, m)
	if _, ok := v["strapd_upload_bytes_total"]; ok {
		t.Fatal("upload series without object storage")
	}
	f.rep.Daemon.Upload = &control.UploadDaemonStatus{Target: "s3://caps/run", UploadedBytes: 5 << 20, Errors: 3, RecreatedBytes: 32 << 20}
	f.rep.Uploads = []control.UploadStatus{
		{Object: "s3://caps/run/a.strap", State: "uploading", LagBytes: 100},
		{Object: "s3://caps/run/b.strap", State: "retrying", LagBytes: 50, Errors: 3},
		{Object: "s3://caps/run/c.strap", State: "complete", LagBytes: 0},
		{Object: "s3://caps/run/d.strap", State: "uploading", LagBytes: 10, FreedBytes: 1 << 20},
		{Object: "s3://caps/run/e.strap", State: "waiting", FreedBytes: 2 << 20},
		{Object: "s3://caps/run/f.strap", State: "lost", FreedBytes: 4 << 20, Lost: "[4096, 4198400)"},
		// A hung server: failing like a retry; a key of another capture's: not in progress.
		{Object: "s3://caps/run/g.strap", State: "stalled", LagBytes: 7, Errors: 1},
		{Object: "s3://caps/run/h.strap", State: "refused", LagBytes: 1000, Errors: 1},
	}
	v, _ = gather(t, m)
	for k, want := range map[string]float64{
		"strapd_upload_bytes_total": 5 << 20, "strapd_upload_errors_total": 3, "strapd_upload_lag_bytes": 167,
		"strapd_uploads_in_progress": 5, "strapd_uploads_retrying": 2, "strapd_upload_freed_bytes": 3 << 20,
		"strapd_uploads_lost": 1, "strapd_upload_recreated_bytes_total": 32 << 20,
	} {
		if got, ok := v[k]; !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", k, got, ok, want)
		}
	}
}
