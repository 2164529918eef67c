package shm

import (
	"fmt"
)

// Reader walks the records of a data region between a tail and a published head. It checks
// positions and record bounds; sequence numbers are the caller's business because DROP and
// TOKEN notices share them.
type Reader struct {
	data   []byte
	size   uint64
	pos    uint64
	limits Limits
	cache  interned
}

// NewReader reads records of data (a data region) starting at position start.
func NewReader(data []byte, start uint64, lim Limits) *Reader {
	return &Reader{data: data, size: uint64(len(data)), pos: start, limits: lim,
		cache: interned{names: map[string]string{}, shapes: map[string][]uint64{}}}
}

// Pos is the position of the next record.
func (r *Reader) Pos() uint64 { return r.pos }

// Next parses the record at Pos, which must end at or before head, and advances past it.
// It returns the record and its position.
func (r *Reader) Next(head uint64) (Record, uint64, error) {
	pos := r.pos
	if head <= pos {
		return Record{}, pos, fmt.Errorf("%w: no record between position %d and head %d", ErrBadRecord, pos, head)
	}
	if pos%Align != 0 {
		return Record{}, pos, fmt.Errorf("%w: position %d is not a multiple of %d", ErrBadRecord, pos, Align)
	}
	off := pos % r.size
	avail := r.size - off
	if w := head - pos; w < avail {
		avail = w
	}
	rec, err := parseRecord(r.data[off:off+avail], r.limits, &r.cache)
	if err != nil {
		return rec, pos, fmt.Errorf("at position %d: %w", pos, err)
	}
	if rec.Kind == KindPad && off+rec.Len != r.size {
		return rec, pos, fmt.Errorf("at position %d: %w: pad record_len %d ends at region offset %d, expected the region end %d",
			pos, ErrBadRecord, rec.Len, off+rec.Len, r.size)
	}
	r.pos = pos + rec.Len
	return rec, pos, nil
}
