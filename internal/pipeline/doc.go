// Package pipeline owns the path of a session's data through the daemon: records parsed
// from published ring windows, block compression on one worker pool shared by all sessions,
// in-order packet writing through internal/stream, ring release, and the global memory
// budget that bounds ring mappings plus buffers in flight.
package pipeline
