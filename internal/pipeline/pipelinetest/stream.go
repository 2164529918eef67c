package pipelinetest

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"

	"github.com/strap-llm/strap/internal/stream"
)

// Packet is one packet read back from a stream, payload decoded and meta parsed.
type Packet struct {
	Offset int64
	stream.Header
	Name    string
	Meta    map[string]any
	Payload []byte
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

// ReadFile reads and checks a whole stream file.
func ReadFile(path string) (*Stream, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Read(b)
}

// Read checks and decodes a stream held in b with the one Go reader, internal/stream (the
// Python reader is the independent second implementation, held to the same golden files).
func Read(b []byte) (*Stream, error) {
	r, err := stream.NewReader(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		return nil, err
	}
	s := &Stream{Meta: r.Header().Meta}
	sc := r.Scan(false)
	for sc.Next() {
		pi := sc.Packet()
		p := Packet{Offset: pi.Offset, Header: pi.Header, Name: pi.Name}
		if len(pi.Meta) > 0 {
			if err := json.Unmarshal(pi.Meta, &p.Meta); err != nil {
				return nil, fmt.Errorf("packet meta at %d: %w", pi.Offset, err)
			}
		}
		switch pi.Type {
		case stream.TypeTensor:
			if p.Payload, err = r.Decode(pi, sc.Payload()); err != nil {
				return nil, fmt.Errorf("decode packet at %d: %w", pi.Offset, err)
			}
		case stream.TypeIndex:
			p.Payload = sc.Payload()
		}
		switch pi.Type {
		case stream.TypeIndex:
			s.Index = &p
		case stream.TypeEnd:
			s.End = &p
		default:
			if s.End != nil {
				return nil, fmt.Errorf("packet after END at %d", pi.Offset)
			}
			s.Packets = append(s.Packets, p)
		}
	}
	if err := sc.Err(); err != nil {
		if !errors.Is(err, stream.ErrTruncated) || s.Index != nil {
			return nil, err
		}
		s.TruncatedAt = sc.Offset()
	}
	s.Footer = sc.Footer()
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
		if p.Type != stream.TypeTensor {
			continue
		}
		if !p.Part() {
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
