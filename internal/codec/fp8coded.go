package codec

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/strap-llm/strap/internal/dtype"
)

// FP8Coded builds the fp8 blocks of a tensor that the client coded itself (an FP8 ring
// record, PROTOCOL.md 2; COMPRESSION.md 10.1, "Coded on the device"): the codes, scales
// and error sums arrive as the client computed them, and each block comes out as the bytes
// fp8's EncodeStats writes for the same tensor, with the same BlockStats, without coding
// anything again. Every value is checked before it is copied into a block: a client's bad
// byte is an error, never a packet the decoders refuse.
type FP8Coded struct {
	dt                  dtype.DType
	n, rowLen, bv       int
	bound               float64
	scales, sums, codes []byte
	partOf              []int // the index of each block's first row part
}

// NewFP8Coded checks the layout of a coded tensor of n values of dt in rows of rowLen, cut
// into blocks of blockValues values, with the parts' scales (4 bytes each), sums (Σx²,
// Σ(x−y)², Σy², max|x−y| as 4 float64 each) and n codes; bound is the session's fp8 bound
// (0: none), which every part must meet as EncodeStats would have.
func NewFP8Coded(dt dtype.DType, n, rowLen, blockValues int, bound float64, scales, sums, codes []byte) (*FP8Coded, error) {
	if !fp8Able(dt) || n < 0 || rowLen <= 0 && n > 0 || blockValues <= 0 || len(codes) != n {
		return nil, fmt.Errorf("fp8 coded %s: %d values, %d codes, rows of %d, blocks of %d: %w",
			dt, n, len(codes), rowLen, blockValues, ErrCorrupt)
	}
	c := &FP8Coded{dt: dt, n: n, rowLen: rowLen, bv: blockValues, bound: bound, scales: scales, sums: sums, codes: codes}
	parts := 0
	for off := 0; off < n; off += blockValues {
		c.partOf = append(c.partOf, parts)
		nb := min(blockValues, n-off)
		first, row := c.cut(off, nb)
		parts += 1 + (nb-first+row-1)/row
	}
	if len(scales) != 4*parts || len(sums) != 32*parts {
		return nil, fmt.Errorf("fp8 coded: %d bytes of scales and %d of sums for %d row parts: %w",
			len(scales), len(sums), parts, ErrCorrupt)
	}
	return c, nil
}

// cut is the header of the block of nb values at value off: its first part's length and
// its row_len, as fp8Codec.locate finds them.
func (c *FP8Coded) cut(off, nb int) (first, row int) {
	into := off % c.rowLen
	return min(c.rowLen-into, nb), min(c.rowLen, nb)
}

// BlockLen is the stored size of block i (0 ≤ i < Blocks()).
func (c *FP8Coded) BlockLen(i int) int {
	off := i * c.bv
	nb := min(c.bv, c.n-off)
	first, row := c.cut(off, nb)
	return fp8Header + 4*(1+(nb-first+row-1)/row) + nb
}

// Blocks is the number of blocks of the tensor.
func (c *FP8Coded) Blocks() int { return len(c.partOf) }

// Block appends block i to dst: the mode-0 fp8 block of COMPRESSION.md 5.1, with the
// BlockStats EncodeStats reports for it. It refuses a NaN code, a scale that is not 0 or a
// finite normal float32, a part of scale 0 with a non-zero code, sums that are negative or
// not finite, and a part over the bound.
func (c *FP8Coded) Block(dst []byte, i int) ([]byte, BlockStats, error) {
	if i < 0 || i >= len(c.partOf) {
		return dst, BlockStats{}, fmt.Errorf("fp8 coded: block %d of %d: %w", i, len(c.partOf), ErrCorrupt)
	}
	off := i * c.bv
	nb := min(c.bv, c.n-off)
	first, row := c.cut(off, nb)
	groups := 1 + (nb-first+row-1)/row
	p0 := c.partOf[i]
	start := len(dst)
	dst = grow(dst, fp8Header+4*groups+nb)
	out := dst[start:]
	out[0] = modeLossy
	le := binary.LittleEndian
	le.PutUint32(out[1:], uint32(row))
	le.PutUint32(out[5:], uint32(first))
	copy(out[fp8Header:], c.scales[4*p0:4*(p0+groups)])
	codes := c.codes[off : off+nb]
	copy(out[fp8Header+4*groups:], codes)
	st := BlockStats{Values: nb, Rows: make([]RowSums, groups), FirstContinues: off%c.rowLen != 0}
	for g, lo := 0, 0; g < groups; g++ {
		hi := min(nb, first+g*row)
		if g == 0 {
			hi = first
		}
		p := p0 + g
		s := math.Float32frombits(le.Uint32(c.scales[4*p:]))
		if s != 0 && !(s >= minNormalScale && s <= math.MaxFloat32) || math.Signbit(float64(s)) {
			return dst[:start], st, fmt.Errorf("fp8 coded: value %d: scale %g (bits %#08x), expected +0 or a finite normal float32: %w",
				off+lo, s, le.Uint32(c.scales[4*p:]), ErrCorrupt)
		}
		for j, b := range codes[lo:hi] {
			if b&0x7F == 0x7F || s == 0 && b&0x7F != 0 {
				return dst[:start], st, fmt.Errorf("fp8 coded: value %d: code %#02x under scale %g: %w", off+lo+j, b, s, ErrCorrupt)
			}
		}
		var v [4]float64
		for k := range v {
			v[k] = math.Float64frombits(le.Uint64(c.sums[32*p+8*k:]))
			if !(v[k] >= 0 && v[k] <= math.MaxFloat64) {
				return dst[:start], st, fmt.Errorf("fp8 coded: value %d: error sum %d is %g, expected finite and ≥ 0: %w", off+lo, k, v[k], ErrCorrupt)
			}
		}
		r := rowSums(v[0], v[1], v[2])
		if c.bound > 0 && r.SumSqErr > c.bound*c.bound*r.SumSq {
			return dst[:start], st, fmt.Errorf("fp8 coded: value %d: row part error Σ(x−y)² %g over the bound %g of Σx² %g: %w",
				off+lo, r.SumSqErr, c.bound, r.SumSq, ErrCorrupt)
		}
		st.Rows[g] = r
		st.MaxAbs = max(st.MaxAbs, v[3])
		lo = hi
	}
	for _, r := range st.Rows {
		st.SumSq += r.SumSq
		st.SumSqErr += r.SumSqErr
	}
	return dst, st, nil
}
