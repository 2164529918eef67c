// Package bpf owns STRAP-LLM's kernel probes: it loads the eBPF programs of bpf/, keeps the
// in-kernel filter of watched processes, turns the maps into per-interval Snapshots with
// /proc fallbacks and PSI, and writes them as crash-safe JSON lines.
package bpf
