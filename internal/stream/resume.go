package stream

import (
	"fmt"
	"io"
	"os"

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
	pre, errs := CheckPrefix(r, e, func(p *PacketInfo) {
		w.account(p.Name, p.Type, p.Flags, p.Seq, p.Step, p.Forward, p.Offset)
	})
	if len(errs) > 0 {
		return nil, errs[0]
	}
	if pre.Last != nil {
		w.lastOff, w.lastCRC = pre.Last.Offset, pre.Last.CRC
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
