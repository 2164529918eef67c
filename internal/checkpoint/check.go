package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/strap-llm/strap/internal/stream"
)

// Report says whether a stream can be resumed from its checkpoint and what a resume cuts.
type Report struct {
	// Stream and Checkpoint are the files looked at.
	Stream     string `json:"stream"`
	Checkpoint string `json:"checkpoint"`
	// Resumable: the stream's first StreamOffset bytes are exactly what the checkpoint
	// describes, so a resume (or --repair) can cut there and go on.
	Resumable bool `json:"resumable"`
	// Problems names every difference found when not resumable.
	Problems []string `json:"problems,omitempty"`
	// ResumeToken is the step the resumed capture starts from (tokens kept).
	ResumeToken uint64 `json:"resume_token"`
	// ResumeOffset is where the stream is cut and appended to.
	ResumeOffset int64 `json:"resume_offset"`
	// Size is the stream's current size; CutBytes = Size - ResumeOffset.
	Size     int64 `json:"size"`
	CutBytes int64 `json:"cut_bytes"`
	// CutPackets counts the complete packets after the checkpoint that a resume removes
	// (TENSOR, DROP, TOKEN; END and INDEX are listed in CutEnd/CutIndex); CutTokens the
	// TOKEN packets among them, which the resumed capture generates again.
	CutPackets uint64 `json:"cut_packets"`
	CutTokens  uint64 `json:"cut_tokens"`
	CutEnd     string `json:"cut_end,omitempty"`
	CutIndex   bool   `json:"cut_index"`
	// TornAt is the offset of a packet cut short after the checkpoint (-1: none).
	TornAt int64 `json:"torn_at"`
	// Packets, LastSeq and TokenCount are the checkpoint's.
	Packets    uint64 `json:"packets"`
	LastSeq    uint64 `json:"last_seq"`
	TokenCount uint64 `json:"token_count"`
	// Fingerprint is the checkpoint's; StreamFingerprint the stream header's.
	Fingerprint       string `json:"fingerprint"`
	StreamFingerprint string `json:"stream_fingerprint"`
}

func (r *Report) problem(format string, args ...any) {
	r.Problems = append(r.Problems, fmt.Sprintf(format, args...))
}

// Check compares the stream in f (size bytes) with c. It never changes the file; what it
// finds is in the Report.
func Check(f io.ReaderAt, size int64, c *Checkpoint) Report {
	rep := Report{ResumeToken: c.TokenCount, ResumeOffset: c.StreamOffset, Size: size, TornAt: -1,
		Packets: c.Packets, LastSeq: c.LastSeq, TokenCount: c.TokenCount, Fingerprint: c.Fingerprint}
	rep.CutBytes = size - c.StreamOffset
	if size < c.StreamOffset {
		rep.problem("stream is %d bytes, shorter than the checkpointed offset %d (data that was reported durable is gone)",
			size, c.StreamOffset)
		return rep
	}
	r, err := stream.NewReader(f, c.StreamOffset)
	if err != nil {
		rep.problem("stream header: %v", err)
		return rep
	}
	if cm, ok := r.Header().Meta["client_metadata"].(map[string]any); ok {
		rep.StreamFingerprint, _ = cm["fingerprint"].(string)
	}
	if rep.StreamFingerprint != c.Fingerprint {
		rep.problem("fingerprint: checkpoint %q, stream header %q (another capture config or model)",
			c.Fingerprint, rep.StreamFingerprint)
	}
	pre, errs := stream.CheckPrefix(r, stream.ResumeExpect{AppendAt: c.StreamOffset, LastSeq: c.LastSeq,
		LastCRC: c.LastPacketCRC, Packets: c.Packets}, nil)
	for _, err := range errs {
		rep.problem("%v", err)
	}
	// What a resume does not name but the checkpoint file records: checked here only.
	if pre.Tokens != c.TokenCount {
		rep.problem("tokens: %d TOKEN packets before the offset, checkpoint says %d", pre.Tokens, c.TokenCount)
	}
	if pre.Last != nil && pre.Last.Offset != c.LastPacketOffset {
		rep.problem("last packet starts at %d, checkpoint says %d", pre.Last.Offset, c.LastPacketOffset)
	}
	rep.Resumable = len(rep.Problems) == 0
	describeTail(&rep, f, size, c.StreamOffset)
	return rep
}

// describeTail counts what lies after the checkpointed offset: whole packets, a torn one,
// END and INDEX.
func describeTail(rep *Report, f io.ReaderAt, size, from int64) {
	if size == from {
		return
	}
	r, err := stream.NewReader(f, size)
	if err != nil {
		return
	}
	off := from
	for off < size {
		if size-off == stream.FooterLen && rep.CutIndex {
			return
		}
		p, err := r.ReadHeader(off)
		if err != nil {
			rep.TornAt = off
			return
		}
		switch p.Type {
		case stream.TypeEnd:
			var em stream.EndMeta
			_ = json.Unmarshal(p.Meta, &em) // verify reports a bad END; here only the status matters
			rep.CutEnd = em.Status
		case stream.TypeIndex:
			rep.CutIndex = true
		default:
			rep.CutPackets++
			if p.Type == stream.TypeToken {
				rep.CutTokens++
			}
		}
		off += p.Len
	}
}

// CheckFile opens the stream at path read-only and checks it against the checkpoint at
// ckptPath ("" for the default one).
func CheckFile(path, ckptPath string) (Report, *Checkpoint, error) {
	if ckptPath == "" {
		ckptPath = DefaultPath(path)
	}
	c, err := Load(ckptPath)
	if err != nil {
		return Report{Stream: path, Checkpoint: ckptPath}, nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return Report{Stream: path, Checkpoint: ckptPath}, c, fmt.Errorf("open stream: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return Report{Stream: path, Checkpoint: ckptPath}, c, fmt.Errorf("stat stream: %w", err)
	}
	rep := Check(f, st.Size(), c)
	rep.Stream, rep.Checkpoint = path, ckptPath
	return rep, c, nil
}

// Repair cuts the stream at path back to its checkpoint: after checking it (a stream that
// does not match is left alone: ErrMismatch) it takes the stream's lock, so a live capture
// is never cut (ErrInUse), truncates it to the checkpointed offset and syncs. The result is
// the stream as it was when the checkpoint was made: a resume appends there.
func Repair(path, ckptPath string) (Report, error) {
	if ckptPath == "" {
		ckptPath = DefaultPath(path)
	}
	c, err := Load(ckptPath)
	if err != nil {
		return Report{Stream: path, Checkpoint: ckptPath}, err
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return Report{Stream: path, Checkpoint: ckptPath}, fmt.Errorf("open stream: %w", err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		if errors.Is(err, unix.EWOULDBLOCK) {
			return Report{Stream: path, Checkpoint: ckptPath}, fmt.Errorf("%s: %w", path, ErrInUse)
		}
		return Report{Stream: path, Checkpoint: ckptPath}, fmt.Errorf("lock stream: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		return Report{Stream: path, Checkpoint: ckptPath}, fmt.Errorf("stat stream: %w", err)
	}
	rep := Check(f, st.Size(), c)
	rep.Stream, rep.Checkpoint = path, ckptPath
	if !rep.Resumable {
		return rep, fmt.Errorf("%s: %s: %w", path, rep.Problems[0], ErrMismatch)
	}
	if rep.CutBytes == 0 {
		return rep, nil
	}
	if err := f.Truncate(c.StreamOffset); err != nil {
		return rep, fmt.Errorf("truncate stream: %w", err)
	}
	if err := f.Sync(); err != nil {
		return rep, fmt.Errorf("sync stream: %w", err)
	}
	return rep, nil
}
