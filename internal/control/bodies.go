package control

import (
	"encoding/json"
	"fmt"
)

// Hello opens a connection (client → daemon).
type Hello struct {
	Protocol int    `json:"protocol"`
	Client   string `json:"client"`
	PID      int    `json:"pid"`
}

// Welcome answers Hello.
type Welcome struct {
	Protocol   int    `json:"protocol"`
	Daemon     string `json:"daemon"`
	PID        int    `json:"pid"`
	MaxMessage int    `json:"max_message"`
	// MaxRingSize is the largest ring this daemon admits (--max-ring-size), so a client
	// can size its ring to fit before it sends OPEN.
	MaxRingSize uint64 `json:"max_ring_size"`
}

// Open asks for a session; it carries the ring memfd and the output file (PROTOCOL.md 1.3).
type Open struct {
	RingSize   uint64 `json:"ring_size"`
	Codec      string `json:"codec"`
	CodecLevel int    `json:"codec_level,omitempty"`
	Policy     string `json:"policy"`
	BlockSize  uint64 `json:"block_size,omitempty"`
	// Lossy is the error bound of a lossy codec ("quant", "fp16"); absent for lossless ones.
	Lossy *Lossy `json:"lossy,omitempty"`
	// AppendAt, when not 0, resumes the stream in the output file: its bytes [0, AppendAt)
	// are a checkpointed prefix the daemon checks against Resume and continues.
	AppendAt uint64 `json:"append_at,omitempty"`
	// Resume states what the prefix must end with; required with AppendAt.
	Resume *Resume `json:"resume,omitempty"`
	// MemoryHint is the bytes the client asks the daemon to budget for this session's
	// compression buffers (0: no hint). It caps them, raised to what the largest record
	// needs and lowered to the daemon's memory limit (PROTOCOL.md 1.3).
	MemoryHint uint64 `json:"memory_hint,omitempty"`
	// Metadata is the client's object, copied into the stream header.
	Metadata map[string]any `json:"metadata,omitempty"`
	// Resources says the last descriptor is the resource log: a file the client opened
	// for writing, into which the daemon appends RESOURCES events (PROTOCOL.md 1.3).
	Resources bool `json:"resources,omitempty"`
	// Upload is an s3://bucket/prefix the daemon uploads the stream (and its trace and
	// resource log) into while it is written (PROTOCOL.md 1.3, OBJECT_STORAGE.md); empty:
	// the daemon's own --upload target, if any.
	Upload string `json:"upload,omitempty"`
	// UploadFreeLocal frees this session's uploaded bytes on the local disk while it is
	// written, as serve --upload-free-local does for every session (OBJECT_STORAGE.md);
	// only with an upload (the session's own or the daemon's).
	UploadFreeLocal bool `json:"upload_free_local,omitempty"`
}

// Resume is what a checkpointed stream prefix ends with (CHECKPOINTED of the session that
// wrote it): the daemon refuses to append when the prefix disagrees.
type Resume struct {
	// LastSeq is the sequence number of the prefix's last packet (0: no packet yet).
	LastSeq uint64 `json:"last_seq"`
	// LastCRC is the CRC32C field of the prefix's last packet.
	LastCRC uint32 `json:"last_crc"`
	// Packets is the number of TENSOR, DROP and TOKEN packets in the prefix.
	Packets uint64 `json:"packets"`
}

// Checkpoint asks the daemon to make every event up to Seq durable (write and fdatasync)
// and to answer Checkpointed. Seq must be the last sequence number the client took.
type Checkpoint struct {
	Seq uint64 `json:"seq"`
}

// Checkpointed answers Checkpoint once every packet up to Seq is on disk.
type Checkpointed struct {
	// Seq echoes the request.
	Seq uint64 `json:"seq"`
	// Offset is the stream's size in bytes after the last packet: a resume appends here.
	Offset uint64 `json:"offset"`
	// Packets and Drops count TENSOR/DROP/TOKEN packets and DROP packets so far.
	Packets uint64 `json:"packets"`
	Drops   uint64 `json:"drops"`
	// Tokens counts TOKEN packets so far.
	Tokens uint64 `json:"tokens"`
	// LastOffset is where the last packet starts (0 when there is none).
	LastOffset uint64 `json:"last_offset"`
	// LastCRC is the last packet's CRC32C field (0 when there is none).
	LastCRC uint32 `json:"last_crc"`
}

// Lossy is an error bound as OPEN carries it (docs/COMPRESSION.md 7).
type Lossy struct {
	// Mode is "abs", "rel" or "fp16".
	Mode string `json:"mode"`
	// Value is the bound (may be 0 for "fp16").
	Value float64 `json:"value,omitempty"`
}

// OpenRequired are the fields OPEN must carry.
var OpenRequired = []string{"ring_size", "codec", "policy"}

// Opened answers Open.
type Opened struct {
	Session   uint64 `json:"session"`
	BlockSize uint64 `json:"block_size"`
	// Upload is the object the stream is uploaded to (s3://bucket/key) when the session
	// uploads, by OPEN's "upload" or the daemon's own target; the client then passes its
	// tokens file with CLOSE (PROTOCOL.md 1.4).
	Upload string `json:"upload,omitempty"`
	// PublishedCursor says the daemon reads the ring's published cursor when the client
	// dies and takes a TOKEN's "head" (PROTOCOL.md 1.4): a client may then defer PUBLISH.
	PublishedCursor bool `json:"published_cursor,omitempty"`
	// RingTokens says the daemon takes TOKEN records in the ring (PROTOCOL.md 1.4, 2): a
	// client may then write its tokens there and publish several with one message.
	RingTokens bool `json:"ring_tokens,omitempty"`
}

// Publish says every record in [previous head, Head) is complete; Seq is the last tensor
// record's sequence number among them.
type Publish struct {
	Head uint64 `json:"head"`
	Seq  uint64 `json:"seq"`
}

// Release gives ring space back up to Tail.
type Release struct {
	Tail uint64 `json:"tail"`
}

// Drop reports a record the client could not place under policy drop.
type Drop struct {
	Seq     uint64 `json:"seq"`
	Name    string `json:"name"`
	Step    uint64 `json:"step"`
	Forward uint64 `json:"forward"`
	Bytes   uint64 `json:"bytes"`
	Reason  string `json:"reason"`
}

// DropRequired are the fields DROP must carry.
var DropRequired = []string{"seq", "name", "bytes"}

// Token is a per-token notice (reserved; written as a TOKEN packet).
type Token struct {
	Seq     uint64 `json:"seq"`
	Index   uint64 `json:"index"`
	TokenID int64  `json:"token_id"`
	Text    string `json:"text"`
	// Position is the token's sequence position (absent: the same as Index).
	Position *int64 `json:"position,omitempty"`
	// Head, when present, publishes every record up to it before the token is taken, as a
	// PUBLISH {"head":Head,"seq":Seq-1} would (only to a daemon whose OPENED said
	// published_cursor).
	Head *uint64 `json:"head,omitempty"`
}

// Close ends a session after the last Publish.
type Close struct {
	Seq   uint64 `json:"seq"`
	Head  uint64 `json:"head"`
	Drops uint64 `json:"drops"`
}

// Closed answers Close once the stream is complete and synced.
type Closed struct {
	Packets   uint64 `json:"packets"`
	Drops     uint64 `json:"drops"`
	BytesIn   uint64 `json:"bytes_in"`
	BytesOut  uint64 `json:"bytes_out"`
	FileBytes uint64 `json:"file_bytes"`
	// Upload is the object the stream is being uploaded to (s3://bucket/key), when it is;
	// the upload goes on after CLOSED (STATUS_REPLY's "uploads" says when it is complete).
	Upload string `json:"upload,omitempty"`
}

// Error codes sent in ERROR messages.
const (
	CodeBadMessage      = "bad_message"
	CodeProtocolVersion = "protocol_version"
	CodeRingNotSealed   = "ring_not_sealed"
	CodeRingSize        = "ring_size"
	CodeRingHeader      = "ring_header"
	CodeBadOutput       = "bad_output"
	CodeOutputInUse     = "output_in_use"
	CodeUploadRefused   = "upload_refused"
	CodeBadCodec        = "bad_codec"
	CodeLimit           = "limit"
	CodeMemoryBudget    = "memory_budget"
	CodeTornRecord      = "torn_record"
	CodeBadRecord       = "bad_record"
	CodeWrite           = "write_error"
	CodeCodec           = "codec_error"
	CodeShutdown        = "shutdown"
	CodeInternal        = "internal"
)

// Error is the ERROR body and the one coded error of the protocol: the daemon raises it for
// failures that are about the conversation itself (access, quotas, malformed messages) and
// builds it from a session's failure kind (internal/server's table); the Go client returns
// the one it receives. The cause, when the daemon made it, stays reachable with errors.Is.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Fatal   bool   `json:"fatal"`
	// FitsRingSize, on memory_budget only, is the largest ring_size (a multiple of 4096)
	// that the refused OPEN, with its codec and block size unchanged, would have fitted in
	// the budget left at that moment; 0: none. A client that chose its ring itself may
	// retry with it (PROTOCOL.md 1.3).
	FitsRingSize *uint64 `json:"fits_ring_size,omitempty"`
	cause        error
}

// Errorf makes a fatal Error with code; the message is formatted as by fmt.Errorf and any
// %w operand stays reachable through Unwrap.
func Errorf(code, format string, args ...any) *Error {
	err := fmt.Errorf(format, args...)
	return &Error{Code: code, Message: err.Error(), Fatal: true, cause: err}
}

// Error formats the code and message.
func (e *Error) Error() string { return fmt.Sprintf("strapd error %s: %s", e.Code, e.Message) }

// Unwrap is the cause the daemon built the error from (nil for one decoded off the wire).
func (e *Error) Unwrap() error { return e.cause }

// DaemonStatus is the daemon part of STATUS_REPLY.
type DaemonStatus struct {
	Version     string  `json:"version"`
	PID         int     `json:"pid"`
	UptimeS     float64 `json:"uptime_s"`
	Socket      string  `json:"socket"`
	MemoryLimit int64   `json:"memory_limit"`
	MemoryUsed  int64   `json:"memory_used"`
	Sessions    int     `json:"sessions"`
	// CPUBudget is serve --cpu-budget in CPUs (absent: unlimited); CPURawBlocks counts
	// the blocks, over all sessions, stored raw because it was spent.
	CPUBudget    *float64 `json:"cpu_budget,omitempty"`
	CPURawBlocks uint64   `json:"cpu_raw_blocks"`
	// Probes is the eBPF collectors' state (set by internal/server/probes.go); absent
	// when the daemon runs without probes (serve --no-probes).
	Probes *ProbesStatus `json:"probes,omitempty"`
	// Upload is the object-storage configuration and totals (absent: none configured).
	Upload *UploadDaemonStatus `json:"upload,omitempty"`
}

// SessionStatus is one session in STATUS_REPLY.
type SessionStatus struct {
	Session    uint64 `json:"session"`
	PID        int32  `json:"pid"`
	UID        uint32 `json:"uid"`
	ModelClass string `json:"model_class"`
	OutputPath string `json:"output_path"`
	Codec      string `json:"codec"`
	Policy     string `json:"policy"`
	Started    string `json:"started"`
	Packets    uint64 `json:"packets"`
	Drops      uint64 `json:"drops"`
	BytesIn    uint64 `json:"bytes_in"`
	BytesOut   uint64 `json:"bytes_out"`
	RingSize   uint64 `json:"ring_size"`
	RingUsed   uint64 `json:"ring_used"`
	// AgeS is the session's age in seconds.
	AgeS float64 `json:"age_s"`
	// Ratio is bytes_in / bytes_out (0 before anything was written).
	Ratio float64 `json:"ratio"`
	// InMBps and OutMBps are MB/s (10^6 bytes) over the last few seconds.
	InMBps  float64 `json:"in_mbps"`
	OutMBps float64 `json:"out_mbps"`
	// RateWindowS is the window the rates cover.
	RateWindowS float64 `json:"rate_window_s"`
	// RingFill is ring_used / ring_size.
	RingFill float64 `json:"ring_fill"`
	// Tokens counts TOKEN packets written.
	Tokens uint64 `json:"tokens"`
	// Checkpoints counts CHECKPOINTED replies; LastCheckpointAgeS is the age of the last
	// one in seconds (-1 when none).
	Checkpoints        uint64  `json:"checkpoints"`
	LastCheckpointAgeS float64 `json:"last_checkpoint_age_s"`
	// CPURawBlocks counts the session's blocks stored raw because the daemon's CPU
	// budget was spent.
	CPURawBlocks uint64 `json:"cpu_raw_blocks"`
	// Resumed is the append_at offset when the session resumed a stream, else 0.
	Resumed uint64 `json:"resumed_at,omitempty"`
	// ResourceLog says the session passed a resource log; ResourceEvents counts the events
	// written into it, ResourceEventsLost those not written after a failed write, whose
	// error is ResourceLogError.
	ResourceLog        bool   `json:"resource_log"`
	ResourceEvents     uint64 `json:"resource_events"`
	ResourceEventsLost uint64 `json:"resource_events_lost"`
	ResourceLogError   string `json:"resource_log_error,omitempty"`
	// Distributed is the session's rank in a job of several processes, from OPEN's
	// metadata.distributed (docs/DISTRIBUTED.md); absent for a single process.
	Distributed *SessionRank `json:"distributed,omitempty"`
}

// SessionRank is a session's place in a distributed job as its client reported it in
// OPEN's metadata.distributed: what `strapd status` of several hosts is joined on, and
// the rank and host labels of the per-session metrics.
type SessionRank struct {
	// Rank is the global rank, below WorldSize.
	Rank      uint64 `json:"rank"`
	WorldSize uint64 `json:"world_size"`
	// LocalRank is the rank on its host; nil when the launcher did not say.
	LocalRank *uint64 `json:"local_rank"`
	// Host is the client's host name.
	Host string `json:"host"`
	// JobID is the launcher's job id (TORCHELASTIC_RUN_ID) when the client sent one.
	JobID string `json:"job_id,omitempty"`
}

// StatusReply answers Status.
type StatusReply struct {
	Daemon   DaemonStatus    `json:"daemon"`
	Sessions []SessionStatus `json:"sessions"`
	// Uploads are the uploads to object storage in progress, then the last finished ones.
	Uploads []UploadStatus `json:"uploads,omitempty"`
}

// UploadStatus is one stream's upload to object storage (OBJECT_STORAGE.md). The uploader
// fills it itself (upload.Status is this type), so what STATUS_REPLY sends is its value.
type UploadStatus struct {
	// Object is s3://bucket/key; Path the local stream file.
	Object string `json:"object"`
	Path   string `json:"path"`
	// Session is the capture session writing it (0 once it ended before a restart).
	Session uint64 `json:"session,omitempty"`
	UID     uint32 `json:"uid"`
	// State is "uploading", "retrying", "stalled" (no answer from the server for the
	// upload time-out: a hung server, retried), "refused" (the key holds another
	// capture's object, which strapd does not overwrite; the local files are kept),
	// "complete", "stopped", "waiting" (a capture that did not end complete, its local
	// stream freed: the upload stays open for its resume) or "lost" (bytes the local disk no
	// longer holds are missing on the server: Lost).
	State string `json:"state"`
	// DurableBytes is the stream's bytes durable on the local disk, UploadedBytes those the
	// server acknowledged (in file order), LagBytes the difference.
	DurableBytes  int64 `json:"durable_bytes"`
	UploadedBytes int64 `json:"uploaded_bytes"`
	LagBytes      int64 `json:"lag_bytes"`
	// FinalSize is the stream's size once its session ended, -1 before.
	FinalSize int64 `json:"final_size"`
	Parts     int   `json:"parts"`
	// Errors counts failed attempts; LastError is the last one's message.
	Errors    uint64 `json:"errors"`
	LastError string `json:"last_error,omitempty"`
	// Verified says what was checked once the object was complete.
	Verified string `json:"verified,omitempty"`
	// LocalDeleted: the local files were deleted once verified (serve --upload-keep-local=false).
	LocalDeleted bool `json:"local_deleted,omitempty"`
	// FreedBytes are the stream's bytes freed on the local disk after their upload
	// (serve --upload-free-local); FreeError says why freeing stopped (the file system
	// cannot punch holes), the capture going on with nothing more freed.
	FreedBytes int64  `json:"freed_bytes,omitempty"`
	FreeError  string `json:"free_error,omitempty"`
	// Lost names the byte range that is missing on the server after its local copy was
	// freed: the object cannot be completed (state "lost").
	Lost string `json:"lost,omitempty"`
}

// UploadDaemonStatus is the daemon's object-storage configuration and totals.
type UploadDaemonStatus struct {
	// Target is serve --upload (empty: only sessions that name one upload).
	Target   string `json:"target,omitempty"`
	Endpoint string `json:"endpoint,omitempty"`
	StateDir string `json:"state_dir,omitempty"`
	// KeepLocal: local files are kept once uploaded.
	KeepLocal bool `json:"keep_local"`
	// FreeLocal: uploaded bytes are freed on the local disk while a capture goes on.
	FreeLocal bool `json:"free_local,omitempty"`
	// SSE is the server-side encryption every object is written with (serve --s3-sse;
	// empty: the bucket's default).
	SSE string `json:"sse,omitempty"`
	// UploadedBytes and Errors are totals over every upload since the daemon started;
	// RecreatedBytes those of parts re-created from an earlier object of their stream (a
	// resumed capture whose local stream was freed: OBJECT_STORAGE.md).
	UploadedBytes  uint64 `json:"uploaded_bytes"`
	Errors         uint64 `json:"errors"`
	RecreatedBytes uint64 `json:"recreated_bytes,omitempty"`
	// Error says why uploads are unavailable (the AWS configuration did not load).
	Error string `json:"error,omitempty"`
}

// MarshalJSON keeps "sessions" a list (never null) for readers in other languages.
func (s StatusReply) MarshalJSON() ([]byte, error) {
	type plain StatusReply
	if s.Sessions == nil {
		s.Sessions = []SessionStatus{}
	}
	return json.Marshal(plain(s))
}
