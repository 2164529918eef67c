package pipeline

import (
	"errors"
	"os"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/strap-llm/strap/internal/codec"
	"github.com/strap-llm/strap/internal/shm"
	"github.com/strap-llm/strap/internal/stream"
)

// DefaultBlockSize is the raw bytes per compression block when the request names none.
const DefaultBlockSize = 1 << 20

// Request is what a client asks of a new session, already decoded from the wire by the
// server. Policy is not enforced here (the client applies it) but recorded in the stream.
type Request struct {
	// RingSize is the ring memfd's size in bytes.
	RingSize uint64
	// Codec and CodecLevel name the compression (codec.New).
	Codec      string
	CodecLevel int
	// Lossy is a lossy codec's error bound; nil for lossless codecs.
	Lossy *codec.LossyBound
	// BlockSize is the raw bytes per compression block (DefaultBlockSize when 0).
	BlockSize uint64
	// Policy is "block" or "drop".
	Policy string
	// MemoryHint, when not 0, is the bytes the client asks the daemon to budget for this
	// session's compression buffers: it caps them (see Lease), clamped so the session can
	// always compress its largest record and never above the daemon's limit.
	MemoryHint uint64
	// AppendAt, when not 0, resumes the stream already in the output: its bytes
	// [0, AppendAt) are a checkpointed prefix that must end as Resume says.
	AppendAt uint64
	// Resume is what the prefix ends with; required with AppendAt.
	Resume *ResumePoint
	// ClientMetadata is copied into the stream header as "client_metadata".
	ClientMetadata map[string]any
	// Peer is who opened the session, as the kernel reported it.
	Peer Peer
}

// ResumePoint is what a checkpointed stream prefix ends with (the durable facts of the
// session that wrote it).
type ResumePoint struct {
	// LastSeq is the sequence number of the prefix's last packet (0: no packet yet).
	LastSeq uint64
	// LastCRC is the CRC32C field of the prefix's last packet.
	LastCRC uint32
	// Packets is the number of TENSOR, DROP and TOKEN packets in the prefix.
	Packets uint64
}

// Peer identifies the opening process by its socket credentials (SO_PEERCRED), not by what
// it says about itself. Fields are in JSON key order so the header bytes stay sorted.
type Peer struct {
	GID uint32 `json:"gid"`
	PID int32  `json:"pid"`
	UID uint32 `json:"uid"`
}

// Env is what the daemon lends every session: shared resources, limits and the callbacks
// through which the session reports back (the server turns them into wire messages).
type Env struct {
	// ID is the session number (for logs and the stream metadata).
	ID uint64
	// Version is the daemon's version, recorded in the stream header.
	Version string
	// Limits tighten the per-record limits.
	Limits shm.Limits
	// Pool runs compression jobs; shared by all sessions.
	Pool *Pool
	// Budget is the daemon's memory limit the session leases its share from.
	Budget *Budget
	// CPU bounds compression time, shared by all sessions; nil: unlimited.
	CPU *CPUBudget
	// Release is called with each new ring tail; it must not block.
	Release func(tail uint64)
	// OnError is called once, with the first fatal error; it must not block.
	OnError func(error)
	// OnCheckpoint is called from the writer goroutine once every event up to a
	// checkpoint's seq is written and fdatasynced; it must not block.
	OnCheckpoint func(Durable)
	// IndexAtCheckpoint has OnCheckpoint's Durable carry the new index entries.
	IndexAtCheckpoint bool
	// OnDurable, when set, is called from the writer goroutine with the stream's size each
	// time every byte before it is written and fdatasynced: after each checkpoint, and, when
	// DurableEvery is positive, whenever that many bytes were written since the last time
	// (an upload sends only durable bytes, internal/upload). It must not block.
	OnDurable func(offset uint64)
	// DurableEvery is the bytes between the writer's own fdatasyncs for OnDurable (0: only
	// at checkpoints).
	DurableEvery uint64
	// CRCGrain, when positive, has the writer record the stream file's CRC32C at every
	// multiple of it (stream.WriterOptions.CRCGrain; Session.RangeCRCs): an upload's part
	// checksums without reading the parts back.
	CRCGrain int64
	// Log receives the session's log lines.
	Log *zap.Logger
	// WriteDelay slows the writer by this much per packet (tests fill tiny rings with it).
	WriteDelay time.Duration
	// Observer receives write, fdatasync, checkpoint and token timings; nil: none.
	Observer Observer
}

// Observer receives a session's timings (internal/metrics implements it). Its methods are
// called from the session's goroutines and must return quickly.
type Observer interface {
	// ObserveWrite is the time one packet took to reach the file.
	ObserveWrite(time.Duration)
	// ObserveSync is the time of one fdatasync.
	ObserveSync(time.Duration)
	// ObserveCheckpoint is the time from a CHECKPOINT to its durable reply.
	ObserveCheckpoint(time.Duration)
	// ObserveToken is a TOKEN of session arriving at at.
	ObserveToken(session uint64, at time.Time)
}

// Plan is a checked request with its codec built: everything about a session that can be
// refused without touching the ring, the budget or the output.
type Plan struct {
	req    Request
	codec  codec.Codec
	bs     int
	resume *stream.ResumeExpect
}

// Prepare checks req and builds its codec. The server calls it before it counts the
// session against any quota, so a malformed request costs nothing.
func Prepare(req Request) (*Plan, error) {
	if err := shm.CheckRingSize(req.RingSize); err != nil {
		return nil, &Error{Kind: KindRingSize, Err: err}
	}
	if req.Policy != "block" && req.Policy != "drop" {
		return nil, errf(KindBadRequest, "policy %q, expected \"block\" or \"drop\"", req.Policy)
	}
	p := &Plan{req: req, bs: int(req.BlockSize)}
	if p.bs == 0 {
		p.bs = DefaultBlockSize
	}
	switch {
	case req.AppendAt == 0 && req.Resume != nil:
		return nil, errf(KindBadRequest, "OPEN resume without append_at")
	case req.AppendAt != 0 && req.Resume == nil:
		return nil, errf(KindBadRequest, "append_at %d without resume {last_seq, last_crc, packets}", req.AppendAt)
	case req.AppendAt > 1<<62:
		return nil, errf(KindBadRequest, "append_at %d out of range", req.AppendAt)
	case req.AppendAt != 0:
		// The prefix is read through the output descriptor the client passed, never by path.
		p.resume = &stream.ResumeExpect{AppendAt: int64(req.AppendAt), LastSeq: req.Resume.LastSeq,
			LastCRC: req.Resume.LastCRC, Packets: req.Resume.Packets}
	}
	cd, err := codec.New(req.Codec, codec.Options{Level: req.CodecLevel, Lossy: req.Lossy})
	if err != nil {
		return nil, &Error{Kind: KindBadCodec, Err: err}
	}
	if lc, ok := cd.(codec.LossyCodec); ok && lc.Bound().Mode == "" {
		return nil, errf(KindBadCodec, "codec %s is lossy and needs a bound: OPEN \"lossy\": {\"mode\": \"rel\"|\"abs\"|\"fp16\", \"value\": v}", cd.Name())
	}
	p.codec = cd
	return p, nil
}

// Codec is the codec's name as written in the stream.
func (p *Plan) Codec() string { return p.codec.Name() }

// BlockSize is the raw bytes per compression block the session will use.
func (p *Plan) BlockSize() uint64 { return uint64(p.bs) }

// StreamMeta is the metadata object of the stream header the daemon writes
// (STREAM_FORMAT.md 2). Fields are in JSON key order, so the header's bytes are sorted as
// they were when this was a map.
type StreamMeta struct {
	BlockSize      uint64         `json:"block_size"`
	ClientMetadata map[string]any `json:"client_metadata"`
	Codec          string         `json:"codec"`
	CodecLevel     int            `json:"codec_level"`
	// Created is the session's start, RFC 3339 UTC.
	Created string `json:"created"`
	Host    string `json:"host"`
	// Lossy is the error bound asked for; absent for lossless codecs.
	Lossy *LossyMeta `json:"lossy,omitempty"`
	// Peer is who opened the session, as the kernel reported it, not as the client says.
	Peer          Peer   `json:"peer"`
	Policy        string `json:"policy"`
	Session       uint64 `json:"session"`
	StrapdVersion string `json:"strapd_version"`
}

// LossyMeta is the error bound as the stream header records it (the OPEN request's form).
type LossyMeta struct {
	Mode  string  `json:"mode"`
	Value float64 `json:"value,omitempty"`
}

// FitRing is the largest ring size, a multiple of 4096, that a session of this plan (its
// codec and block size) could lease from free bytes of budget: the ring plus its
// compression reserve (Reserve) within free. 0 when not even a one-page data region fits.
func (p *Plan) FitRing(free int64) uint64 {
	const page = 4096
	need := func(ring int64) int64 { return ring + Reserve(p.codec, p.bs, uint64(ring-shm.HeaderSize)) }
	// In pages; lo = 1 is the header alone, no ring. Reserve grows with the ring, so the
	// need does too and the largest fit is found by bisection.
	lo, hi := int64(1), free/page
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if need(mid*page) <= free {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	if lo == 1 {
		return 0
	}
	return uint64(lo * page)
}

// Meta is the stream header metadata for a session with id opened now by daemon version.
func (p *Plan) Meta(id uint64, version string, now time.Time) StreamMeta {
	host, _ := os.Hostname()
	m := StreamMeta{BlockSize: uint64(p.bs), ClientMetadata: p.req.ClientMetadata, Codec: p.codec.Name(),
		CodecLevel: p.req.CodecLevel, Created: now.UTC().Format(time.RFC3339), Host: host, Peer: p.req.Peer,
		Policy: p.req.Policy, Session: id, StrapdVersion: version}
	if m.ClientMetadata == nil {
		m.ClientMetadata = map[string]any{}
	}
	if l := p.req.Lossy; l != nil {
		m.Lossy = &LossyMeta{Mode: l.Mode, Value: l.Value}
	}
	return m
}

// UseJournal gives a resumed session the index journal of its prefix's freed packets
// (stream.ResumeExpect.Journal); nil, or a session that does not resume: nothing.
func (p *Plan) UseJournal(j *stream.Journal) {
	if p.resume != nil {
		p.resume.Journal = j
	}
}

// Open starts the session: it leases the ring and its compression reserve from the budget,
// maps the ring from ringFD, and writes the stream header (or checks and continues the
// resumed prefix) to out. ringFD is always closed by Open, whatever the outcome (the
// mapping outlives it); out stays the caller's to close.
func (p *Plan) Open(env Env, ringFD int, out *os.File) (*Session, error) {
	defer unix.Close(ringFD)
	req := p.req
	lease, err := env.Budget.Open(int64(req.RingSize), Reserve(p.codec, p.bs, req.RingSize-shm.HeaderSize))
	if err != nil {
		return nil, &Error{Kind: KindMemoryBudget, Err: err}
	}
	lease.limitInFlight(int64(req.MemoryHint))
	ring, err := shm.Map(ringFD, req.RingSize)
	if err != nil {
		lease.Close()
		k := KindRingHeader
		switch {
		case errors.Is(err, shm.ErrNotSealed), errors.Is(err, shm.ErrNotMemfd):
			k = KindRingNotSealed
		case errors.Is(err, shm.ErrRingSize):
			k = KindRingSize
		}
		return nil, &Error{Kind: k, Err: err}
	}
	s, err := start(options{Env: env, Ring: ring, Output: out, Codec: p.codec, BlockSize: p.bs,
		Metadata: p.Meta(env.ID, env.Version, time.Now()), Lease: lease, Resume: p.resume})
	if err != nil {
		return nil, err
	}
	env.Pool.procs.sessionOpened()
	return s, nil
}

// MemoryBudget is the cap on the session's in-flight compression buffers (0: none beyond
// the daemon's limit).
func (s *Session) MemoryBudget() int64 { return s.o.Lease.inFlightCap }
