package upload

import (
	"encoding/binary"
	"fmt"
	"os"
	"sync"

	"github.com/strap-llm/strap/internal/crc32c"
	"github.com/strap-llm/strap/internal/stream"
)

// StreamCRCs is the CRC record (CRCSource) of a finished stream file, for `strapd upload`
// of a capture: each part's CRC32C comes from the CRCs the writer stored in the packets
// (combined, the CRC field patched in by linearity as stream.RangeCRCs does while writing)
// instead of from reading the whole part back, which was most of the CPU of `strapd
// upload` (docs/PERFORMANCE.md "Upload to object storage"). Only the bytes of a packet cut
// by a part boundary, from the packet's start to the boundary, are read.
//
// The stored CRCs are trusted to name the bytes: a file damaged since it was written makes
// the server refuse the part as not matching its CRC32C, and the upload then reads its parts
// back (Upload.UseCRCs), as with a capture's own record.
type StreamCRCs struct {
	f      *os.File
	end    int64  // the bytes the record covers: [0, end)
	endCRC uint32 // CRC32C of [0, end)

	mu sync.Mutex
	// at holds, for each part boundary inside [0, end), the start of the piece (file
	// header, packet, footer) that holds it and the CRC32C of the bytes before that start;
	// once asked for, the boundary itself and its CRC32C.
	at map[int64]anchor
}

type anchor struct {
	start int64
	crc   uint32 // of [0, start)
}

// NewStreamCRCs walks the packet headers of the stream file f (size bytes) and notes what
// each multiple of grain needs. A file that is not a stream, or whose walk stops early (a
// torn last packet), is covered as far as its packets go; the parts past that are read back.
func NewStreamCRCs(f *os.File, size, grain int64) (*StreamCRCs, error) {
	if grain <= 0 {
		return nil, fmt.Errorf("part size %d", grain)
	}
	r, err := stream.NewReader(f, size)
	if err != nil {
		return nil, err
	}
	s := &StreamCRCs{f: f, at: map[int64]anchor{}}
	next := grain // the next part boundary to note
	add := func(start, n int64, crc uint32) {
		for ; next < start+n; next += grain {
			s.at[next] = anchor{start: start, crc: s.endCRC}
		}
		s.endCRC = crc32c.Combine(s.endCRC, crc, n)
		s.end = start + n
	}
	data := r.Header().DataOffset
	c, err := fileCRC(f, 0, data, make([]byte, crcBufSize))
	if err != nil {
		return nil, err
	}
	add(0, data, c)
	sc := r.Scan(true)
	for sc.Next() {
		p := sc.Packet()
		if p.Offset != s.end || p.Len < crcFieldEnd {
			break
		}
		add(p.Offset, p.Len, storedPacketCRC(p.CRC, p.Len))
	}
	if sc.Footer() && s.end == size-stream.FooterLen {
		c, err := fileCRC(f, s.end, stream.FooterLen, make([]byte, stream.FooterLen))
		if err != nil {
			return nil, err
		}
		add(s.end, stream.FooterLen, c)
	}
	for k := range s.at {
		if k >= s.end {
			delete(s.at, k)
		}
	}
	return s, nil
}

// crcFieldEnd: a packet's CRC field is its bytes [20, 24).
const crcFieldEnd = 24

// storedPacketCRC is the CRC32C of a packet's n bytes as stored, from its CRC field (the CRC
// of those bytes with the field zero): the field's bytes, followed by n-24 zero bytes, added
// by linearity.
func storedPacketCRC(field uint32, n int64) uint32 {
	var fb [4]byte
	binary.LittleEndian.PutUint32(fb[:], field)
	return field ^ crc32c.Shift(crc32c.Linear(fb[:]), n-crcFieldEnd)
}

// Covered is how many of the file's first bytes the record covers.
func (s *StreamCRCs) Covered() int64 { return s.end }

// At is the CRC32C of the file's bytes [0, off), when off is a part boundary or the end of
// what the record covers: a boundary inside a packet reads that packet from its start to
// off (once). Safe for use from several goroutines.
func (s *StreamCRCs) At(off int64) (uint32, bool) {
	if off == s.end {
		return s.endCRC, true
	}
	if off == 0 {
		return 0, true
	}
	s.mu.Lock()
	a, ok := s.at[off]
	s.mu.Unlock()
	if !ok {
		return 0, false
	}
	if a.start == off {
		return a.crc, true
	}
	c, err := fileCRC(s.f, a.start, off-a.start, make([]byte, min(crcBufSize, off-a.start)))
	if err != nil {
		return 0, false // read back by the upload, which reports the error
	}
	v := crc32c.Combine(a.crc, c, off-a.start)
	s.mu.Lock()
	if _, ok := s.at[off]; ok {
		s.at[off] = anchor{start: off, crc: v}
	}
	s.mu.Unlock()
	return v, true
}

// Forget drops the boundaries before off (parts acknowledged).
func (s *StreamCRCs) Forget(off int64) {
	s.mu.Lock()
	for k := range s.at {
		if k < off {
			delete(s.at, k)
		}
	}
	s.mu.Unlock()
}
