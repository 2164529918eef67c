// Package captureset owns the capture-set manifest v1 of a distributed job
// (docs/DISTRIBUTED.md D4): parsing and checking it, resolving each rank's stream against
// the manifest's location, and checking the manifest against the per-rank streams it lists
// (behind `strapd inspect|verify` of a manifest).
package captureset
