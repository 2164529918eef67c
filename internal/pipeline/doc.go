// Package pipeline owns a session's data path through the daemon, from a checked request
// (Prepare) to a finished stream (Finish): ring records parsed from published windows,
// block compression on one worker pool shared by all sessions, in-order packet writing
// through internal/stream, ring release, and the memory budget that bounds ring mappings
// plus buffers in flight. It knows nothing of the control protocol: failures carry a
// Kind, and events (release, checkpoint, error) go out through callbacks the server maps
// to wire messages.
package pipeline
