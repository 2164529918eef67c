package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/strap-llm/strap/internal/dtype"
)

// Layout constants of the ring (PROTOCOL.md section 2).
const (
	// HeaderSize is the size of the RingHeader; the data region starts there.
	HeaderSize = 4096
	// Align is the alignment of every record position and length.
	Align = 64
	// RecordFixedSize is the size of a record header before its shape.
	RecordFixedSize = 80
	// MaxNDim is the largest number of dimensions a record may carry.
	MaxNDim = 8
	// MaxNameLen is the longest module name a record may carry.
	MaxNameLen = 4096
	// MaxMetaLen is the longest meta JSON a record may carry.
	MaxMetaLen = 65536
	// RingVersion is the ring header version this package reads and writes.
	RingVersion = 1
)

// Record kinds.
const (
	KindTensor uint16 = 1
	KindPad    uint16 = 2
	// KindToken is a generated token written into the ring (PROTOCOL.md 2, "TOKEN
	// records"), where the daemon offers ring_tokens: it becomes a TOKEN packet as the
	// TOKEN message does, without a message of its own.
	KindToken uint16 = 3
)

// MaxTokenText is the longest token text a TOKEN record may carry.
const MaxTokenText = 65536

// FlagPart marks a record that carries one part of a larger tensor.
const FlagPart uint16 = 1

// FlagFP8 marks a TENSOR record whose payload is the tensor already coded as fp8 by the
// client (PROTOCOL.md 2, "FP8 records"): e4m3 codes, one scale per row part and each
// part's error sums, laid out as FP8 describes. dtype, shape and tensor_len are the
// original tensor's; such a record is never a PART.
const FlagFP8 uint16 = 2

// FP8 status bits (the payload's status word): the client found a part it cannot code as
// strapd's fp8 encoder would (which stores such a block losslessly) and sent no codes;
// strapd writes a DROP notice for the record instead.
const (
	// FP8NonFinite: a value is NaN or ±inf.
	FP8NonFinite uint32 = 1
	// FP8TinyScale: a part's max|x|/448 is not a normal float32 (float32 subnormal rows).
	FP8TinyScale uint32 = 2
	// FP8OverBound: a part's relative L2 error is over the session's fp8 bound.
	FP8OverBound uint32 = 4
)

// fp8PayloadHeader is block_values, parts, status and a reserved word.
const fp8PayloadHeader = 16

// FP8 is the parsed payload of a FlagFP8 record; its slices alias the record's bytes.
type FP8 struct {
	// BlockValues is the values per compression block the client cut row parts at.
	BlockValues uint64
	// Parts is the number of row parts (FP8Parts of the tensor).
	Parts uint64
	// Status is 0, or FP8* bits saying why the record carries no codes.
	Status uint32
	// Scales holds Parts float32 scales; Sums Parts × 4 float64 (Σx², Σ(x−y)², Σy²,
	// max|x−y| of each part); Codes one e4m3fn code per value.
	Scales, Sums, Codes []byte
}

// FP8Parts is the number of row parts a tensor of n values in rows of rowLen is cut into
// when its blocks hold blockValues values each: every row begun in a block is one part of
// that block (the fp8 codec's row parts, COMPRESSION.md 5.1).
func FP8Parts(n, rowLen, blockValues uint64) uint64 {
	if n == 0 || rowLen == 0 || blockValues == 0 {
		return 0
	}
	var p uint64
	for off := uint64(0); off < n; off += blockValues {
		nb := min(blockValues, n-off)
		into := off % rowLen
		first := min(rowLen-into, nb)
		row := min(rowLen, nb)
		p += 1 + (nb-first+row-1)/row
	}
	return p
}

// FP8PayloadLen is the payload length of a FlagFP8 record of n values in parts row parts.
func FP8PayloadLen(n, parts uint64) uint64 {
	return (fp8PayloadHeader+4*parts+7)&^7 + 32*parts + n
}

// FP8RowLen is the row length fp8 codes a tensor of shape by (its last dimension; the
// whole tensor for a 0-d tensor or an implausible last dimension), as the pipeline does.
func FP8RowLen(shape []uint64, n uint64) uint64 {
	if k := len(shape); k > 0 && shape[k-1] > 0 && shape[k-1] <= 1<<40 {
		return shape[k-1]
	}
	return n
}

var (
	ringMagic   = [4]byte{'S', 'R', 'N', 'G'}
	recordMagic = [4]byte{'S', 'R', 'E', 'C'}
)

// Errors returned by this package. Each returned error wraps one of them and names the
// expected and the found value.
var (
	// ErrNotMemfd: the ring descriptor is not a sealable memfd.
	ErrNotMemfd = errors.New("ring is not a memfd")
	// ErrNotSealed: the memfd lacks F_SEAL_SHRINK or F_SEAL_GROW.
	ErrNotSealed = errors.New("ring memfd not sealed")
	// ErrRingSize: the declared ring size is invalid or differs from the memfd's size.
	ErrRingSize = errors.New("bad ring size")
	// ErrRingHeader: the RingHeader is malformed.
	ErrRingHeader = errors.New("bad ring header")
	// ErrBadRecord: a record fails one of the checks of PROTOCOL.md section 2.
	ErrBadRecord = errors.New("bad record")
	// ErrRingFull: the producer has no room for a record now.
	ErrRingFull = errors.New("ring full")
	// ErrTooLarge: a record can never fit in the ring, even when empty.
	ErrTooLarge = errors.New("record larger than ring")
)

// AlignUp rounds n up to a multiple of Align.
func AlignUp(n uint64) uint64 { return (n + Align - 1) &^ (Align - 1) }

// CheckRingSize validates a declared ring size: the data region must be non-empty and a
// multiple of Align.
func CheckRingSize(ringSize uint64) error {
	if ringSize <= HeaderSize {
		return fmt.Errorf("%w: %d bytes, need more than %d", ErrRingSize, ringSize, HeaderSize)
	}
	if (ringSize-HeaderSize)%Align != 0 {
		return fmt.Errorf("%w: data size %d is not a multiple of %d", ErrRingSize, ringSize-HeaderSize, Align)
	}
	return nil
}

// PutHeader writes a RingHeader for a ring of ringSize bytes into b (len(b) >= HeaderSize).
func PutHeader(b []byte, ringSize uint64) {
	clear(b[:HeaderSize])
	copy(b[0:4], ringMagic[:])
	binary.LittleEndian.PutUint32(b[4:], RingVersion)
	binary.LittleEndian.PutUint64(b[8:], ringSize)
	binary.LittleEndian.PutUint64(b[16:], HeaderSize)
	binary.LittleEndian.PutUint64(b[24:], ringSize-HeaderSize)
}

// ParseHeader checks the RingHeader in b against the ring size declared in OPEN and returns
// the size of the data region.
func ParseHeader(b []byte, ringSize uint64) (dataSize uint64, err error) {
	if len(b) < HeaderSize {
		return 0, fmt.Errorf("%w: %d bytes, need %d", ErrRingHeader, len(b), HeaderSize)
	}
	if [4]byte(b[0:4]) != ringMagic {
		return 0, fmt.Errorf("%w: magic %q, expected %q", ErrRingHeader, b[0:4], ringMagic[:])
	}
	if v := binary.LittleEndian.Uint32(b[4:]); v != RingVersion {
		return 0, fmt.Errorf("%w: version %d, expected %d", ErrRingHeader, v, RingVersion)
	}
	if v := binary.LittleEndian.Uint64(b[8:]); v != ringSize {
		return 0, fmt.Errorf("%w: ring_size %d, expected %d", ErrRingHeader, v, ringSize)
	}
	if v := binary.LittleEndian.Uint64(b[16:]); v != HeaderSize {
		return 0, fmt.Errorf("%w: data_offset %d, expected %d", ErrRingHeader, v, HeaderSize)
	}
	dataSize = binary.LittleEndian.Uint64(b[24:])
	if dataSize != ringSize-HeaderSize {
		return 0, fmt.Errorf("%w: data_size %d, expected %d", ErrRingHeader, dataSize, ringSize-HeaderSize)
	}
	if dataSize == 0 || dataSize%Align != 0 {
		return 0, fmt.Errorf("%w: data_size %d is not a positive multiple of %d", ErrRingHeader, dataSize, Align)
	}
	for i, c := range b[32:HeaderSize] {
		if c != 0 {
			return 0, fmt.Errorf("%w: reserved byte %d is %#x, expected 0", ErrRingHeader, 32+i, c)
		}
	}
	return dataSize, nil
}

// Record is one parsed ring record. Shape, Name, Meta and Payload alias the bytes it was
// parsed from. A TOKEN record (Kind KindToken) uses Step for the token's index, Payload
// for its text and the accessors TokenID and Position; its other fields are zero.
type Record struct {
	Kind       uint16
	DType      dtype.DType
	Seq        uint64
	Len        uint64 // record_len: bytes to the next record
	Step       uint64
	Forward    uint64
	Flags      uint16
	PartOffset uint64
	TensorLen  uint64
	Shape      []uint64
	Name       string
	Meta       []byte
	Payload    []byte
	// FP8 is the parsed payload of a FlagFP8 record (zero otherwise).
	FP8 FP8
}

// TokenID is a TOKEN record's token id (the part_offset field, two's complement).
func (r *Record) TokenID() int64 { return int64(r.PartOffset) }

// Position is a TOKEN record's sequence position (the forward field, two's complement).
func (r *Record) Position() int64 { return int64(r.Forward) }

// Limits tighten the per-record maxima of the protocol; zero fields take the protocol's.
type Limits struct {
	// MaxNDim is the most dimensions accepted (≤ MaxNDim).
	MaxNDim int
	// MaxNameLen is the longest name accepted (≤ MaxNameLen).
	MaxNameLen int
	// MaxMetaLen is the longest meta accepted (≤ MaxMetaLen).
	MaxMetaLen int
	// MaxElements is the most elements a tensor's shape may declare (0: no limit beyond
	// the shape × dtype size == tensor_len check).
	MaxElements uint64
}

func (l Limits) norm() Limits {
	if l.MaxNDim <= 0 || l.MaxNDim > MaxNDim {
		l.MaxNDim = MaxNDim
	}
	if l.MaxNameLen <= 0 || l.MaxNameLen > MaxNameLen {
		l.MaxNameLen = MaxNameLen
	}
	if l.MaxMetaLen <= 0 || l.MaxMetaLen > MaxMetaLen {
		l.MaxMetaLen = MaxMetaLen
	}
	return l
}

func badf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrBadRecord}, args...)...)
}

// ParseRecord parses the record at the start of b. b holds exactly the bytes the record may
// occupy: from its position to the nearer of the published head and the end of the data
// region, so a record_len beyond len(b) is an error. The sequence number is not checked
// here (the caller knows the expected one); every other check of PROTOCOL.md section 2 is.
func ParseRecord(b []byte, lim Limits) (Record, error) { return parseRecord(b, lim, nil) }

// interned keeps the names and shapes of the records a Reader has parsed, so that a record
// seen before (every decoding step repeats the same modules) takes no allocation for them.
// Strings are immutable and a Record's Shape is never written to, so sharing is safe.
type interned struct {
	names  map[string]string
	shapes map[string][]uint64
}

// maxInterned bounds an interned cache: a client with ever new names costs a little
// memory, not an unbounded amount.
const maxInterned = 4096

func (c *interned) name(b []byte) string {
	if c == nil {
		return string(b)
	}
	if s, ok := c.names[string(b)]; ok { // no allocation for the lookup
		return s
	}
	s := string(b)
	if len(c.names) < maxInterned {
		c.names[s] = s
	}
	return s
}

// shape returns the shape of ndim dimensions at b, the one kept for name when equal.
func (c *interned) shape(name string, b []byte, ndim int) []uint64 {
	le := binary.LittleEndian
	if c != nil {
		if sh, ok := c.shapes[name]; ok && len(sh) == ndim {
			same := true
			for i := range ndim {
				if le.Uint64(b[RecordFixedSize+8*i:]) != sh[i] {
					same = false
					break
				}
			}
			if same {
				return sh
			}
		}
	}
	sh := make([]uint64, ndim)
	for i := range ndim {
		sh[i] = le.Uint64(b[RecordFixedSize+8*i:])
	}
	if c != nil && (len(c.shapes) < maxInterned || c.shapes[name] != nil) {
		c.shapes[name] = sh
	}
	return sh
}

func parseRecord(b []byte, lim Limits, cache *interned) (Record, error) {
	var r Record
	lim = lim.norm()
	if len(b) < Align {
		return r, badf("%d bytes left before the window ends, a record needs at least %d", len(b), Align)
	}
	if [4]byte(b[0:4]) != recordMagic {
		return r, badf("magic %q, expected %q", b[0:4], recordMagic[:])
	}
	le := binary.LittleEndian
	r.Kind = le.Uint16(b[4:])
	r.Len = le.Uint64(b[16:])
	if r.Len < Align || r.Len%Align != 0 {
		return r, badf("record_len %d, expected a multiple of %d, at least %d", r.Len, Align, Align)
	}
	if r.Len > uint64(len(b)) {
		return r, badf("record_len %d runs past the published window or data region (%d bytes left)", r.Len, len(b))
	}
	switch r.Kind {
	case KindPad:
		return r, nil
	case KindTensor:
	case KindToken:
		return parseToken(b, r)
	default:
		return r, badf("kind %d, expected %d (tensor), %d (pad) or %d (token)", r.Kind, KindTensor, KindPad, KindToken)
	}
	if len(b) < RecordFixedSize {
		return r, badf("%d bytes, a tensor record header needs %d", len(b), RecordFixedSize)
	}
	r.DType = dtype.DType(b[6])
	ndim := int(b[7])
	r.Seq = le.Uint64(b[8:])
	r.Step = le.Uint64(b[24:])
	r.Forward = le.Uint64(b[32:])
	payloadOff := le.Uint64(b[40:])
	payloadLen := le.Uint64(b[48:])
	nameLen := int(le.Uint16(b[56:]))
	r.Flags = le.Uint16(b[58:])
	metaLen := int(le.Uint32(b[60:]))
	r.PartOffset = le.Uint64(b[64:])
	r.TensorLen = le.Uint64(b[72:])

	if !r.DType.Valid() {
		return r, badf("seq %d: unknown dtype %d", r.Seq, b[6])
	}
	if ndim > lim.MaxNDim {
		return r, badf("seq %d: ndim %d, at most %d", r.Seq, ndim, lim.MaxNDim)
	}
	if nameLen < 1 || nameLen > lim.MaxNameLen {
		return r, badf("seq %d: name_len %d, expected 1..%d", r.Seq, nameLen, lim.MaxNameLen)
	}
	if metaLen > lim.MaxMetaLen {
		return r, badf("seq %d: meta_len %d, at most %d", r.Seq, metaLen, lim.MaxMetaLen)
	}
	if r.Flags&^(FlagPart|FlagFP8) != 0 {
		return r, badf("seq %d: flags %#x, only bits 0 (PART) and 1 (FP8) are defined", r.Seq, r.Flags)
	}
	if r.Flags&FlagFP8 != 0 && (r.Flags&FlagPart != 0 || !fp8DType(r.DType)) {
		return r, badf("seq %d: FP8 record with flags %#x of %s: expected no PART, float32, float16 or bfloat16", r.Seq, r.Flags, r.DType)
	}
	hdrEnd := uint64(RecordFixedSize + 8*ndim + nameLen + metaLen)
	if payloadOff%Align != 0 || payloadOff < hdrEnd {
		return r, badf("seq %d: payload_off %d, expected a multiple of %d and at least %d", r.Seq, payloadOff, Align, hdrEnd)
	}
	if payloadOff > r.Len || payloadLen > r.Len-payloadOff {
		return r, badf("seq %d: payload_off %d + payload_len %d exceeds record_len %d", r.Seq, payloadOff, payloadLen, r.Len)
	}
	elems := uint64(1)
	overflow := false
	for i := range ndim {
		d := le.Uint64(b[RecordFixedSize+8*i:])
		if d != 0 && elems > ^uint64(0)/d {
			overflow = true
		}
		elems *= d
	}
	size := uint64(r.DType.Size())
	if overflow || (elems != 0 && elems > ^uint64(0)/size) || elems*size != r.TensorLen {
		return r, badf("seq %d: shape %v of %s is not tensor_len %d bytes", r.Seq, (*interned)(nil).shape("", b, ndim), r.DType, r.TensorLen)
	}
	if lim.MaxElements > 0 && elems > lim.MaxElements {
		return r, badf("seq %d: shape %v has %d elements, at most %d", r.Seq, (*interned)(nil).shape("", b, ndim), elems, lim.MaxElements)
	}
	if r.Flags&FlagFP8 != 0 {
		if r.PartOffset != 0 {
			return r, badf("seq %d: part_offset %d in an FP8 record, expected 0", r.Seq, r.PartOffset)
		}
		row := elems // the whole tensor is one row without a plausible last dimension
		if last := le.Uint64(b[RecordFixedSize+8*max(ndim-1, 0):]); ndim > 0 && last > 0 && last <= 1<<40 {
			row = last
		}
		if err := parseFP8(&r, b[payloadOff:payloadOff+payloadLen], elems, row); err != nil {
			return r, err
		}
	} else if r.Flags&FlagPart != 0 {
		if r.PartOffset > r.TensorLen || payloadLen > r.TensorLen-r.PartOffset {
			return r, badf("seq %d: part_offset %d + payload_len %d exceeds tensor_len %d", r.Seq, r.PartOffset, payloadLen, r.TensorLen)
		}
	} else {
		if r.TensorLen != payloadLen {
			return r, badf("seq %d: tensor_len %d != payload_len %d in a record without PART", r.Seq, r.TensorLen, payloadLen)
		}
		if r.PartOffset != 0 {
			return r, badf("seq %d: part_offset %d in a record without PART, expected 0", r.Seq, r.PartOffset)
		}
	}
	off := RecordFixedSize + 8*ndim
	// Name and meta are UTF-8 (PROTOCOL.md section 2). Checked here, where the bytes become a
	// string, because nothing later would: encoding/json and the stream writer pass invalid
	// UTF-8 through or turn it into U+FFFD, so a name that differs from what the client sent
	// would land on disk silently.
	name := b[off : off+nameLen]
	if !utf8.Valid(name) {
		return r, badf("seq %d: name %q is not valid UTF-8", r.Seq, name)
	}
	r.Name = cache.name(name)
	r.Shape = cache.shape(r.Name, b, ndim)
	off += nameLen
	if metaLen > 0 {
		r.Meta = b[off : off+metaLen]
		if !utf8.Valid(r.Meta) {
			return r, badf("seq %d: meta of %q is not valid UTF-8", r.Seq, r.Name)
		}
	}
	r.Payload = b[payloadOff : payloadOff+payloadLen]
	return r, nil
}

func fp8DType(d dtype.DType) bool {
	return d == dtype.Float32 || d == dtype.Float16 || d == dtype.BFloat16
}

// parseFP8 checks the layout of an FP8 record's payload p for a tensor of n values in
// rows of rowLen and parses it into r.FP8. The values (scales, codes, sums) are checked where the
// blocks are built (codec.FP8Coded), off the reader's path.
func parseFP8(r *Record, p []byte, n, rowLen uint64) error {
	if len(p) < fp8PayloadHeader {
		return badf("seq %d: FP8 payload of %d bytes, its header needs %d", r.Seq, len(p), fp8PayloadHeader)
	}
	le := binary.LittleEndian
	f := FP8{BlockValues: uint64(le.Uint32(p[0:])), Parts: uint64(le.Uint32(p[4:])), Status: le.Uint32(p[8:])}
	if f.BlockValues == 0 || le.Uint32(p[12:]) != 0 || f.Status&^(FP8NonFinite|FP8TinyScale|FP8OverBound) != 0 {
		return badf("seq %d: FP8 payload header block_values %d, status %#x, reserved %#x: expected block_values > 0, known status bits, reserved 0",
			r.Seq, f.BlockValues, f.Status, le.Uint32(p[12:]))
	}
	if n > uint64(len(p)) { // before counting parts: a block per value of a huge shape
		return badf("seq %d: FP8 payload of %d bytes cannot hold %d codes", r.Seq, len(p), n)
	}
	if want := FP8Parts(n, rowLen, f.BlockValues); f.Parts != want {
		return badf("seq %d: FP8 payload says %d row parts, %d values in rows of %d cut every %d values make %d",
			r.Seq, f.Parts, n, rowLen, f.BlockValues, want)
	}
	if want := FP8PayloadLen(n, f.Parts); uint64(len(p)) != want {
		return badf("seq %d: FP8 payload_len %d, expected %d for %d values in %d parts", r.Seq, len(p), want, n, f.Parts)
	}
	sums := (fp8PayloadHeader + 4*f.Parts + 7) &^ 7
	f.Scales = p[fp8PayloadHeader : fp8PayloadHeader+4*f.Parts]
	f.Sums = p[sums : sums+32*f.Parts]
	f.Codes = p[sums+32*f.Parts:]
	r.FP8 = f
	return nil
}

// parseToken checks and parses a TOKEN record (PROTOCOL.md 2): the fields a tensor record
// uses for its dtype, shape, name, meta, flags and tensor_len are zero, and the payload is
// the token's text, valid UTF-8 of at most MaxTokenText bytes.
func parseToken(b []byte, r Record) (Record, error) {
	if len(b) < RecordFixedSize || r.Len < 2*Align {
		return r, badf("token record of %d bytes (record_len %d), needs at least %d", len(b), r.Len, 2*Align)
	}
	le := binary.LittleEndian
	r.Seq = le.Uint64(b[8:])
	r.Step = le.Uint64(b[24:])
	r.Forward = le.Uint64(b[32:])
	payloadOff := le.Uint64(b[40:])
	payloadLen := le.Uint64(b[48:])
	r.PartOffset = le.Uint64(b[64:])
	if b[6] != 0 || b[7] != 0 || le.Uint16(b[56:]) != 0 || le.Uint16(b[58:]) != 0 || le.Uint32(b[60:]) != 0 || le.Uint64(b[72:]) != 0 {
		return r, badf("token seq %d: dtype %d, ndim %d, name_len %d, flags %#x, meta_len %d, tensor_len %d; expected all 0",
			r.Seq, b[6], b[7], le.Uint16(b[56:]), le.Uint16(b[58:]), le.Uint32(b[60:]), le.Uint64(b[72:]))
	}
	if payloadOff%Align != 0 || payloadOff < RecordFixedSize {
		return r, badf("token seq %d: payload_off %d, expected a multiple of %d and at least %d", r.Seq, payloadOff, Align, RecordFixedSize)
	}
	if payloadOff > r.Len || payloadLen > r.Len-payloadOff {
		return r, badf("token seq %d: payload_off %d + payload_len %d exceeds record_len %d", r.Seq, payloadOff, payloadLen, r.Len)
	}
	if payloadLen > MaxTokenText {
		return r, badf("token seq %d: text of %d bytes, at most %d", r.Seq, payloadLen, MaxTokenText)
	}
	r.Payload = b[payloadOff : payloadOff+payloadLen]
	if !utf8.Valid(r.Payload) {
		return r, badf("token seq %d: text %q is not valid UTF-8", r.Seq, r.Payload)
	}
	return r, nil
}

// TokenRecordLen is the ring size of a TOKEN record whose text is n bytes.
func TokenRecordLen(n int) uint64 { return 2*Align + AlignUp(uint64(n)) }

// AppendToken appends the reference encoding of a TOKEN record (PROTOCOL.md 2): index in
// step, position in forward, token id in part_offset, the text as payload at offset 128,
// everything else zero.
func AppendToken(dst []byte, seq, index uint64, tokenID, position int64, text string) []byte {
	n := TokenRecordLen(len(text))
	start := len(dst)
	dst = append(dst, make([]byte, n)...)
	b := dst[start:]
	le := binary.LittleEndian
	copy(b[0:4], recordMagic[:])
	le.PutUint16(b[4:], KindToken)
	le.PutUint64(b[8:], seq)
	le.PutUint64(b[16:], n)
	le.PutUint64(b[24:], index)
	le.PutUint64(b[32:], uint64(position))
	le.PutUint64(b[40:], 2*Align)
	le.PutUint64(b[48:], uint64(len(text)))
	le.PutUint64(b[64:], uint64(tokenID))
	copy(b[2*Align:], text)
	return dst
}

// Tensor describes one record to encode. Shape is the whole tensor's; Payload is this
// record's bytes (all of them, or one part when Flags has FlagPart).
type Tensor struct {
	Name       string
	DType      dtype.DType
	Shape      []uint64
	Step       uint64
	Forward    uint64
	Meta       []byte
	Flags      uint16
	PartOffset uint64
	TensorLen  uint64 // 0 means len(Payload)
	Payload    []byte
}

// HeaderLen is the record header size of t before alignment: 80 + 8·ndim + name + meta.
func (t *Tensor) HeaderLen() uint64 {
	return uint64(RecordFixedSize + 8*len(t.Shape) + len(t.Name) + len(t.Meta))
}

// RecordLen is the aligned size t takes in the ring.
func (t *Tensor) RecordLen() uint64 {
	return AlignUp(AlignUp(t.HeaderLen()) + uint64(len(t.Payload)))
}

// AppendRecord appends the record encoding of t with sequence number seq to dst, padded
// with zeros to its record length. It is the reference encoding the golden files hold.
func AppendRecord(dst []byte, t *Tensor, seq uint64) []byte {
	n := t.RecordLen()
	start := len(dst)
	dst = append(dst, make([]byte, n)...)
	PutRecord(dst[start:], t, seq)
	return dst
}

// PutRecord writes the record encoding of t into b, which must hold t.RecordLen() bytes
// (its padding bytes are left as they are; the reference zeroes them).
func PutRecord(b []byte, t *Tensor, seq uint64) {
	le := binary.LittleEndian
	payloadOff := AlignUp(t.HeaderLen())
	tensorLen := t.TensorLen
	if tensorLen == 0 && t.Flags&FlagPart == 0 {
		tensorLen = uint64(len(t.Payload))
	}
	copy(b[0:4], recordMagic[:])
	le.PutUint16(b[4:], KindTensor)
	b[6] = byte(t.DType)
	b[7] = byte(len(t.Shape))
	le.PutUint64(b[8:], seq)
	le.PutUint64(b[16:], t.RecordLen())
	le.PutUint64(b[24:], t.Step)
	le.PutUint64(b[32:], t.Forward)
	le.PutUint64(b[40:], payloadOff)
	le.PutUint64(b[48:], uint64(len(t.Payload)))
	le.PutUint16(b[56:], uint16(len(t.Name)))
	le.PutUint16(b[58:], t.Flags)
	le.PutUint32(b[60:], uint32(len(t.Meta)))
	le.PutUint64(b[64:], t.PartOffset)
	le.PutUint64(b[72:], tensorLen)
	off := RecordFixedSize
	for _, d := range t.Shape {
		le.PutUint64(b[off:], d)
		off += 8
	}
	off += copy(b[off:], t.Name)
	off += copy(b[off:], t.Meta)
	clear(b[off:payloadOff])
	copy(b[payloadOff:], t.Payload)
}

// PutPad writes a PAD record of length n (a multiple of Align) at the start of b.
func PutPad(b []byte, n uint64) {
	clear(b[:Align])
	copy(b[0:4], recordMagic[:])
	binary.LittleEndian.PutUint16(b[4:], KindPad)
	binary.LittleEndian.PutUint64(b[16:], n)
}
