// Package bpf owns STRAP-LLM's kernel probes: it loads the eBPF programs of bpf/, keeps the
// in-kernel filter of watched processes, and turns the maps into per-interval
// trace.Snapshots with /proc fallbacks and PSI (the format itself is internal/trace's).
package bpf
