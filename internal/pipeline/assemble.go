package pipeline

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/strap-llm/strap/internal/codec"
	"github.com/strap-llm/strap/internal/dtype"
	"github.com/strap-llm/strap/internal/shm"
	"github.com/strap-llm/strap/internal/stream"
)

// packet assembles the stream packet of one item: the record's header fields, its meta
// (with the lossy report folded in) and its blocks; notices get their meta from the
// stream package's schema.
func (s *Session) packet(it *item) (stream.Packet, error) {
	switch it.kind {
	case kindDrop:
		d := it.drop
		reason := d.Reason
		if reason == "" {
			reason = stream.DefaultDropReason
		}
		meta, err := json.Marshal(stream.DropMeta{Reason: reason})
		return stream.Packet{Header: stream.Header{Type: stream.TypeDrop, DType: dtype.Invalid, Seq: d.Seq,
			Step: d.Step, Forward: d.Forward, RawLen: d.Bytes, TensorLen: d.Bytes}, Name: d.Name, Meta: meta}, err
	case kindToken:
		t := it.tok
		pos := int64(t.Index)
		if t.Position != nil {
			pos = *t.Position
		}
		meta, err := json.Marshal(stream.TokenMeta{Position: pos, Text: t.Text, TokenID: t.TokenID})
		return stream.Packet{Header: stream.Header{Type: stream.TypeToken, Seq: t.Seq, Step: t.Index},
			Name: "token", Meta: meta}, err
	}
	r := &it.rec
	p := stream.Packet{Header: stream.Header{Type: stream.TypeTensor, DType: r.DType, Shape: r.Shape,
		Seq: r.Seq, Step: r.Step, Forward: r.Forward, RawLen: uint64(len(r.Payload)),
		PartOffset: r.PartOffset, TensorLen: r.TensorLen}, Name: r.Name, Meta: it.meta}
	if r.Flags&shm.FlagPart != 0 {
		p.Flags = stream.FlagPart
	}
	if it.coded != nil {
		p.RawLen = r.TensorLen // the blocks decode to the tensor, not to the ring payload
	}
	if it.stats != nil {
		meta, err := s.lossyMeta(it)
		if err != nil {
			return p, err
		}
		p.Meta = meta
	}
	if s.codec == nil {
		p.Codec = codec.None
		it.block1[0] = stream.Block{Data: r.Payload}
		p.Blocks = it.block1[:]
		p.Shared = true // straight from the ring, which the client can write
	} else {
		p.Codec = s.codec.ID()
		p.BlockSize = uint32(s.bs)
		p.Blocks = it.blocks
	}
	return p, nil
}

// errBoundExceeded: a lossy codec reported an error beyond its bound (a codec bug).
var errBoundExceeded = errors.New("lossy codec exceeded its error bound")

// lossyMeta folds a lossy packet's block stats into its meta under "lossy"
// (docs/COMPRESSION.md 6), refusing a packet whose error exceeds the bound.
func (s *Session) lossyMeta(it *item) ([]byte, error) {
	var b codec.LossyBound
	if lc, ok := s.codec.(codec.LossyCodec); ok {
		b = lc.Bound()
	}
	rep := codec.Report(b, it.stats)
	if rep.Exceeds() {
		return nil, fmt.Errorf("seq %d (%s): %w: %+v", it.seq, it.rec.Name, errBoundExceeded, rep)
	}
	obj := map[string]any{}
	if len(it.meta) > 0 {
		if err := json.Unmarshal(it.meta, &obj); err != nil {
			return nil, fmt.Errorf("seq %d meta: %w", it.seq, err)
		}
	}
	obj["lossy"] = rep
	return json.Marshal(obj)
}
