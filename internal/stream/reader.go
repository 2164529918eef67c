package stream

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"slices"
	"unicode/utf8"

	"github.com/strap-llm/strap/internal/codec"
	"github.com/strap-llm/strap/internal/dtype"
	"github.com/strap-llm/strap/internal/jsontext"
)

// FileHeader is the parsed file header.
type FileHeader struct {
	// Version is the format version (2).
	Version uint16
	// Flags is the header's flags field.
	Flags uint16
	// Meta is the metadata JSON object, parsed.
	Meta map[string]any
	// MetaRaw is the metadata JSON as stored.
	MetaRaw []byte
	// DataOffset is where the first packet starts.
	DataOffset int64
}

// PacketInfo is one packet's header as read from the file.
type PacketInfo struct {
	// Offset is the packet's start in the file.
	Offset int64
	// Len is the packet's total size: header_len + stored_len.
	Len int64
	Header
	Name string
	Meta []byte
	// CRC is the stored CRC32C.
	CRC uint32
}

// Reader reads a v2 stream from an io.ReaderAt of known size. Every length it reads is
// checked against the file size before anything is allocated for it.
type Reader struct {
	r      io.ReaderAt
	size   int64
	header FileHeader
	codecs map[codec.ID]codec.Codec
}

// NewReader parses and checks the file header (magic, version, CRC, metadata JSON).
func NewReader(r io.ReaderAt, size int64) (*Reader, error) {
	if size < FileHeaderLen {
		if size >= 0 && size < 8 {
			var b [8]byte
			n, _ := r.ReadAt(b[:size], 0)
			if string(b[:n]) != FileMagic[:n] {
				return nil, atOffset(0, "file magic: %w", ErrBadMagic)
			}
		}
		return nil, atOffset(0, "file header: %d bytes: %w", size, ErrTruncated)
	}
	var h [FileHeaderLen]byte
	if _, err := r.ReadAt(h[:], 0); err != nil {
		return nil, atOffset(0, "read file header: %w", err)
	}
	if string(h[:8]) != FileMagic {
		return nil, atOffset(0, "file magic %q: %w", h[:8], ErrBadMagic)
	}
	le := binary.LittleEndian
	fh := FileHeader{Version: le.Uint16(h[8:]), Flags: le.Uint16(h[10:])}
	if fh.Version != Version {
		return nil, atOffset(8, "version %d: %w", fh.Version, ErrBadVersion)
	}
	metaLen := int64(le.Uint32(h[12:]))
	if metaLen > size-FileHeaderLen {
		return nil, atOffset(12, "meta_len %d past end of file (%d bytes): %w", metaLen, size, ErrTruncated)
	}
	fh.MetaRaw = make([]byte, metaLen)
	if _, err := r.ReadAt(fh.MetaRaw, FileHeaderLen); err != nil {
		return nil, atOffset(FileHeaderLen, "read metadata: %w", err)
	}
	crc := crc32.Update(crc32.Update(0, castagnoli, h[:16]), castagnoli, fh.MetaRaw)
	if got := le.Uint32(h[16:]); got != crc {
		return nil, atOffset(16, "file header crc %#08x, computed %#08x: %w", got, crc, ErrBadCRC)
	}
	if err := json.Unmarshal(fh.MetaRaw, &fh.Meta); err != nil || fh.Meta == nil {
		return nil, atOffset(FileHeaderLen, "metadata is not a JSON object: %w", ErrCorrupt)
	}
	if err := jsontext.Check(fh.MetaRaw); err != nil {
		return nil, atOffset(FileHeaderLen, "metadata: %v: %w", err, ErrCorrupt)
	}
	if le.Uint32(h[20:]) != 0 {
		return nil, atOffset(20, "file header reserved field %#x: %w", le.Uint32(h[20:]), ErrCorrupt)
	}
	fh.DataOffset = align8(FileHeaderLen + metaLen)
	if fh.DataOffset > size {
		return nil, atOffset(FileHeaderLen+metaLen, "header padding: %w", ErrTruncated)
	}
	// Neither the reserved field nor the padding is under the CRC: require zeros, so no
	// byte of the file escapes a check.
	var pad [8]byte
	padLen := fh.DataOffset - FileHeaderLen - metaLen
	if _, err := r.ReadAt(pad[:padLen], FileHeaderLen+metaLen); err != nil {
		return nil, atOffset(FileHeaderLen+metaLen, "read header padding: %w", err)
	}
	if pad != [8]byte{} {
		return nil, atOffset(FileHeaderLen+metaLen, "header padding not zero: %w", ErrCorrupt)
	}
	return &Reader{r: r, size: size, header: fh, codecs: map[codec.ID]codec.Codec{}}, nil
}

// OpenFile opens path read-only and returns a Reader over it; close the file when done.
func OpenFile(path string) (*Reader, *os.File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("open stream: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("stat stream: %w", err)
	}
	r, err := NewReader(f, st.Size())
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	return r, f, nil
}

// Header is the parsed file header.
func (r *Reader) Header() FileHeader { return r.header }

// Size is the file size the Reader was given.
func (r *Reader) Size() int64 { return r.size }

// Footer reads the footer: the INDEX offset, or ErrNoIndex when the last 16 bytes are no
// footer (a stream cut short). The offset is checked to lie inside the packet area.
func (r *Reader) Footer() (int64, error) {
	if r.size < r.header.DataOffset+FooterLen {
		return 0, ErrNoIndex
	}
	var b [FooterLen]byte
	if _, err := r.r.ReadAt(b[:], r.size-FooterLen); err != nil {
		return 0, atOffset(r.size-FooterLen, "read footer: %w", err)
	}
	if string(b[8:]) != FooterMagic {
		return 0, ErrNoIndex
	}
	off := binary.LittleEndian.Uint64(b[:8])
	if off < uint64(r.header.DataOffset) || off > uint64(r.size-FooterLen-PacketHeaderLen) {
		return 0, atOffset(r.size-FooterLen, "footer index_offset %d outside [%d, %d]: %w",
			off, r.header.DataOffset, r.size-FooterLen-PacketHeaderLen, ErrCorrupt)
	}
	return int64(off), nil
}

// ReadHeader reads and checks the packet header at off (magic, header_len, bounds and the
// rules between fields; not the CRC, which covers the payload too).
func (r *Reader) ReadHeader(off int64) (*PacketInfo, error) {
	p, err := r.readHeader(off)
	if err != nil {
		return nil, err
	}
	if terr := p.checkText(); terr != nil {
		// A damaged byte reads as bad text too: read the packet whole, so that a CRC that
		// disagrees is reported as the damage it is (as ReadPacket would).
		if _, _, err := r.ReadPacket(off); err != nil {
			return nil, err
		}
		return nil, terr
	}
	return p, nil
}

// checkText refuses a name or meta that is not valid UTF-8 (STREAM_FORMAT.md 3): a reader
// that turned it into a string as it is would hand out a name that differs from every
// valid one without saying so, and JSON decoding would rewrite it to U+FFFD.
func (p *PacketInfo) checkText() error {
	if !utf8.ValidString(p.Name) {
		return atOffset(p.Offset, "packet name %q is not valid UTF-8: %w", p.Name, ErrCorrupt)
	}
	if err := jsontext.Check(p.Meta); err != nil {
		return atOffset(p.Offset, "meta of packet %q: %v: %w", p.Name, err, ErrCorrupt)
	}
	return nil
}

// readHeader is ReadHeader without the text check, so ReadPacket can check the CRC first
// and report a damaged byte as damage rather than as bad text.
func (r *Reader) readHeader(off int64) (*PacketInfo, error) {
	rem := r.size - off
	if off < r.header.DataOffset || rem <= 0 {
		return nil, atOffset(off, "packet offset outside [%d, %d): %w", r.header.DataOffset, r.size, ErrCorrupt)
	}
	var fixed [PacketHeaderLen]byte
	n := int(min(rem, PacketHeaderLen))
	if _, err := r.r.ReadAt(fixed[:n], off); err != nil {
		return nil, atOffset(off, "read packet header: %w", err)
	}
	if n < PacketHeaderLen {
		if k := min(n, 4); string(fixed[:k]) != PacketMagic[:k] {
			return nil, atOffset(off, "packet magic %q: %w", fixed[:k], ErrBadMagic)
		}
		return nil, atOffset(off, "packet header: %d of %d bytes: %w", n, PacketHeaderLen, ErrTruncated)
	}
	h, err := parseHeader(fixed[:])
	if err != nil {
		return nil, &OffsetError{Offset: off, Err: err}
	}
	total := uint64(h.headerLen) + h.StoredLen
	if h.StoredLen > uint64(rem) || total > uint64(rem) {
		return nil, atOffset(off, "packet of %d+%d bytes, %d left in file: %w", h.headerLen, h.StoredLen, rem, ErrTruncated)
	}
	p := &PacketInfo{Offset: off, Len: int64(total), Header: h.Header, CRC: h.crc}
	varLen := int(h.headerLen) - PacketHeaderLen
	if varLen > 0 {
		vb := make([]byte, varLen)
		if _, err := r.r.ReadAt(vb, off+PacketHeaderLen); err != nil {
			return nil, atOffset(off, "read packet header: %w", err)
		}
		if h.ndim > 0 {
			p.Shape = make([]uint64, h.ndim)
			for i := range p.Shape {
				p.Shape[i] = binary.LittleEndian.Uint64(vb[8*i:])
			}
		}
		vb = vb[8*h.ndim:]
		p.Name = string(vb[:h.nameLen])
		if h.metaLen > 0 {
			p.Meta = vb[h.nameLen:]
		}
	}
	if err := p.check(); err != nil {
		return nil, &OffsetError{Offset: off, Err: err}
	}
	if p.Type != TypeTensor && p.Type != TypeIndex && p.StoredLen != 0 {
		return nil, atOffset(off, "%v with %d payload bytes: %w", p.Type, p.StoredLen, ErrCorrupt)
	}
	return p, nil
}

// ReadPacket reads the packet at off whole, checks its CRC and returns its header and
// stored payload.
func (r *Reader) ReadPacket(off int64) (*PacketInfo, []byte, error) {
	p, err := r.readHeader(off)
	if err != nil {
		return nil, nil, err
	}
	buf := make([]byte, p.Len)
	if _, err := r.r.ReadAt(buf, off); err != nil {
		return nil, nil, atOffset(off, "read packet: %w", err)
	}
	got := binary.LittleEndian.Uint32(buf[20:])
	clear(buf[20:24])
	if crc := crc32.Checksum(buf, castagnoli); crc != got {
		return nil, nil, atOffset(off, "packet crc %#08x, computed %#08x: %w", got, crc, ErrBadCRC)
	}
	binary.LittleEndian.PutUint32(buf[20:], got)
	if err := p.checkText(); err != nil {
		return nil, nil, err
	}
	if len(p.Meta) > 0 && !isJSONObject(p.Meta) {
		return nil, nil, atOffset(off, "packet meta is not a JSON object: %w", ErrCorrupt)
	}
	return p, buf[p.Len-int64(p.StoredLen):], nil
}

// Decode decodes a TENSOR packet's stored payload through its codec, checking the block
// table strictly. For codec none the payload itself is returned.
func (r *Reader) Decode(p *PacketInfo, payload []byte) ([]byte, error) {
	c, ok := r.codecs[p.Codec]
	if !ok {
		var err error
		if c, err = codec.ByID(p.Codec); err != nil {
			return nil, atOffset(p.Offset, "%w", err)
		}
		r.codecs[p.Codec] = c
	}
	if p.RawLen > uint64(codec.MaxBlockSize)*uint64(p.StoredLen/4+1) {
		return nil, atOffset(p.Offset, "raw_len %d from %d stored bytes: %w", p.RawLen, p.StoredLen, ErrCorrupt)
	}
	out, err := codec.DecodePayload(c, p.DType, payload, int(p.RawLen), int(p.BlockSize))
	if err != nil {
		return nil, atOffset(p.Offset, "decode payload: %w", err)
	}
	return out, nil
}

// Scanner walks packets from the first one. With headers only it reads each header and
// skips the payload (no CRC check); otherwise it reads each packet and checks its CRC.
type Scanner struct {
	r           *Reader
	headersOnly bool
	off         int64
	p           *PacketInfo
	payload     []byte
	err         error
	done        bool
	sawIndex    bool
	footer      bool
	indexOff    int64
}

// Scan starts a walk over every packet, END and INDEX included.
func (r *Reader) Scan(headersOnly bool) *Scanner {
	return &Scanner{r: r, headersOnly: headersOnly, off: r.header.DataOffset, indexOff: -1}
}

// ScanFrom is Scan from off, a packet boundary (the walk of a prefix whose start was
// freed begins where the bytes are still there).
func (r *Reader) ScanFrom(off int64, headersOnly bool) *Scanner {
	return &Scanner{r: r, headersOnly: headersOnly, off: off, indexOff: -1}
}

// Next advances to the next packet. It returns false at the end of the stream (the
// footer, or the end of a stream cut at a packet boundary) or on error.
func (s *Scanner) Next() bool {
	if s.done {
		return false
	}
	r := s.r
	rem := r.size - s.off
	if rem == 0 {
		s.done = true
		if s.sawIndex {
			s.err = atOffset(s.off, "INDEX without footer: %w", ErrTruncated)
		}
		return false
	}
	if s.sawIndex || (rem == FooterLen && s.isFooter()) {
		s.done = true
		if rem != FooterLen || !s.isFooter() {
			s.err = atOffset(s.off, "%d bytes after INDEX are not the footer: %w", rem, ErrCorrupt)
			return false
		}
		s.footer = true
		return false
	}
	var err error
	if s.headersOnly {
		s.p, err = r.ReadHeader(s.off)
	} else {
		s.p, s.payload, err = r.ReadPacket(s.off)
	}
	if err != nil {
		s.err, s.done = err, true
		return false
	}
	if s.p.Type == TypeIndex {
		s.sawIndex = true
		s.indexOff = s.off
	}
	s.off += s.p.Len
	return true
}

func (s *Scanner) isFooter() bool {
	var b [FooterLen]byte
	if _, err := s.r.r.ReadAt(b[:], s.r.size-FooterLen); err != nil {
		return false
	}
	return string(b[8:]) == FooterMagic
}

// Packet is the current packet's header.
func (s *Scanner) Packet() *PacketInfo { return s.p }

// Payload is the current packet's stored payload (nil with headers only).
func (s *Scanner) Payload() []byte { return s.payload }

// Err is the error that stopped the walk, nil at a clean end. errors.Is(err, ErrTruncated)
// tells a stream cut mid-packet; errors.As with *OffsetError gives the offset.
func (s *Scanner) Err() error { return s.err }

// Offset is where the walk stands: after the last packet returned, or at the bad one.
func (s *Scanner) Offset() int64 { return s.off }

// Footer reports whether the walk ended at a footer.
func (s *Scanner) Footer() bool { return s.footer }

// IndexEntry is one INDEX entry with its name resolved. Its Header holds the fields the
// index repeats from the packet (type, flags, seq, step, forward); the rest are zero.
type IndexEntry struct {
	Header
	Name   string
	Offset int64
}

// Index reads the INDEX through the footer, checking the INDEX packet's CRC and every
// entry's bounds; ErrNoIndex when the stream was not closed. Use Entries for a fallback.
func (r *Reader) Index() ([]IndexEntry, error) {
	off, err := r.Footer()
	if err != nil {
		return nil, err
	}
	p, payload, err := r.ReadPacket(off)
	if err != nil {
		return nil, err
	}
	if p.Type != TypeIndex {
		return nil, atOffset(off, "footer points at a %v packet: %w", p.Type, ErrCorrupt)
	}
	if off+p.Len != r.size-FooterLen {
		return nil, atOffset(off, "INDEX ends at %d, footer starts at %d: %w", off+p.Len, r.size-FooterLen, ErrCorrupt)
	}
	entries, err := parseIndex(payload, off)
	if err != nil {
		return nil, err
	}
	for i, e := range entries {
		if e.Offset < r.header.DataOffset || e.Offset >= off || (i > 0 && e.Offset <= entries[i-1].Offset) {
			return nil, atOffset(off, "index entry %d offset %d out of order or range: %w", i, e.Offset, ErrCorrupt)
		}
	}
	return entries, nil
}

func parseIndex(b []byte, off int64) ([]IndexEntry, error) {
	le := binary.LittleEndian
	bad := func(what string) error { return atOffset(off, "index payload: %s: %w", what, ErrCorrupt) }
	if len(b) < 4 {
		return nil, bad("short")
	}
	nNames := uint64(le.Uint32(b))
	b = b[4:]
	if nNames > uint64(len(b))/2 {
		return nil, bad("name count")
	}
	names := make([]string, nNames)
	for i := range names {
		if len(b) < 2 {
			return nil, bad("name table")
		}
		l := int(le.Uint16(b))
		if len(b) < 2+l {
			return nil, bad("name table")
		}
		if !utf8.Valid(b[2 : 2+l]) {
			return nil, bad(fmt.Sprintf("name %d %q is not valid UTF-8", i, b[2:2+l]))
		}
		names[i] = string(b[2 : 2+l])
		b = b[2+l:]
	}
	if len(b) < 8 {
		return nil, bad("entry count")
	}
	n := le.Uint64(b)
	b = b[8:]
	if n != uint64(len(b))/IndexEntryLen || uint64(len(b))%IndexEntryLen != 0 {
		return nil, bad(fmt.Sprintf("%d entries in %d bytes", n, len(b)))
	}
	out := make([]IndexEntry, n)
	for i := range out {
		e := b[i*IndexEntryLen:]
		ni := le.Uint32(e)
		if uint64(ni) >= nNames {
			return nil, bad(fmt.Sprintf("entry %d name index %d", i, ni))
		}
		flags := le.Uint16(e[6:])
		if flags > 0xff {
			// Packet flags are one byte; wider index flags cannot describe a packet.
			return nil, bad(fmt.Sprintf("entry %d flags %#x", i, flags))
		}
		out[i] = IndexEntry{Header: Header{Type: PacketType(le.Uint16(e[4:])), Flags: uint8(flags),
			Seq: le.Uint64(e[8:]), Step: le.Uint64(e[16:]), Forward: le.Uint64(e[24:])},
			Name: names[ni], Offset: int64(le.Uint64(e[32:]))}
		switch out[i].Type {
		case TypeTensor, TypeDrop, TypeToken:
		default:
			return nil, bad(fmt.Sprintf("entry %d type %d", i, out[i].Type))
		}
	}
	return out, nil
}

// Entries gives one entry per TENSOR/DROP/TOKEN packet: from the INDEX when the stream was
// closed, else by scanning headers (then fromIndex is false and err reports a cut or
// corruption after the entries returned).
func (r *Reader) Entries() (entries []IndexEntry, fromIndex bool, err error) {
	entries, err = r.Index()
	if err == nil {
		return entries, true, nil
	}
	if !errors.Is(err, ErrNoIndex) {
		return nil, false, err
	}
	s := r.Scan(true)
	for s.Next() {
		p := s.Packet()
		if p.Type == TypeTensor || p.Type == TypeDrop || p.Type == TypeToken {
			entries = append(entries, p.entry())
		}
	}
	return entries, false, s.Err()
}

// Tensor is one whole tensor, reassembled from its PART packets if it was split.
type Tensor struct {
	Name    string
	DType   dtype.DType
	Shape   []uint64
	Codec   codec.ID
	Seq     uint64 // of the first part
	Step    uint64
	Forward uint64
	// Meta is the first part's meta JSON.
	Meta []byte
	// Data is the decoded tensor bytes, C order, little-endian.
	Data []byte
	// Parts is the number of packets it came in (1 unless split).
	Parts int
	// Offset is the file offset of its first packet.
	Offset int64
}

// TensorScanner yields whole tensors in stream order (a split tensor when its last part
// arrives). Parts that never complete a tensor (a part dropped under policy drop, or a
// stream cut short) are counted in Incomplete, not returned.
type TensorScanner struct {
	s          *Scanner
	r          *Reader
	pending    map[string]*partial
	t          *Tensor
	err        error
	incomplete int
}

// partial is a split tensor whose parts are still arriving.
type partial struct {
	t         *Tensor
	tensorLen uint64
}

// Tensors starts a walk over whole tensors, checking every CRC and decoding every payload.
func (r *Reader) Tensors() *TensorScanner {
	return &TensorScanner{s: r.Scan(false), r: r, pending: map[string]*partial{}}
}

// Next advances to the next whole tensor.
func (ts *TensorScanner) Next() bool {
	if ts.err != nil {
		return false
	}
	for ts.s.Next() {
		p := ts.s.Packet()
		if p.Type != TypeTensor {
			continue
		}
		data, err := ts.r.Decode(p, ts.s.Payload())
		if err != nil {
			ts.err = err
			return false
		}
		if !p.Part() {
			ts.t = &Tensor{Name: p.Name, DType: p.DType, Shape: p.Shape, Codec: p.Codec, Seq: p.Seq,
				Step: p.Step, Forward: p.Forward, Meta: p.Meta, Data: data, Parts: 1, Offset: p.Offset}
			return true
		}
		// Parts of one tensor follow each other in order; a gap means a part was dropped.
		pt := ts.pending[p.Name]
		if pt != nil && (p.PartOffset != uint64(len(pt.t.Data)) || pt.tensorLen != p.TensorLen ||
			pt.t.DType != p.DType || !slices.Equal(pt.t.Shape, p.Shape)) {
			ts.incomplete++
			delete(ts.pending, p.Name)
			pt = nil
		}
		if pt == nil {
			if p.PartOffset != 0 {
				ts.incomplete++
				continue
			}
			// Grow with the parts that really arrive rather than trusting tensor_len up front.
			pt = &partial{tensorLen: p.TensorLen, t: &Tensor{Name: p.Name, DType: p.DType, Shape: p.Shape,
				Codec: p.Codec, Seq: p.Seq, Step: p.Step, Forward: p.Forward, Meta: p.Meta,
				Data: make([]byte, 0, min(p.TensorLen, 4*p.RawLen+4096)), Offset: p.Offset}}
			ts.pending[p.Name] = pt
		}
		pt.t.Data = append(pt.t.Data, data...)
		pt.t.Parts++
		if uint64(len(pt.t.Data)) == pt.tensorLen {
			delete(ts.pending, p.Name)
			ts.t = pt.t
			return true
		}
	}
	ts.err = ts.s.Err()
	ts.incomplete += len(ts.pending)
	clear(ts.pending)
	return false
}

// Tensor is the current tensor.
func (ts *TensorScanner) Tensor() *Tensor { return ts.t }

// Err is the error that stopped the walk (nil at a clean end, including a stream cut
// exactly at a packet boundary).
func (ts *TensorScanner) Err() error { return ts.err }

// Incomplete is the number of split tensors whose parts did not all arrive.
func (ts *TensorScanner) Incomplete() int { return ts.incomplete }

// entry is the index entry the packet gets: the header fields the INDEX repeats.
func (p *PacketInfo) entry() IndexEntry {
	return IndexEntry{Header: Header{Type: p.Type, Flags: p.Flags, Seq: p.Seq, Step: p.Step, Forward: p.Forward},
		Name: p.Name, Offset: p.Offset}
}

// sameEntry compares the fields an index entry carries.
func sameEntry(a, b IndexEntry) bool {
	return a.Name == b.Name && a.Offset == b.Offset && a.Type == b.Type && a.Flags == b.Flags &&
		a.Seq == b.Seq && a.Step == b.Step && a.Forward == b.Forward
}
