package metrics

import (
	"math"
	"sort"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/strap-llm/strap/internal/control"
)

// captureCollector turns the daemon's status into series at each scrape. It is an
// unchecked collector (Describe sends nothing): the codecs, workers and collectors it
// labels are known only at run time.
type captureCollector struct{ m *Metrics }

func (captureCollector) Describe(chan<- *prometheus.Desc) {}

var (
	descSessions       = prometheus.NewDesc("strapd_sessions", "Capture sessions open now.", nil, nil)
	descBytesIn        = prometheus.NewDesc("strapd_capture_bytes_in_total", "Raw tensor bytes received from clients, by codec.", []string{"codec"}, nil)
	descBytesOut       = prometheus.NewDesc("strapd_capture_bytes_stored_total", "Bytes written to stream files after compression, by codec.", []string{"codec"}, nil)
	descPackets        = prometheus.NewDesc("strapd_capture_packets_total", "Packets written to stream files, by codec.", []string{"codec"}, nil)
	descDrops          = prometheus.NewDesc("strapd_capture_drops_total", "Records dropped (policy drop, or records the client reported lost), by codec.", []string{"codec"}, nil)
	descTokens         = prometheus.NewDesc("strapd_capture_tokens_total", "TOKEN records written.", nil, nil)
	descCheckpoints    = prometheus.NewDesc("strapd_capture_checkpoints_total", "Durable checkpoints made.", nil, nil)
	descRatio          = prometheus.NewDesc("strapd_capture_compression_ratio", "Bytes in / bytes stored since start, by codec (rate it with the _total counters for a window); NaN while the codec has stored nothing.", []string{"codec"}, nil)
	descRingUsed       = prometheus.NewDesc("strapd_ring_used_bytes", "Bytes published and not yet released, summed over the open sessions' rings.", nil, nil)
	descRingSize       = prometheus.NewDesc("strapd_ring_size_bytes", "Ring capacity summed over the open sessions.", nil, nil)
	descRingFillMax    = prometheus.NewDesc("strapd_ring_fill_max_ratio", "The fullest open session's ring_used / ring_size (0 with no session).", nil, nil)
	descMemLimit       = prometheus.NewDesc("strapd_memory_budget_bytes", "The memory budget (serve --memory-limit) for ring mappings and compression buffers.", nil, nil)
	descMemUsed        = prometheus.NewDesc("strapd_memory_reserved_bytes", "Memory reserved against the budget by open sessions.", nil, nil)
	descWorkers        = prometheus.NewDesc("strapd_workers", "Compression workers in the pool.", nil, nil)
	descWorkersBusy    = prometheus.NewDesc("strapd_workers_busy", "Compression workers running a job now.", nil, nil)
	descQueue          = prometheus.NewDesc("strapd_pool_queue_depth", "Compression jobs waiting for a worker.", nil, nil)
	descWorkersIdle    = prometheus.NewDesc("strapd_workers_sched_idle", "1 when the compression workers run under SCHED_IDLE (serve --idle-workers).", nil, nil)
	descRescued        = prometheus.NewDesc("strapd_worker_rescued_jobs_total", "Compression jobs the normal-priority rescuers ran because the SCHED_IDLE workers were starved.", nil, nil)
	descWorkerBusySecs = prometheus.NewDesc("strapd_worker_busy_seconds_total", "Wall time each compression worker spent in jobs.", []string{"worker"}, nil)
	descBuild          = prometheus.NewDesc("strapd_build_info", "Always 1; the daemon's version as a label.", []string{"version"}, nil)
	descProbesEnabled  = prometheus.NewDesc("strapd_probes_enabled", "1 when the kernel collector runs, 0 when it failed to start or serve --no-probes.", nil, nil)
	descCollectorUp    = prometheus.NewDesc("strapd_probe_collector_up", "1 when a kernel collector produces numbers (from bpf or its /proc fallback), 0 when it is off.", []string{"collector"}, nil)
	descCollectorBPF   = prometheus.NewDesc("strapd_probe_collector_bpf", "1 when a collector counts with eBPF probes, 0 on its /proc fallback or off.", []string{"collector"}, nil)
	descProbeSnaps     = prometheus.NewDesc("strapd_probe_snapshots_total", "Kernel snapshots taken.", nil, nil)
	descProbeEvents    = prometheus.NewDesc("strapd_probe_events_total", "Runs of each BPF program since it was loaded (system-wide events).", []string{"program"}, nil)
	descProbeRun       = prometheus.NewDesc("strapd_probe_run_seconds_total", "Time the kernel spent in each BPF program since it was loaded: the probes' own overhead.", []string{"program"}, nil)
	descProbeDrops     = prometheus.NewDesc("strapd_probe_drops_total", "Events the probes could not record, by reason.", []string{"reason"}, nil)

	descUploadBytes     = prometheus.NewDesc("strapd_upload_bytes_total", "Stream bytes the object store acknowledged, all uploads since the daemon started.", nil, nil)
	descUploadErrors    = prometheus.NewDesc("strapd_upload_errors_total", "Failed upload attempts (each is retried with backoff; the local file is kept).", nil, nil)
	descUploadLag       = prometheus.NewDesc("strapd_upload_lag_bytes", "Durable stream bytes not yet acknowledged by the object store, all uploads in progress.", nil, nil)
	descUploadActive    = prometheus.NewDesc("strapd_uploads_in_progress", "Uploads not yet complete (retrying included).", nil, nil)
	descUploadFailing   = prometheus.NewDesc("strapd_uploads_retrying", "Uploads whose last attempt failed, or that the server has not answered for --upload-timeout (stalled).", nil, nil)
	descUploadFreed     = prometheus.NewDesc("strapd_upload_freed_bytes", "Stream bytes freed on the local disk after their upload (serve --upload-free-local), uploads in progress.", nil, nil)
	descUploadRecreated = prometheus.NewDesc("strapd_upload_recreated_bytes_total", "Bytes of parts re-created from an earlier object of their stream (a resumed capture whose local stream was freed), all uploads since the daemon started.", nil, nil)
	descUploadLost      = prometheus.NewDesc("strapd_uploads_lost", "Uploads that cannot complete: bytes freed on the local disk are missing on the server (status names the range).", nil, nil)

	// rank and host come from the session's metadata.distributed; empty for a single process.
	sessLabels       = []string{"session", "uid", "pid", "codec", "rank", "host"}
	descSessBytesIn  = prometheus.NewDesc("strapd_session_bytes_in", "Per session (--http-metrics-detail): raw bytes received.", sessLabels, nil)
	descSessBytesOut = prometheus.NewDesc("strapd_session_bytes_stored", "Per session (--http-metrics-detail): bytes written.", sessLabels, nil)
	descSessDrops    = prometheus.NewDesc("strapd_session_drops", "Per session (--http-metrics-detail): records dropped.", sessLabels, nil)
	descSessFill     = prometheus.NewDesc("strapd_session_ring_fill_ratio", "Per session (--http-metrics-detail): ring_used / ring_size.", sessLabels, nil)
	descSessIn       = prometheus.NewDesc("strapd_session_in_mbps", "Per session (--http-metrics-detail): MB/s received over the last few seconds.", sessLabels, nil)
	descSessInfo     = prometheus.NewDesc("strapd_session_info", "Per session (--http-metrics-detail): always 1; the session's rank, world size and job id in a distributed job (empty for a single process), to join with the manifest's session ids. job_id, not job: Prometheus gives every scraped series its own job label.", []string{"session", "rank", "world_size", "job_id"}, nil)
)

func (c captureCollector) Collect(ch chan<- prometheus.Metric) {
	m := c.m
	m.collectResources(ch)
	st := m.opts.Status()
	d := st.Daemon
	gauge := func(desc *prometheus.Desc, v float64, lv ...string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, v, lv...)
	}
	counter := func(desc *prometheus.Desc, v float64, lv ...string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, v, lv...)
	}
	gauge(descBuild, 1, d.Version)
	gauge(descSessions, float64(d.Sessions))
	gauge(descMemLimit, float64(d.MemoryLimit))
	gauge(descMemUsed, float64(d.MemoryUsed))

	var used, size uint64
	fill := 0.0
	for _, s := range st.Sessions {
		used += s.RingUsed
		size += s.RingSize
		fill = max(fill, s.RingFill)
	}
	gauge(descRingUsed, float64(used))
	gauge(descRingSize, float64(size))
	gauge(descRingFillMax, fill)

	totals := m.captureTotals(st.Sessions)
	codecs := make([]string, 0, len(totals))
	var tokens, checkpoints uint64
	for k, t := range totals {
		codecs = append(codecs, k)
		tokens += t.tokens
		checkpoints += t.checkpoints
	}
	sort.Strings(codecs)
	for _, k := range codecs {
		t := totals[k]
		counter(descBytesIn, float64(t.bytesIn), k)
		counter(descBytesOut, float64(t.bytesOut), k)
		counter(descPackets, float64(t.packets), k)
		counter(descDrops, float64(t.drops), k)
		// With nothing stored yet the ratio is undefined: NaN, not absent, so the panel
		// shows the codec and the series exists before the first capture.
		ratio := math.NaN()
		if t.bytesOut > 0 {
			ratio = float64(t.bytesIn) / float64(t.bytesOut)
		}
		gauge(descRatio, ratio, k)
	}
	counter(descTokens, float64(tokens))
	counter(descCheckpoints, float64(checkpoints))

	if m.opts.Pool != nil {
		p := m.opts.Pool()
		gauge(descWorkers, float64(p.Workers))
		gauge(descWorkersBusy, float64(p.Busy))
		gauge(descQueue, float64(p.Queued))
		for i, s := range p.BusySeconds {
			counter(descWorkerBusySecs, s, strconv.Itoa(i))
		}
		gauge(descWorkersIdle, b2f(p.Idle))
		counter(descRescued, float64(p.Rescued))
	}

	if pr := d.Probes; pr != nil && pr.Enabled {
		gauge(descProbesEnabled, 1)
		counter(descProbeSnaps, float64(pr.Snapshots))
		for _, col := range pr.Collectors {
			gauge(descCollectorUp, b2f(col.Source != control.ProbeSourceOff), col.Name)
			gauge(descCollectorBPF, b2f(col.Source == control.ProbeSourceBPF), col.Name)
		}
		for _, p := range pr.BPFStats {
			counter(descProbeEvents, float64(p.TotalEvents), p.Program)
			counter(descProbeRun, float64(p.TotalRunTimeNs)/1e9, p.Program)
		}
		for reason, n := range pr.Drops {
			counter(descProbeDrops, float64(n), reason)
		}
	} else {
		gauge(descProbesEnabled, 0)
	}

	if u := d.Upload; u != nil {
		counter(descUploadBytes, float64(u.UploadedBytes))
		counter(descUploadErrors, float64(u.Errors))
		counter(descUploadRecreated, float64(u.RecreatedBytes))
		var lag, freed int64
		active, retrying, lost := 0, 0, 0
		for _, up := range st.Uploads {
			if up.State == "lost" {
				lost++
				continue // it will not go on: not in progress
			}
			if up.State == "complete" || up.State == "refused" {
				continue // refused: its key holds another capture's object; it will not go on
			}
			active++
			lag += up.LagBytes
			freed += up.FreedBytes
			if up.State == "retrying" || up.State == "stalled" {
				retrying++
			}
		}
		gauge(descUploadLag, float64(lag))
		gauge(descUploadActive, float64(active))
		gauge(descUploadFailing, float64(retrying))
		gauge(descUploadFreed, float64(freed))
		gauge(descUploadLost, float64(lost))
	}

	if m.opts.Detail {
		for _, s := range st.Sessions {
			var rank, host, world, job string
			if d := s.Distributed; d != nil {
				rank, host, world, job = label(d.Rank), d.Host, label(d.WorldSize), d.JobID
			}
			gauge(descSessInfo, 1, label(s.Session), rank, world, job)
			lv := []string{label(s.Session), strconv.FormatUint(uint64(s.UID), 10), strconv.Itoa(int(s.PID)), s.Codec, rank, host}
			gauge(descSessBytesIn, float64(s.BytesIn), lv...)
			gauge(descSessBytesOut, float64(s.BytesOut), lv...)
			gauge(descSessDrops, float64(s.Drops), lv...)
			gauge(descSessFill, s.RingFill, lv...)
			gauge(descSessIn, s.InMBps, lv...)
		}
	}
}

// captureTotals is, per codec, the ended sessions' totals plus the latest counters of the
// live ones. Counters stay monotonic: a session that leaves the status before SessionEnded
// is called keeps its last seen values until then.
func (m *Metrics) captureTotals(sessions []control.SessionStatus) map[string]counts {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, s := range sessions {
		if m.endedIDs[s.Session] {
			continue
		}
		l := m.live[s.Session]
		if l == nil {
			l = &liveSession{codec: s.Codec}
			m.live[s.Session] = l
		}
		l.raise(countsOf(s))
	}
	out := map[string]counts{}
	for k, c := range m.ended {
		out[k] = *c
	}
	for _, l := range m.live {
		t := out[l.codec]
		t.add(l.counts)
		out[l.codec] = t
	}
	return out
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
