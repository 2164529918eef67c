// Package metrics owns strapd's Prometheus series (docs/HTTP_API.md, "Metrics"): capture
// counters and latency histograms, the daemon's workers and memory budget, and the kernel
// probes' snapshots folded into cumulative counters. It reads plain status and snapshot
// values; label sets are bounded (codec, device, collector, process class), never module
// names, paths, pids, uids or session ids unless per-session detail is asked for. The
// per-session series' rank and host (and strapd_session_info's world_size and job) are
// bounded by the sessions open on this host: one value each per session, ranks below the
// job's world size, hosts those of the ranks this strapd serves.
package metrics
