// Package trace owns the kernel trace format of docs/TRACE_FORMAT.md: the Snapshot a JSON
// line holds, the crash-safe JSONL writer, reader and repair, the correlation spans file,
// and the text rendering of `strapd trace --no-output`. It loads nothing into the kernel:
// internal/bpf fills Snapshots, and readers (metrics, httpapi, strapd top) need only this.
package trace
