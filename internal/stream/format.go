package stream

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/bits"

	"github.com/strap-llm/strap/internal/codec"
	"github.com/strap-llm/strap/internal/dtype"
)

// PacketType is the type field of a packet header.
type PacketType uint16

// Packet types (docs/STREAM_FORMAT.md 3).
const (
	TypeTensor PacketType = 1
	TypeDrop   PacketType = 2
	TypeToken  PacketType = 3
	TypeIndex  PacketType = 4
	TypeEnd    PacketType = 5
)

// String is the upper-case name used in the spec and in JSON output.
func (t PacketType) String() string {
	switch t {
	case TypeTensor:
		return "TENSOR"
	case TypeDrop:
		return "DROP"
	case TypeToken:
		return "TOKEN"
	case TypeIndex:
		return "INDEX"
	case TypeEnd:
		return "END"
	}
	return fmt.Sprintf("TYPE(%d)", uint16(t))
}

// FlagPart marks a packet that carries one part of a larger tensor.
const FlagPart uint8 = 1

// Layout constants of the format.
const (
	// FileMagic opens every stream.
	FileMagic = "STRAPSTM"
	// Version is the stream format version this package writes and reads.
	Version = 2
	// FileHeaderLen is the fixed part of the file header, before the metadata JSON.
	FileHeaderLen = 24
	// PacketMagic opens every packet.
	PacketMagic = "SPKT"
	// PacketHeaderLen is the fixed part of a packet header.
	PacketHeaderLen = 96
	// MaxNDim is the most dimensions a tensor may have.
	MaxNDim = 8
	// FooterMagic closes a stream that was closed.
	FooterMagic = "STRAPEND"
	// FooterLen is the size of the footer.
	FooterLen = 16
	// IndexEntryLen is the size of one INDEX entry.
	IndexEntryLen = 40
)

// Errors returned by this package. Reader errors are wrapped in an *OffsetError naming
// where in the file they were found.
var (
	// ErrBadMagic: a file or packet magic is not what the format says.
	ErrBadMagic = errors.New("bad magic")
	// ErrBadVersion: the file is not a version-2 stream.
	ErrBadVersion = errors.New("unsupported stream version")
	// ErrBadCRC: a CRC32C does not match the bytes it covers.
	ErrBadCRC = errors.New("crc mismatch")
	// ErrTruncated: the file ends inside a header or packet.
	ErrTruncated = errors.New("truncated")
	// ErrCorrupt: a field is out of range or disagrees with another field.
	ErrCorrupt = errors.New("corrupt stream")
	// ErrNoIndex: the stream has no footer and INDEX (it was not closed).
	ErrNoIndex = errors.New("no index")
	// ErrInvalidPacket: WritePacket was given a packet that breaks the format's rules.
	ErrInvalidPacket = errors.New("invalid packet")
	// ErrClosed: the Writer was closed.
	ErrClosed = errors.New("writer closed")
	// ErrResumeMismatch: the stream prefix a resume names does not end as its checkpoint
	// says (docs/CHECKPOINTS.md).
	ErrResumeMismatch = errors.New("stream prefix does not match the checkpoint")
	// ErrComplete: a resume would cut a stream whose capture finished (an END with status
	// "complete" follows the resume point): nothing is cut.
	ErrComplete = errors.New("the capture is complete: nothing to resume")
	// ErrPayloadChanged: a Shared payload changed while it was being written, so the bytes
	// in the file may not be the ones its CRC covers. The packet is cut off the file again
	// (regular files) and the stream goes on being writable, so the session can end with
	// an END that says why.
	ErrPayloadChanged = errors.New("payload changed while it was written")
)

// OffsetError is a reader error at a file offset.
type OffsetError struct {
	// Offset is the file offset of the header or packet at fault.
	Offset int64
	// Err is what is wrong there.
	Err error
}

func (e *OffsetError) Error() string { return fmt.Sprintf("at offset %d: %v", e.Offset, e.Err) }

// Unwrap gives the cause, so errors.Is(err, ErrBadCRC) works.
func (e *OffsetError) Unwrap() error { return e.Err }

func atOffset(off int64, format string, args ...any) error {
	return &OffsetError{Offset: off, Err: fmt.Errorf(format, args...)}
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Block is one piece of a packet's payload. For codec none the blocks are raw byte slices
// written back to back; for other codecs each is one codec block, in order.
type Block struct {
	// Data is the block's stored bytes. The Writer does not keep it after WritePacket.
	Data []byte
	// Raw marks a block stored verbatim (bit 31 of its size in the block table).
	Raw bool
}

// Header is a packet header's fields as docs/STREAM_FORMAT.md 3 defines them, less the
// lengths that follow from the variable parts (name, meta) and the CRC. It is the one
// description of a packet: the writer fills it, the reader returns it, index entries and
// test helpers embed it, and check holds the rules that tie its fields together.
type Header struct {
	Type  PacketType
	DType dtype.DType
	// Shape is the whole tensor's shape (at most MaxNDim dimensions).
	Shape   []uint64
	Codec   codec.ID
	Flags   uint8
	Seq     uint64
	Step    uint64
	Forward uint64
	// RawLen is the decoded size of this packet's payload (for DROP: the bytes lost).
	RawLen uint64
	// StoredLen is the payload's size in the file. WritePacket ignores it on input and
	// derives it from the blocks.
	StoredLen uint64
	// PartOffset is this payload's offset in the whole tensor (PART only).
	PartOffset uint64
	// TensorLen is the whole tensor's size; 0 on write means RawLen (not allowed for PART).
	TensorLen uint64
	// BlockSize is the raw bytes per codec block; 0 for codec none.
	BlockSize uint32
}

// Part reports whether the packet carries one part of a larger tensor.
func (h *Header) Part() bool { return h.Flags&FlagPart != 0 }

// Packet is one TENSOR, DROP or TOKEN packet to write.
type Packet struct {
	Header
	Name string
	// Meta is a JSON object or empty.
	Meta []byte
	// Blocks is the payload: for codec none raw slices written back to back (they may
	// alias the ring mapping and are not retained after WritePacket returns); for other
	// codecs one entry per codec block, from which the writer builds the block table.
	Blocks []Block
	// Shared says the blocks alias memory another process can write while the packet is
	// written (the ring, for codec none): the writer then makes its CRC cover exactly the
	// bytes that reach the file, or fails with ErrPayloadChanged.
	Shared bool
}

// EndInfo is what the END packet records about how the session ended.
type EndInfo struct {
	// Status is "complete", "aborted" or "error".
	Status string
	// Error is the error text for status "error" (or the reason for "aborted").
	Error string
	// Packets is the number of TENSOR/DROP/TOKEN packets; 0 lets the writer fill its count.
	Packets uint64
	// Drops is the number of DROP packets; 0 lets the writer fill its count.
	Drops uint64
}

// EndMeta is the END packet's meta JSON.
type EndMeta struct {
	Status  string `json:"status"`
	Packets uint64 `json:"packets"`
	Drops   uint64 `json:"drops"`
	Error   string `json:"error,omitempty"`
}

// rawHeader is the fixed part of a packet header as stored: the fields plus the lengths
// of the variable parts and the CRC, which Header leaves out.
type rawHeader struct {
	Header    // Shape is nil here; ndim says how long it is
	ndim      int
	headerLen uint32
	nameLen   int
	metaLen   uint32
	crc       uint32
}

// appendHeader appends the fixed header (crc zero), shape, name and meta.
func appendHeader(dst []byte, p *Packet, storedLen uint64) []byte {
	hl := PacketHeaderLen + 8*len(p.Shape) + len(p.Name) + len(p.Meta)
	start := len(dst)
	var fixed [PacketHeaderLen]byte
	dst = append(dst, fixed[:]...)
	h := dst[start:]
	copy(h[0:4], PacketMagic)
	le := binary.LittleEndian
	le.PutUint16(h[4:], uint16(p.Type))
	h[6] = byte(p.DType)
	h[7] = byte(len(p.Shape))
	le.PutUint32(h[8:], uint32(hl))
	le.PutUint16(h[12:], uint16(len(p.Name)))
	h[14] = byte(p.Codec)
	h[15] = p.Flags
	le.PutUint32(h[16:], uint32(len(p.Meta)))
	le.PutUint64(h[24:], p.Seq)
	le.PutUint64(h[32:], p.Step)
	le.PutUint64(h[40:], p.Forward)
	le.PutUint64(h[48:], p.RawLen)
	le.PutUint64(h[56:], storedLen)
	le.PutUint64(h[64:], p.PartOffset)
	le.PutUint64(h[72:], p.TensorLen)
	le.PutUint32(h[80:], p.BlockSize)
	for _, d := range p.Shape {
		dst = le.AppendUint64(dst, d)
	}
	dst = append(dst, p.Name...)
	return append(dst, p.Meta...)
}

// parseHeader decodes the fixed 96 bytes; it checks the magic and the header_len sum.
func parseHeader(b []byte) (rawHeader, error) {
	le := binary.LittleEndian
	if string(b[0:4]) != PacketMagic {
		return rawHeader{}, fmt.Errorf("packet magic %q: %w", b[0:4], ErrBadMagic)
	}
	h := rawHeader{
		Header: Header{
			Type:       PacketType(le.Uint16(b[4:])),
			DType:      dtype.DType(b[6]),
			Codec:      codec.ID(b[14]),
			Flags:      b[15],
			Seq:        le.Uint64(b[24:]),
			Step:       le.Uint64(b[32:]),
			Forward:    le.Uint64(b[40:]),
			RawLen:     le.Uint64(b[48:]),
			StoredLen:  le.Uint64(b[56:]),
			PartOffset: le.Uint64(b[64:]),
			TensorLen:  le.Uint64(b[72:]),
			BlockSize:  le.Uint32(b[80:]),
		},
		ndim:      int(b[7]),
		headerLen: le.Uint32(b[8:]),
		nameLen:   int(le.Uint16(b[12:])),
		metaLen:   le.Uint32(b[16:]),
		crc:       le.Uint32(b[20:]),
	}
	if h.Type < TypeTensor || h.Type > TypeEnd {
		return h, fmt.Errorf("packet type %d: %w", h.Type, ErrCorrupt)
	}
	if h.ndim > MaxNDim {
		return h, fmt.Errorf("ndim %d > %d: %w", h.ndim, MaxNDim, ErrCorrupt)
	}
	if want := uint64(PacketHeaderLen) + 8*uint64(h.ndim) + uint64(h.nameLen) + uint64(h.metaLen); uint64(h.headerLen) != want {
		return h, fmt.Errorf("header_len %d, fields sum to %d: %w", h.headerLen, want, ErrCorrupt)
	}
	return h, nil
}

// tensorBytes is prod(shape)·size, with ok=false on overflow.
func tensorBytes(shape []uint64, size int) (uint64, bool) {
	n := uint64(size)
	for _, d := range shape {
		hi, lo := bits.Mul64(n, d)
		if hi != 0 {
			return 0, false
		}
		n = lo
	}
	return n, true
}

// check applies the rules that tie header fields together; the Writer applies them to its
// input and the Reader to what it reads, so both enforce one set of rules.
func (h *Header) check() error {
	typ, dt, shape, cid, flags := h.Type, h.DType, h.Shape, h.Codec, h.Flags
	seq, rawLen, storedLen, partOffset, tensorLen, blockSize := h.Seq, h.RawLen, h.StoredLen, h.PartOffset, h.TensorLen, h.BlockSize
	if flags&^FlagPart != 0 {
		return fmt.Errorf("flags %#x: %w", flags, ErrCorrupt)
	}
	part := flags&FlagPart != 0
	switch typ {
	case TypeTensor, TypeDrop:
		if seq == 0 {
			return fmt.Errorf("%v with seq 0: %w", typ, ErrCorrupt)
		}
		if part {
			if partOffset > tensorLen || rawLen > tensorLen-partOffset {
				return fmt.Errorf("part [%d,+%d) outside tensor_len %d: %w", partOffset, rawLen, tensorLen, ErrCorrupt)
			}
		} else if partOffset != 0 || tensorLen != rawLen {
			return fmt.Errorf("not PART but part_offset %d, tensor_len %d, raw_len %d: %w",
				partOffset, tensorLen, rawLen, ErrCorrupt)
		}
		if typ == TypeTensor || dt != dtype.Invalid {
			if !dt.Valid() {
				return fmt.Errorf("dtype %d: %w", dt, ErrCorrupt)
			}
			if n, ok := tensorBytes(shape, dt.Size()); !ok || n != tensorLen {
				return fmt.Errorf("shape %v of %v is not tensor_len %d bytes: %w", shape, dt, tensorLen, ErrCorrupt)
			}
		}
		if typ == TypeDrop && (storedLen != 0 || cid != codec.None || blockSize != 0) {
			return fmt.Errorf("DROP with payload/codec: %w", ErrCorrupt)
		}
	case TypeToken, TypeEnd, TypeIndex:
		if part || rawLen != storedLen || cid != codec.None || blockSize != 0 || partOffset != 0 || tensorLen != rawLen {
			return fmt.Errorf("%v with tensor fields set: %w", typ, ErrCorrupt)
		}
		if typ == TypeToken && seq == 0 {
			return fmt.Errorf("TOKEN with seq 0: %w", ErrCorrupt)
		}
		if typ != TypeToken && seq != 0 {
			return fmt.Errorf("%v with seq %d: %w", typ, seq, ErrCorrupt)
		}
		if typ != TypeIndex && rawLen != 0 {
			return fmt.Errorf("%v with a payload: %w", typ, ErrCorrupt)
		}
	default:
		return fmt.Errorf("packet type %d: %w", typ, ErrCorrupt)
	}
	if typ == TypeTensor {
		if cid == codec.None {
			if blockSize != 0 || storedLen != rawLen {
				return fmt.Errorf("codec none with block_size %d, stored_len %d, raw_len %d: %w",
					blockSize, storedLen, rawLen, ErrCorrupt)
			}
		} else if blockSize == 0 || blockSize > codec.MaxBlockSize {
			return fmt.Errorf("block_size %d not in 1..%d: %w", blockSize, codec.MaxBlockSize, ErrCorrupt)
		}
	}
	return nil
}

func align8(n int64) int64 { return (n + 7) &^ 7 }
