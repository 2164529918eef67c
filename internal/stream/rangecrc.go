package stream

import (
	"encoding/binary"
	"hash/crc32"
	"sync"

	"github.com/strap-llm/strap/internal/crc32c"
)

// RangeCRCs records, as the Writer writes, the CRC32C of the file's bytes [0, off) at every
// multiple off of a grain (an upload's part size), so that an upload can name each part's
// CRC32C (crc32c.Suffix of the two ends) without reading the part back from the disk
// (docs/PERFORMANCE.md "Upload to object storage"). It costs no pass over the bytes: each
// packet's CRC is computed anyway; the file's CRC goes on by crc32c.Combine, the packet's
// own CRC field (zero while its CRC was taken) is patched in by linearity, and only at a
// grain boundary inside a packet is the packet's running CRC split, which it is anyway.
//
// Only bytes the writer wrote into the file in order count: a packet that fails is
// dropped (abort), and anything unexpected (bytes fed out of order) turns the record off
// for good, so that At answers nothing rather than something wrong. A resumed stream
// keeps no record (its prefix's CRC is not known without reading it).
type RangeCRCs struct {
	grain int64

	mu     sync.Mutex
	at     map[int64]uint32 // committed: CRC of [0, off) for grain multiples
	endOff int64            // committed bytes: the CRC of [0, endOff) is endCRC
	endCRC uint32
	broken bool

	// The writer goroutine's alone: the piece (packet, file header, footer) being fed.
	start int64 // its file offset (== endOff when fed in order)
	pos   int64 // file offset of its next byte
	next  int64 // the next grain boundary after start
	pend  []pendingCRC
}

// pendingCRC is a grain boundary inside the piece being fed: the piece's running CRC
// (its CRC field still zero) over its first n bytes.
type pendingCRC struct {
	n   int64
	crc uint32
}

func newRangeCRCs(grain int64) *RangeCRCs {
	if grain <= 0 {
		return nil
	}
	return &RangeCRCs{grain: grain, at: map[int64]uint32{0: 0}}
}

// At is the CRC32C of the file's bytes [0, off), when off is a grain multiple or the end of
// what was written and the record holds it. Safe for use from any goroutine.
func (r *RangeCRCs) At(off int64) (uint32, bool) {
	if r == nil {
		return 0, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.broken || off > r.endOff {
		return 0, false
	}
	if off == r.endOff {
		return r.endCRC, true
	}
	c, ok := r.at[off]
	return c, ok
}

// Forget drops the values below off (parts already sent).
func (r *RangeCRCs) Forget(off int64) {
	if r == nil {
		return
	}
	r.mu.Lock()
	for k := range r.at {
		if k < off {
			delete(r.at, k)
		}
	}
	r.mu.Unlock()
}

// begin starts a piece at file offset off.
func (r *RangeCRCs) begin(off int64) {
	if r == nil {
		return
	}
	r.pend = r.pend[:0]
	r.start, r.pos = off, off
	r.next = (off/r.grain + 1) * r.grain
	r.mu.Lock()
	if off != r.endOff {
		r.broken = true
	}
	r.mu.Unlock()
}

// update is crc32.Update(crc, Castagnoli, b) for the piece's next bytes b, noting the
// running value at every grain boundary inside the piece.
func (r *RangeCRCs) update(crc uint32, b []byte) uint32 {
	if r == nil {
		return crc32.Update(crc, castagnoli, b)
	}
	for int64(len(b)) > r.next-r.pos {
		k := r.next - r.pos
		crc = crc32.Update(crc, castagnoli, b[:k])
		b = b[k:]
		r.pos = r.next
		r.pend = append(r.pend, pendingCRC{n: r.pos - r.start, crc: crc})
		r.next += r.grain
	}
	r.pos += int64(len(b))
	return crc32.Update(crc, castagnoli, b)
}

// commit ends a packet of n bytes whose CRC field (bytes 20–23, zero while the CRC was
// computed) holds field: the values noted inside it and its end become the file's.
func (r *RangeCRCs) commit(n int64, field uint32) { r.commitPiece(n, field, true) }

// raw feeds and commits bytes written as they are (file header, footer).
func (r *RangeCRCs) raw(off int64, b []byte) {
	if r == nil {
		return
	}
	r.begin(off)
	r.commitPiece(int64(len(b)), r.update(0, b), false)
}

// commitPiece ends the piece of n bytes: crc is its CRC field (hasField: a packet, whose
// field was zero while its CRC was taken) or the CRC of its bytes.
func (r *RangeCRCs) commitPiece(n int64, crc uint32, hasField bool) {
	if r == nil {
		return
	}
	var fb [4]byte
	binary.LittleEndian.PutUint32(fb[:], crc)
	// patched is the piece's first m bytes' CRC with the field's bytes in it.
	patched := func(c uint32, m int64) uint32 {
		if !hasField || m <= 20 {
			return c
		}
		k := min(m, 24) - 20
		return c ^ crc32c.Shift(crc32c.Linear(fb[:k]), m-20-k)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.broken || r.pos-r.start != n || r.start != r.endOff {
		r.broken = true
		return
	}
	for _, p := range r.pend {
		r.at[r.start+p.n] = crc32c.Combine(r.endCRC, patched(p.crc, p.n), p.n)
	}
	whole := patched(crc, n) // a packet's field is the CRC of its bytes with the field zero
	r.endCRC = crc32c.Combine(r.endCRC, whole, n)
	r.endOff += n
	if r.endOff%r.grain == 0 {
		r.at[r.endOff] = r.endCRC
	}
	r.pend = r.pend[:0]
}

// abort drops the piece being fed (a packet that was not written after all).
func (r *RangeCRCs) abort() {
	if r != nil {
		r.pend = r.pend[:0]
	}
}

// payloadCRC is the package's payloadCRC, noting grain boundaries.
func (r *RangeCRCs) payloadCRC(crc uint32, blocks []Block) uint32 {
	for _, b := range blocks {
		crc = r.update(crc, b.Data)
	}
	return crc
}
