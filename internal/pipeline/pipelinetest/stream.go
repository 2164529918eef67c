package pipelinetest

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"math/rand/v2"
	"os"

	"github.com/strap-llm/strap/internal/codec"
	"github.com/strap-llm/strap/internal/dtype"
)

// Packet is one packet read back from a stream, payload decoded.
type Packet struct {
	Offset     int64
	Type       uint16
	DType      dtype.DType
	Shape      []uint64
	Name       string
	Meta       map[string]any
	Codec      codec.ID
	Flags      uint8
	Seq        uint64
	Step       uint64
	Forward    uint64
	RawLen     uint64
	StoredLen  uint64
	PartOffset uint64
	TensorLen  uint64
	Payload    []byte
}

// Stream is a stream file read back.
type Stream struct {
	Meta    map[string]any
	Packets []Packet // TENSOR, DROP, TOKEN in file order
	End     *Packet
	Index   *Packet
	// Footer is true when the file ends with a valid footer pointing at the INDEX.
	Footer bool
	// TruncatedAt is the offset of an incomplete last packet (0: none).
	TruncatedAt int64
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ReadFile reads and checks a whole stream file.
func ReadFile(path string) (*Stream, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Read(b)
}

// Read checks and decodes a stream held in b.
func Read(b []byte) (*Stream, error) {
	le := binary.LittleEndian
	if len(b) < 24 || string(b[:8]) != "STRAPSTM" {
		return nil, errors.New("not a stream: bad magic")
	}
	if v := le.Uint16(b[8:]); v != 2 {
		return nil, fmt.Errorf("stream version %d", v)
	}
	ml := int(le.Uint32(b[12:]))
	if 24+ml > len(b) {
		return nil, errors.New("header metadata truncated")
	}
	crc := crc32.Update(crc32.Checksum(b[:16], castagnoli), castagnoli, b[24:24+ml])
	if crc != le.Uint32(b[16:]) {
		return nil, errors.New("file header crc mismatch")
	}
	s := &Stream{}
	if err := json.Unmarshal(b[24:24+ml], &s.Meta); err != nil {
		return nil, fmt.Errorf("header metadata: %w", err)
	}
	off := int64((24 + ml + 7) &^ 7)
	for off < int64(len(b)) {
		if s.Index != nil {
			// Only the footer may follow the INDEX.
			rest := b[off:]
			if len(rest) != 16 || string(rest[8:]) != "STRAPEND" || int64(le.Uint64(rest)) != s.Index.Offset {
				return nil, fmt.Errorf("bad footer at %d", off)
			}
			s.Footer = true
			break
		}
		if int64(len(b))-off < 96 {
			s.TruncatedAt = off
			break
		}
		h := b[off:]
		if string(h[:4]) != "SPKT" {
			return nil, fmt.Errorf("packet magic at %d", off)
		}
		p := Packet{Offset: off, Type: le.Uint16(h[4:]), DType: dtype.DType(h[6]), Codec: codec.ID(h[14]), Flags: h[15],
			Seq: le.Uint64(h[24:]), Step: le.Uint64(h[32:]), Forward: le.Uint64(h[40:]), RawLen: le.Uint64(h[48:]),
			StoredLen: le.Uint64(h[56:]), PartOffset: le.Uint64(h[64:]), TensorLen: le.Uint64(h[72:])}
		ndim := int(h[7])
		hl := int64(le.Uint32(h[8:]))
		nl := int(le.Uint16(h[12:]))
		mlen := int(le.Uint32(h[16:]))
		bs := int(le.Uint32(h[80:]))
		if hl != int64(96+8*ndim+nl+mlen) {
			return nil, fmt.Errorf("header_len %d at %d", hl, off)
		}
		total := hl + int64(p.StoredLen)
		if off+total > int64(len(b)) {
			s.TruncatedAt = off
			break
		}
		pk := append([]byte(nil), b[off:off+total]...)
		clear(pk[20:24])
		if crc32.Checksum(pk, castagnoli) != le.Uint32(h[20:]) {
			return nil, fmt.Errorf("packet crc mismatch at %d", off)
		}
		for i := range ndim {
			p.Shape = append(p.Shape, le.Uint64(h[96+8*i:]))
		}
		p.Name = string(h[96+8*ndim : 96+8*ndim+nl])
		if mlen > 0 {
			if err := json.Unmarshal(h[96+8*ndim+nl:hl], &p.Meta); err != nil {
				return nil, fmt.Errorf("packet meta at %d: %w", off, err)
			}
		}
		stored := b[off+hl : off+total]
		if p.Codec == codec.None {
			p.Payload = stored
		} else {
			c, err := codec.ByID(p.Codec)
			if err != nil {
				return nil, err
			}
			if p.Payload, err = codec.DecodePayload(c, p.DType, stored, int(p.RawLen), bs); err != nil {
				return nil, fmt.Errorf("decode packet at %d: %w", off, err)
			}
		}
		switch p.Type {
		case 4:
			s.Index = &p
		case 5:
			s.End = &p
		default:
			if s.End != nil {
				return nil, fmt.Errorf("packet after END at %d", off)
			}
			s.Packets = append(s.Packets, p)
		}
		off += total
	}
	return s, nil
}

// EndStatus is the END packet's status, or "" when there is none.
func (s *Stream) EndStatus() string {
	if s.End == nil {
		return ""
	}
	st, _ := s.End.Meta["status"].(string)
	return st
}

// Tensors reassembles TENSOR packets (PART packets joined) in order of their first packet.
// It fails if parts overlap or leave gaps.
func (s *Stream) Tensors() ([]Packet, error) {
	var out []Packet
	var cur *Packet
	for _, p := range s.Packets {
		if p.Type != 1 {
			continue
		}
		if p.Flags&1 == 0 {
			if cur != nil {
				return nil, fmt.Errorf("tensor %q seq %d interrupts parts of %q", p.Name, p.Seq, cur.Name)
			}
			out = append(out, p)
			continue
		}
		if cur == nil {
			if p.PartOffset != 0 {
				return nil, fmt.Errorf("part of %q seq %d starts at %d", p.Name, p.Seq, p.PartOffset)
			}
			c := p
			c.Payload = append([]byte(nil), p.Payload...)
			cur = &c
		} else if p.PartOffset != uint64(len(cur.Payload)) || p.Name != cur.Name {
			return nil, fmt.Errorf("part of %q seq %d at offset %d, expected %d", p.Name, p.Seq, p.PartOffset, len(cur.Payload))
		} else {
			cur.Payload = append(cur.Payload, p.Payload...)
		}
		if uint64(len(cur.Payload)) == cur.TensorLen {
			cur.Flags = 0
			cur.RawLen = cur.TensorLen
			out = append(out, *cur)
			cur = nil
		}
	}
	if cur != nil {
		return nil, fmt.Errorf("tensor %q incomplete: %d of %d bytes", cur.Name, len(cur.Payload), cur.TensorLen)
	}
	return out, nil
}

// Activations returns n float32 values that look like activations (normal, a quarter zero,
// a few large outliers), deterministic in seed, as little-endian bytes.
func Activations(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, 4*n)
	for i := range n {
		v := float32(r.NormFloat64())
		switch {
		case r.IntN(4) == 0:
			v = 0
		case r.IntN(1000) == 0:
			v *= 100
		}
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}

// Equal reports whether two payloads are identical, with a short description otherwise.
func Equal(got, want []byte) error {
	if bytes.Equal(got, want) {
		return nil
	}
	if len(got) != len(want) {
		return fmt.Errorf("payload is %d bytes, want %d", len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			return fmt.Errorf("payload differs first at byte %d", i)
		}
	}
	return nil
}
