package stream

import (
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/strap-llm/strap/internal/codec"
)

// ResumeExpect is what the prefix [0, AppendAt) of a stream must end with.
type ResumeExpect struct {
	// AppendAt is the prefix length: the end of the last checkpointed packet.
	AppendAt int64
	// LastSeq is the last packet's sequence number (0 when the prefix has no packet).
	LastSeq uint64
	// LastCRC is the last packet's CRC32C field.
	LastCRC uint32
	// Packets is the number of TENSOR, DROP and TOKEN packets in the prefix.
	Packets uint64
	// Journal is the index journal of an upload that freed the start of the prefix
	// (--upload-free-local); nil: none. A prefix with freed bytes cannot resume without it.
	Journal *Journal
}

// Resume continues the stream in f at e.AppendAt. f must be readable (O_RDWR): the prefix
// is walked header by header to rebuild the index and counters, it must end exactly at
// AppendAt on a packet boundary, hold no END or INDEX, and its last packet must have seq
// LastSeq, CRC LastCRC (checked against the bytes, not only the header field) and be the
// Packets-th. Then f is truncated to AppendAt and writing continues there. The header is
// kept as it is (it already names the capture). It returns the Writer and the last
// sequence number of the prefix.
func Resume(f *os.File, e ResumeExpect) (*Writer, error) { return ResumeWith(f, e, WriterOptions{}) }

// ResumeWith is Resume with options. With o.Direct, the bytes of the prefix's last partial
// block are read back, because O_DIRECT writes from that block's start.
func ResumeWith(f *os.File, e ResumeExpect, o WriterOptions) (*Writer, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat stream file: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("resume needs a regular file: %w", ErrResumeMismatch)
	}
	if e.AppendAt <= 0 || e.AppendAt > st.Size() {
		return nil, fmt.Errorf("append_at %d, file holds %d bytes: %w", e.AppendAt, st.Size(), ErrResumeMismatch)
	}
	r, err := NewReader(f, e.AppendAt)
	if err != nil {
		return nil, fmt.Errorf("stream header: %w", err)
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("stream file: %w", err)
	}
	w := &Writer{f: f, rc: rc, regular: true, codecOK: map[codec.ID]bool{},
		names: map[string]uint32{}}
	start, base, err := freedBase(f, r, e, w)
	if err != nil {
		return nil, err
	}
	pre, errs := CheckPrefixFrom(r, start, base, e, func(p *PacketInfo) {
		w.account(p.Name, p.Type, p.Flags, p.Seq, p.Step, p.Forward, p.Offset)
	})
	if len(errs) > 0 {
		return nil, errs[0]
	}
	if pre.Last != nil {
		w.lastOff, w.lastCRC = pre.Last.Offset, pre.Last.CRC
	}
	if st.Size() > e.AppendAt {
		// A client asked strapd to cut a finished capture (one that does not check, or a
		// stale checkpoint): refused. The clients cut a stream they resume themselves.
		if full, err := NewReader(f, st.Size()); err == nil {
			if end, done := CompleteAfter(full, e.AppendAt); done {
				return nil, fmt.Errorf("the stream ends with END (complete) at offset %d: resuming at append_at %d would cut %d bytes "+
					"(%d packets, the END and INDEX) of a finished capture; nothing was cut (a client that means to resume it, "+
					"having found its checkpoint, cuts it back itself first: docs/CHECKPOINTS.md 4): %w",
					end.Offset, e.AppendAt, st.Size()-e.AppendAt, end.Packets, ErrComplete)
			}
		}
	}
	if err := f.Truncate(e.AppendAt); err != nil {
		return nil, fmt.Errorf("truncate stream file to %d: %w", e.AppendAt, err)
	}
	if _, err := f.Seek(e.AppendAt, io.SeekStart); err != nil {
		return nil, fmt.Errorf("seek stream file: %w", err)
	}
	w.off, w.written = e.AppendAt, e.AppendAt
	if o.Direct {
		lead := make([]byte, e.AppendAt&(dirAlign-1))
		if _, err := f.ReadAt(lead, e.AppendAt-int64(len(lead))); err != nil {
			return nil, fmt.Errorf("read stream file: %w", err)
		}
		w.startDirect(lead, o.Staging)
	}
	w.writeBehind()
	return w, nil
}

// freedBase is where the walk of a resumed prefix starts and what comes before it. A
// prefix with no freed bytes is walked from its first packet. One whose start was freed
// after its upload takes the entries of the packets up to the last journal record that
// ends inside the prefix (they go into w's index as the walk's would) and is walked from
// there: the freed bytes must all lie before that record's end.
func freedBase(f *os.File, r *Reader, e ResumeExpect, w *Writer) (int64, Prefix, error) {
	data := r.Header().DataOffset
	hs, he, freed, err := FreedRange(f, data, e.AppendAt)
	if err != nil {
		return 0, Prefix{}, fmt.Errorf("look for freed bytes in the stream: %w", err)
	}
	if !freed {
		return data, Prefix{}, nil
	}
	if e.Journal == nil {
		return 0, Prefix{}, fmt.Errorf("bytes [%d, %d) of the prefix were freed after their upload (--upload-free-local), and this resume has no index journal of them: resume with the upload to the same target and the same --upload-state-dir: %w", hs, he, ErrResumeMismatch)
	}
	entries, rec, ok := e.Journal.Upto(e.AppendAt)
	if !ok || rec.End < he {
		return 0, Prefix{}, fmt.Errorf("bytes [%d, %d) of the prefix were freed, but the index journal describes the stream only up to %d (of append_at %d): the freed packets cannot be accounted for: %w", hs, he, rec.End, e.AppendAt, ErrResumeMismatch)
	}
	if rec.End == e.AppendAt && rec.Packets > 0 && rec.LastOffset < he {
		return 0, Prefix{}, fmt.Errorf("bytes [%d, %d) of the prefix were freed, its last packet (at %d) among them: a resume must keep at least the prefix of the last-but-one checkpoint: %w", hs, he, rec.LastOffset, ErrResumeMismatch)
	}
	for _, p := range entries {
		w.account(p.Name, p.Type, p.Flags, p.Seq, p.Step, p.Forward, p.Offset)
	}
	w.journaled = len(entries)
	base := Prefix{Packets: rec.Packets, Tokens: rec.Tokens}
	if rec.Packets > 0 {
		base.Last = &PacketInfo{Offset: rec.LastOffset, Header: Header{Seq: rec.LastSeq}, CRC: rec.LastCRC}
	}
	return rec.End, base, nil
}

// FreedRange reports the freed bytes (holes, SEEK_HOLE/SEEK_DATA) in f's [from, to): from
// the first hole's start to the end of the last one before to. It never reads the bytes:
// a run of zeros that is data is not a hole. A file system without SEEK_HOLE reports none.
// It moves f's file offset.
func FreedRange(f *os.File, from, to int64) (start, end int64, ok bool, err error) {
	fd := int(f.Fd())
	h, err := unix.Seek(fd, from, unix.SEEK_HOLE)
	if errors.Is(err, unix.ENXIO) || (err == nil && h >= to) {
		return 0, 0, false, nil
	}
	if err != nil {
		return 0, 0, false, err
	}
	start, pos := h, h
	for {
		d, err := unix.Seek(fd, pos, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) || (err == nil && d >= to) {
			return start, to, true, nil
		}
		if err != nil {
			return 0, 0, false, err
		}
		h2, err := unix.Seek(fd, d, unix.SEEK_HOLE)
		if err != nil {
			return 0, 0, false, err
		}
		if h2 >= to {
			return start, d, true, nil
		}
		pos = h2
	}
}
