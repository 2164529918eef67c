// Package metrics owns strapd's Prometheus series (docs/HTTP_API.md, "Metrics"): capture
// counters and latency histograms, the daemon's workers and memory budget, and the kernel
// probes' snapshots folded into cumulative counters. It reads plain status and snapshot
// values; label sets are bounded (codec, device, collector, process class), never module
// names, paths, pids or uids unless per-session detail is asked for.
package metrics
