package checkpoint

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"

	"github.com/strap-llm/strap/internal/stream"
)

// Sources of a resume point (Report.Source).
const (
	// SourceCheckpoint: the stream is resumed at its checkpoint's offset.
	SourceCheckpoint = "checkpoint"
	// SourceStream: the stream is resumed at the end of the intact run of packets past
	// its checkpoint (or from its first packet when there is no checkpoint).
	SourceStream = "stream"
)

// Report says whether a stream can be resumed, from where, and what a resume cuts.
type Report struct {
	// Stream and Checkpoint are the files looked at (Checkpoint "" when there is none).
	Stream     string `json:"stream"`
	Checkpoint string `json:"checkpoint"`
	// Resumable: the stream's first CheckpointOffset bytes are exactly what the
	// checkpoint describes (or there is no checkpoint and the stream header is valid), so
	// a resume (or --repair) can cut at ResumeOffset and go on.
	Resumable bool `json:"resumable"`
	// Problems names every difference found when not resumable.
	Problems []string `json:"problems,omitempty"`
	// Source says where ResumeOffset comes from: SourceCheckpoint or SourceStream.
	Source string `json:"source"`
	// ResumeToken is the step the resumed capture starts from (tokens kept).
	ResumeToken uint64 `json:"resume_token"`
	// ResumeOffset is where the stream is cut and appended to: the checkpoint's offset, or
	// the end of the last intact TOKEN packet after it.
	ResumeOffset int64 `json:"resume_offset"`
	// CheckpointOffset is the checkpoint's offset: the durable floor (0: no checkpoint).
	CheckpointOffset int64 `json:"checkpoint_offset"`
	// Size is the stream's current size; CutBytes = Size - ResumeOffset.
	Size     int64 `json:"size"`
	CutBytes int64 `json:"cut_bytes"`
	// CutPackets counts the complete packets after ResumeOffset that a resume removes
	// (TENSOR, DROP, TOKEN; END and INDEX are listed in CutEnd/CutIndex); CutTokens the
	// TOKEN packets among them, which the resumed capture generates again.
	CutPackets uint64 `json:"cut_packets"`
	CutTokens  uint64 `json:"cut_tokens"`
	CutEnd     string `json:"cut_end,omitempty"`
	CutIndex   bool   `json:"cut_index"`
	// TornAt is the offset of a packet cut short after ResumeOffset (-1: none).
	TornAt int64 `json:"torn_at"`
	// Packets and LastSeq describe the prefix kept; TokenCount is the checkpoint's.
	Packets    uint64 `json:"packets"`
	LastSeq    uint64 `json:"last_seq"`
	TokenCount uint64 `json:"token_count"`
	// Fingerprint is the checkpoint's; StreamFingerprint the stream header's.
	Fingerprint       string `json:"fingerprint"`
	StreamFingerprint string `json:"stream_fingerprint"`
	// Freed is [start, end) of the prefix's bytes freed after their upload (strapd serve
	// --upload-free-local; holes, found by SEEK_HOLE); absent: none. The packets there are
	// not walked: the checkpoint is trusted for them (FreedNote says what was checked).
	Freed     []int64 `json:"freed,omitempty"`
	FreedNote string  `json:"freed_note,omitempty"`
	// Complete: the capture finished (an END with status "complete" follows the resume
	// point, and there is no checkpoint), so there is nothing to resume: Resumable is false
	// and a resume, or Repair without force, cuts nothing. CutBytes still says what a
	// forced cut would drop.
	Complete bool `json:"complete"`
}

func (r *Report) problem(format string, args ...any) {
	r.Problems = append(r.Problems, fmt.Sprintf(format, args...))
}

// Check compares the stream in f (size bytes) with c and finds where a resume goes on. c
// is the floor: the stream must hold exactly what it describes. Past it (from the first
// packet when c is nil) the intact run of packets is kept up to its last TOKEN packet
// (stream.IntactRun). A stream whose capture finished — END "complete" after that point and
// no checkpoint (a clean finish deletes it) — is reported Complete and not resumable:
// resuming it would cut a finished capture. With its checkpoint beside it, an END
// "complete" is a capture stopped by an error in the capturing code (the Python client
// closes the session cleanly and keeps the checkpoint, docs/CHECKPOINTS.md 4), resumable
// as any other. It never changes the file; what it finds is in the Report.
func Check(f io.ReaderAt, size int64, c *Checkpoint) Report {
	rep := check(f, size, c)
	if c == nil && rep.Resumable && rep.CutEnd == "complete" {
		rep.Resumable, rep.Complete = false, true
		what := fmt.Sprintf("%d packets (%d tokens)", rep.CutPackets, rep.CutTokens)
		if rep.CutIndex {
			what += ", END and INDEX"
		} else {
			what += " and END"
		}
		rep.problem("the capture is complete (its stream ends with END, status complete): nothing to resume; "+
			"a resume at token %d (offset %d) would cut %d bytes: %s", rep.ResumeToken, rep.ResumeOffset, rep.CutBytes, what)
	}
	return rep
}

func check(f io.ReaderAt, size int64, c *Checkpoint) Report {
	if c == nil {
		return checkStream(f, size)
	}
	rep := Report{Source: SourceCheckpoint, ResumeToken: c.TokenCount, ResumeOffset: c.StreamOffset,
		CheckpointOffset: c.StreamOffset, Size: size, TornAt: -1, Packets: c.Packets, LastSeq: c.LastSeq,
		TokenCount: c.TokenCount, Fingerprint: c.Fingerprint}
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
	if of, ok := f.(*os.File); ok {
		if s, e, freed, err := stream.FreedRange(of, r.Header().DataOffset, c.StreamOffset); err != nil {
			rep.problem("look for freed bytes: %v", err)
			return rep
		} else if freed {
			checkFreed(&rep, r, c, s, e)
			if rep.Resumable = len(rep.Problems) == 0; rep.Resumable {
				if full, err := stream.NewReader(f, size); err == nil {
					extend(&rep, stream.IntactRun(full, c.StreamOffset, c.TokenCount))
				}
			}
			describeTail(&rep, f, size, rep.ResumeOffset)
			return rep
		}
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
	if rep.Resumable {
		if full, err := stream.NewReader(f, size); err == nil {
			extend(&rep, stream.IntactRun(full, c.StreamOffset, c.TokenCount))
		}
	}
	describeTail(&rep, f, size, rep.ResumeOffset)
	return rep
}

// checkFreed checks a checkpointed prefix whose bytes [s, e) were freed after their upload:
// the packets there cannot be walked, so the checkpoint is trusted for them, as the
// client's resume does (checkpoint.py): what is checked is the header (read already), the
// checkpoint's last packet (its bytes, seq and CRC, ending at the checkpointed offset) and
// that the freed tokens have their other copy: the token log the checkpoint vouches for, or
// 1.3.1's tokens list in it (the freed TOKEN packets are nowhere else).
func checkFreed(rep *Report, r *stream.Reader, c *Checkpoint, s, e int64) {
	rep.Freed = []int64{s, e}
	rep.FreedNote = fmt.Sprintf("bytes [%d, %d) were freed after their upload (strapd serve --upload-free-local): the packets there are "+
		"not checked, the checkpoint is trusted for them; checked: the file header, the checkpoint's last packet and its token log (or 1.3.1's tokens list); "+
		"strapd resumes it from the upload's index journal in its --upload-state-dir", s, e)
	if c.Packets == 0 || e > c.LastPacketOffset {
		rep.problem("bytes [%d, %d) were freed, up to or past the checkpoint's last packet (at %d): the prefix cannot be checked", s, e, c.LastPacketOffset)
		return
	}
	switch {
	case c.ListedTokens >= 0:
		if uint64(c.ListedTokens) != c.TokenCount {
			rep.problem("the checkpoint lists %d tokens, its token_count says %d", c.ListedTokens, c.TokenCount)
		}
	case c.TokenLog != nil:
		if err := checkTokenLog(c); err != nil {
			rep.problem("%v", err)
		}
	default:
		rep.problem("bytes [%d, %d) were freed and the checkpoint has neither a token log nor 1.3.1's tokens list: the freed tokens are nowhere else, this capture cannot be resumed", s, e)
	}
	p, _, err := r.ReadPacket(c.LastPacketOffset)
	switch {
	case err != nil:
		rep.problem("the checkpoint's last packet (at %d): %v", c.LastPacketOffset, err)
	case p.Offset+p.Len != c.StreamOffset:
		rep.problem("the checkpoint's last packet (at %d) ends at %d, not at the checkpointed offset %d", p.Offset, p.Offset+p.Len, c.StreamOffset)
	case p.Type != stream.TypeTensor && p.Type != stream.TypeDrop && p.Type != stream.TypeToken:
		rep.problem("%v packet at offset %d inside the checkpointed prefix", p.Type, p.Offset)
	case p.Seq != c.LastSeq:
		rep.problem("last packet has seq %d, checkpoint says %d", p.Seq, c.LastSeq)
	case p.CRC != c.LastPacketCRC:
		rep.problem("last packet has crc %#08x, checkpoint says %#08x", p.CRC, c.LastPacketCRC)
	}
}

// checkStream finds the resume point of a stream that has no checkpoint.
func checkStream(f io.ReaderAt, size int64) Report {
	rep := Report{Source: SourceStream, Size: size, TornAt: -1, CutBytes: size}
	r, err := stream.NewReader(f, size)
	if err != nil {
		rep.problem("no checkpoint, and the stream header is not valid: %v", err)
		return rep
	}
	if of, ok := f.(*os.File); ok {
		if s, e, freed, _ := stream.FreedRange(of, r.Header().DataOffset, size); freed {
			rep.Freed = []int64{s, e}
			rep.problem("no checkpoint, and bytes [%d, %d) of the stream were freed after their upload (strapd serve --upload-free-local): nothing to resume from", s, e)
			return rep
		}
	}
	if cm, ok := r.Header().Meta["client_metadata"].(map[string]any); ok {
		rep.StreamFingerprint, _ = cm["fingerprint"].(string)
	}
	rep.Resumable = true
	rep.ResumeOffset = r.Header().DataOffset
	extend(&rep, stream.IntactRun(r, rep.ResumeOffset, 0))
	rep.CutBytes = size - rep.ResumeOffset
	describeTail(&rep, f, size, rep.ResumeOffset)
	return rep
}

// extend moves the resume point to the end of the intact run past it.
func extend(rep *Report, run stream.Intact) {
	if run.Last == nil {
		return
	}
	rep.Source = SourceStream
	rep.ResumeOffset = run.End
	rep.ResumeToken += run.Tokens
	rep.Packets += run.Packets
	rep.LastSeq = run.Last.Seq
	rep.CutBytes = rep.Size - run.End
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
// ckptPath ("" for the default one). When the default checkpoint does not exist the
// stream is checked alone (its intact prefix); a named one must exist.
func CheckFile(path, ckptPath string) (Report, *Checkpoint, error) {
	c, ckptPath, err := loadOptional(path, ckptPath)
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

// loadOptional loads the checkpoint at ckptPath, or at the default path when it is "":
// then a missing file is no error (nil, "").
func loadOptional(path, ckptPath string) (*Checkpoint, string, error) {
	if ckptPath != "" {
		c, err := Load(ckptPath)
		return c, ckptPath, err
	}
	ckptPath = DefaultPath(path)
	c, err := Load(ckptPath)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, "", nil
	}
	return c, ckptPath, err
}

// Repair cuts the stream at path back to where a resume goes on (Check): after checking
// it (a stream that does not match its checkpoint is left alone: ErrMismatch; a complete
// capture too, unless force: stream.ErrComplete) it takes the stream's lock, so a live
// capture is never cut (ErrInUse), truncates it and syncs. A resume then appends there.
func Repair(path, ckptPath string, force bool) (Report, error) {
	c, ckptPath, err := loadOptional(path, ckptPath)
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
	switch {
	case rep.Complete && !force:
		return rep, fmt.Errorf("%s: %s: %w", path, rep.Problems[0], stream.ErrComplete)
	case !rep.Resumable && !rep.Complete:
		return rep, fmt.Errorf("%s: %s: %w", path, rep.Problems[0], ErrMismatch)
	}
	if rep.CutBytes == 0 {
		return rep, nil
	}
	if err := f.Truncate(rep.ResumeOffset); err != nil {
		return rep, fmt.Errorf("truncate stream: %w", err)
	}
	if err := f.Sync(); err != nil {
		return rep, fmt.Errorf("sync stream: %w", err)
	}
	return rep, nil
}

// checkTokenLog checks the token log beside c's file: its first c.TokenLog.Bytes bytes are
// there, have the CRC32C the checkpoint names, and hold c.TokenLog.Tokens lines.
func checkTokenLog(c *Checkpoint) error {
	if c.Path == "" {
		return fmt.Errorf("the checkpoint's token log: the checkpoint was not read from a file, so its log cannot be found")
	}
	p := TokenLogPath(c.Path)
	f, err := os.Open(p)
	if err != nil {
		return fmt.Errorf("the checkpoint's token log: %w", err)
	}
	defer f.Close()
	h := crc32.New(crc32.MakeTable(crc32.Castagnoli))
	lines := &lineCounter{}
	n, err := io.Copy(io.MultiWriter(h, lines), io.LimitReader(f, c.TokenLog.Bytes))
	switch {
	case err != nil:
		return fmt.Errorf("the checkpoint's token log %s: %w", p, err)
	case n < c.TokenLog.Bytes:
		return fmt.Errorf("the token log %s is %d bytes, the checkpoint vouches for %d", p, n, c.TokenLog.Bytes)
	case h.Sum32() != c.TokenLog.CRC32C:
		return fmt.Errorf("the token log %s: its first %d bytes have CRC32C %#08x, the checkpoint says %#08x", p, n, h.Sum32(), c.TokenLog.CRC32C)
	case lines.n != c.TokenLog.Tokens || (n > 0 && !lines.lastNL):
		return fmt.Errorf("the token log %s holds %d lines in its first %d bytes, the checkpoint says %d tokens", p, lines.n, n, c.TokenLog.Tokens)
	}
	return nil
}

// lineCounter counts newlines written to it and whether the last byte was one.
type lineCounter struct {
	n      uint64
	lastNL bool
}

func (l *lineCounter) Write(b []byte) (int, error) {
	l.n += uint64(bytes.Count(b, []byte{'\n'}))
	if len(b) > 0 {
		l.lastNL = b[len(b)-1] == '\n'
	}
	return len(b), nil
}
