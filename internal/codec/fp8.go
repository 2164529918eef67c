package codec

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/strap-llm/strap/internal/dtype"
)

// fp8 (codec 19, docs/COMPRESSION.md section 5): every row of the tensor (one token's
// vector: the last dimension) gets one float32 scale, max|x|/448, and its values are
// rounded to nearest even into OCP e4m3fn (1 sign, 4 exponent bits with bias 7, 3 mantissa
// bits; no infinities; 0x7F/0xFF are NaN and never written; largest finite ±448), saturating.
// A block holding a NaN or ±inf, or a row too small for a normal float32 scale, is stored
// losslessly and flagged (mode 1), as quant and fp16 do.

// e4m3Max is the largest finite e4m3fn value.
const e4m3Max = 448

// minNormalScale is the smallest scale that is a normal float32: below it a row (every
// |x| < 2⁻¹²⁶·448, float32 subnormals) is stored losslessly rather than lose its precision.
const minNormalScale = 0x1p-126

// fp8Header is mode, row_len and first (docs/COMPRESSION.md 5).
const fp8Header = 1 + 4 + 4

// E4M3 holds the value of every e4m3fn code as float32 (NaN for 0x7F and 0xFF). Both
// decoders compute a decoded element as float32(E4M3[code] × scale) then round it to the
// packet's dtype.
var E4M3 = func() (t [256]float32) {
	for c := range 256 {
		e, m := (c>>3)&15, c&7
		var v float64
		switch {
		case c&0x7F == 0x7F:
			v = math.NaN()
		case e == 0:
			v = float64(m) * 0x1p-9 // subnormal: m · 2⁻⁹
		default:
			v = math.Ldexp(1+float64(m)/8, e-7)
		}
		if c&0x80 != 0 {
			v = -v
		}
		t[c] = float32(v)
	}
	return t
}()

// e4m3 rounds the finite r to the nearest e4m3fn code (ties to even mantissa), saturating
// at ±448; the sign of r (also of ±0) is kept.
func e4m3(r float64) uint8 {
	u := math.Float64bits(r)
	sign := uint8(u>>56) & 0x80
	a := u &^ (1 << 63)
	switch {
	case a >= 0x407C000000000000: // |r| ≥ 448
		return sign | 0x7E
	case a >= 0x3F90000000000000: // |r| ≥ 2⁻⁶: normal
		// Rebias the exponent (1023 → 7) and round the 52-bit mantissa to 3 bits, to
		// nearest even; a carry out of the mantissa steps the exponent, as it should.
		v := a - (1023-7)<<52
		v = (v + (1<<48 - 1) + (v>>49)&1) >> 49
		return sign | uint8(min(v, 0x7E))
	default: // subnormal: m · 2⁻⁹ with m = round-half-even(|r|·2⁹), 8 being 2⁻⁶ (code 8)
		f := math.Float64frombits(a)*512 + 0x1p52
		return sign | uint8(math.Float64bits(f)-0x4330000000000000)
	}
}

// e4m3Fast is e4m3 with its common case, a normal value under 448, small enough to inline
// into the coding loops.
func e4m3Fast(r float64) uint8 {
	u := math.Float64bits(r)
	a := u &^ (1 << 63)
	if a-0x3F90000000000000 < 0x407C000000000000-0x3F90000000000000 {
		v := a - (1023-7)<<52
		v = (v + (1<<48 - 1) + (v>>49)&1) >> 49
		return uint8(u>>56)&0x80 | uint8(min(v, 0x7E))
	}
	return e4m3(r)
}

func init() {
	Register("fp8", FP8, newFP8)
}

// newFP8 builds the fp8 codec. Its bound is e4m3 rounding; Lossy{Mode: "fp8", Value: v}
// with v > 0 additionally stores losslessly every block holding a row whose relative L2
// error exceeds v. A nil bound gives the unbounded codec (what ByID returns for decoding).
func newFP8(o Options) (Codec, error) {
	if err := checkLevel("fp8", o.Level); err != nil {
		return nil, err
	}
	if o.Level != 0 {
		return nil, fmt.Errorf("fp8 level %d (only 0: the codes are stored as they are): %w", o.Level, ErrBadLevel)
	}
	c := &fp8Codec{}
	if o.Lossy != nil {
		v := o.Lossy.Value
		if o.Lossy.Mode != "fp8" || v < 0 || math.IsInf(v, 0) || math.IsNaN(v) {
			return nil, fmt.Errorf("fp8 bound %s %g (want fp8 ≥ 0): %w", o.Lossy.Mode, v, ErrBadBound)
		}
		c.rowRelL2 = v
	}
	return c, nil
}

type fp8Codec struct {
	// rowRelL2 > 0: the largest relative L2 error a row may have in an fp8 block.
	rowRelL2 float64
	// rowLen is the elements per row; 0 until ForRows (the block is then one row).
	rowLen int
	// tensor is the record ForRows was given: blocks are located in it to find where
	// their first row starts; skip is the elements of its first row before it.
	tensor []byte
	skip   int
}

// Bound implements LossyCodec.
func (c *fp8Codec) Bound() LossyBound { return LossyBound{Mode: "fp8", Value: c.rowRelL2} }

func (*fp8Codec) ID() ID       { return FP8 }
func (*fp8Codec) Name() string { return "fp8" }

// ForRows implements RowPreparer.
func (c *fp8Codec) ForRows(tensor []byte, dt dtype.DType, rowLen, skip int) (Codec, error) {
	if rowLen <= 0 || skip < 0 || skip >= rowLen {
		return nil, fmt.Errorf("fp8: row length %d, skip %d: %w", rowLen, skip, ErrBadBound)
	}
	cc := *c
	cc.rowLen, cc.tensor, cc.skip = rowLen, tensor, skip
	return &cc, nil
}

// ForTensor implements TensorPreparer for callers that know no shape: the tensor is one
// row (a 1-D tensor's last dimension is itself).
func (c *fp8Codec) ForTensor(tensor []byte, dt dtype.DType) (Codec, error) {
	if w := dt.Size(); w > 0 && len(tensor) >= w {
		return c.ForRows(tensor, dt, len(tensor)/w, 0)
	}
	return c, nil
}

// locate finds the block's rows: first is the number of elements of its first row part
// (the rest of a row begun in the previous block, cont true, or a whole row). src must be
// tensor[off:off+len(src)], as the pipeline cuts blocks; a block that is not (checked by
// address), or one given to an unprepared codec, starts a row.
func (c *fp8Codec) locate(src []byte, w, n int) (rowLen, first int, cont bool) {
	rowLen = c.rowLen
	if rowLen <= 0 {
		return n, n, false
	}
	off := cap(c.tensor) - cap(src) // a sub-slice keeps the capacity left after it
	if off < 0 || off+len(src) > len(c.tensor) || off%w != 0 || len(src) == 0 || &c.tensor[off] != &src[0] {
		return rowLen, min(rowLen, n), false
	}
	into := (c.skip + (off/w)%rowLen) % rowLen
	first = min(rowLen-into, n)
	// A row longer than the block is stored as row_len n, which cuts the block the same
	// way (a first part, then the rest) and fits the header's u32.
	return min(rowLen, n), first, into != 0
}

func (c *fp8Codec) Encode(dst, src []byte, dt dtype.DType) ([]byte, bool, error) {
	out, ok, _, err := c.EncodeStats(dst, src, dt)
	return out, ok, err
}

// fp8Able reports whether fp8 codes blocks of dt (others are stored losslessly).
func fp8Able(dt dtype.DType) bool {
	return dt == dtype.Float32 || dt == dtype.Float16 || dt == dtype.BFloat16
}

func (c *fp8Codec) EncodeStats(dst, src []byte, dt dtype.DType) ([]byte, bool, BlockStats, error) {
	w := dt.Size()
	if !fp8Able(dt) || len(src)%w != 0 || len(src) == 0 {
		return encodeLossless(dst, src, dt, 0)
	}
	n := len(src) / w
	rowLen, first, cont := c.locate(src, w, n)
	groups := 1 + (n-first+rowLen-1)/rowLen
	start := len(dst)
	dst = grow(dst, fp8Header+4*groups+n)
	out := dst[start:]
	out[0] = modeLossy
	binary.LittleEndian.PutUint32(out[1:], uint32(rowLen))
	binary.LittleEndian.PutUint32(out[5:], uint32(first))
	scales, codes := out[fp8Header:fp8Header+4*groups], out[fp8Header+4*groups:]
	st := BlockStats{Values: n, Rows: make([]RowSums, groups), FirstContinues: cont}
	for g, lo := 0, 0; g < groups; g++ {
		hi := min(n, first+g*rowLen)
		if g == 0 {
			hi = first
		}
		if !fp8Group(&st, g, src[lo*w:hi*w], codes[lo:hi], scales[4*g:], dt) {
			return encodeLossless(dst[:start], src, dt, 0)
		}
		lo = hi
	}
	if c.rowRelL2 > 0 {
		for _, r := range st.Rows {
			if r.SumSqErr > c.rowRelL2*c.rowRelL2*r.SumSq {
				return encodeLossless(dst[:start], src, dt, 0)
			}
		}
	}
	for _, r := range st.Rows {
		st.SumSq += r.SumSq
		st.SumSqErr += r.SumSqErr
	}
	return dst, true, st, nil
}

// fp8Group codes one row part: its scale into scale[:4], its codes, its sums into
// st.Rows[g], its largest error into st.MaxAbs. False when the part holds a NaN or ±inf
// or needs a scale below minNormalScale: the block is then stored losslessly.
func fp8Group(st *BlockStats, g int, src, codes, scale []byte, dt dtype.DType) bool {
	var amax float64
	switch dt {
	case dtype.Float32:
		done, m := fp8AbsMax32(src) // AVX2 for the leading multiple of 8 values
		for i := 4 * done; i+4 <= len(src); i += 4 {
			m = max(m, binary.LittleEndian.Uint32(src[i:])&0x7fffffff)
		}
		if m >= 0x7f800000 {
			return false
		}
		amax = float64(math.Float32frombits(m))
	case dtype.BFloat16:
		m := fp8AbsMaxBits16(src)
		if m >= 0x7f80 {
			return false
		}
		amax = float64(dtype.BFloat16ToFloat32(m))
	case dtype.Float16:
		m := fp8AbsMaxBits16(src)
		if m >= 0x7c00 {
			return false
		}
		amax = float64(f16Table[m])
	}
	s := float32(amax / e4m3Max)
	if amax > 0 && s < minNormalScale {
		return false
	}
	binary.LittleEndian.PutUint32(scale, math.Float32bits(s))
	inv := 0.0
	if s > 0 {
		inv = 1 / float64(s)
	}
	var r RowSums
	var mx float64
	switch dt {
	case dtype.Float32:
		r, mx = fp8CodeF32(src, codes, s, inv)
	default:
		r, mx = fp8Code16(src, codes, s, inv, dt == dtype.BFloat16)
	}
	st.Rows[g] = r
	st.MaxAbs = max(st.MaxAbs, mx)
	return true
}

// fp8AbsMaxBits16 is the largest of src's 2-byte values with the sign bit cleared (for
// bfloat16 and float16 alike, the bits order as the magnitudes do).
func fp8AbsMaxBits16(src []byte) uint16 {
	done, m := fp8AbsMax16(src) // AVX2 for the leading multiple of 16 values
	for i := 2 * done; i+2 <= len(src); i += 2 {
		m = max(m, binary.LittleEndian.Uint16(src[i:])&0x7fff)
	}
	return m
}

// fp8CodeF32 codes float32 values: code = e4m3(x · (1/s)) in float64, decoded value
// float32(E4M3[code] × s); it returns the row's sums and largest error. Two values a turn
// with their own sums keep the float adds' latency off the critical path.
func fp8CodeF32(src, codes []byte, s float32, inv float64) (r RowSums, mx float64) {
	n := len(src) / 4
	codes = codes[:n]
	src = src[:4*n]
	// AVX2 codes the leading multiple of 4 values (fp8_amd64.s), the loops below the rest.
	i, ss0, sse0, ssd0, mb0 := fp8Vec(src, codes, s, inv, dtype.Float32)
	var ss1, sse1, ssd1 float64
	var mb1 uint64 // bits of the largest |error|: an integer max, far cheaper than float max
	for ; i+2 <= n; i += 2 {
		x0 := float64(math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:])))
		x1 := float64(math.Float32frombits(binary.LittleEndian.Uint32(src[4*i+4:])))
		c0, c1 := e4m3Fast(x0*inv), e4m3Fast(x1*inv)
		codes[i], codes[i+1] = c0, c1
		y0, y1 := float64(E4M3[c0]*s), float64(E4M3[c1]*s)
		e0, e1 := x0-y0, x1-y1
		ss0, ss1 = ss0+x0*x0, ss1+x1*x1
		sse0, sse1 = sse0+e0*e0, sse1+e1*e1
		ssd0, ssd1 = ssd0+y0*y0, ssd1+y1*y1
		mb0, mb1 = max(mb0, math.Float64bits(e0)&^(1<<63)), max(mb1, math.Float64bits(e1)&^(1<<63))
	}
	for ; i < n; i++ {
		x := float64(math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:])))
		c := e4m3Fast(x * inv)
		codes[i] = c
		y := float64(E4M3[c] * s)
		e := x - y
		ss0, sse0, ssd0 = ss0+x*x, sse0+e*e, ssd0+y*y
		mb0 = max(mb0, math.Float64bits(e)&^(1<<63))
	}
	return rowSums(ss0+ss1, sse0+sse1, ssd0+ssd1), math.Float64frombits(max(mb0, mb1))
}

// rowSums completes a row's sums from Σx², Σ(x−y)² and Σy²: Σxy = (Σx² + Σy² − Σ(x−y)²)/2
// (no cancellation worth a digit: the error is a few percent of x).
func rowSums(ss, sse, ssd float64) RowSums {
	return RowSums{SumSq: ss, SumSqErr: sse, Dot: (ss + ssd - sse) / 2, SumSqDec: ssd}
}

// fp8Code16 is fp8CodeF32 for bfloat16 and float16: the decoded value is rounded to the
// element type (round to nearest even) before the error is measured.
func fp8Code16(src, codes []byte, s float32, inv float64, bf bool) (r RowSums, mx float64) {
	n := len(src) / 2
	codes = codes[:n]
	src = src[:2*n]
	var ss0, sse0, ssd0, ss1, sse1, ssd1 float64
	var mb0, mb1 uint64
	var sh uint32 = 16 // bfloat16 widens by a shift; float16 through f16Table
	i := 0
	// AVX2 (with F16C for float16) codes the leading multiple of 4 values (fp8_amd64.s).
	if bf {
		i, ss0, sse0, ssd0, mb0 = fp8Vec(src, codes, s, inv, dtype.BFloat16)
	} else {
		i, ss0, sse0, ssd0, mb0 = fp8Vec(src, codes, s, inv, dtype.Float16)
	}
	if i == n { // all of it (the table below costs a 2 KiB clear a call)
		return rowSums(ss0, sse0, ssd0), math.Float64frombits(mb0)
	}
	// float16: the decoded value of each code, tabled (256 roundings a row part); bfloat16
	// rounds each value left over from the vector loop (at most 3, or all without AVX2).
	var tab [256]float64
	for c := range 256 {
		if bf || i == n {
			break
		}
		if c&0x7F != 0x7F {
			tab[c] = float64(f16Table[dtype.Float32ToFloat16(E4M3[c]*s)])
		}
	}
	dec := func(c uint8) float64 {
		if bf {
			return float64(dtype.BFloat16ToFloat32(dtype.Float32ToBFloat16(E4M3[c] * s)))
		}
		return tab[c]
	}
	for ; i+2 <= n; i += 2 {
		h0, h1 := binary.LittleEndian.Uint16(src[2*i:]), binary.LittleEndian.Uint16(src[2*i+2:])
		var x0, x1 float64
		if bf {
			x0, x1 = float64(math.Float32frombits(uint32(h0)<<sh)), float64(math.Float32frombits(uint32(h1)<<sh))
		} else {
			x0, x1 = float64(f16Table[h0]), float64(f16Table[h1])
		}
		c0, c1 := e4m3Fast(x0*inv), e4m3Fast(x1*inv)
		codes[i], codes[i+1] = c0, c1
		y0, y1 := dec(c0), dec(c1)
		e0, e1 := x0-y0, x1-y1
		ss0, ss1 = ss0+x0*x0, ss1+x1*x1
		sse0, sse1 = sse0+e0*e0, sse1+e1*e1
		ssd0, ssd1 = ssd0+y0*y0, ssd1+y1*y1
		mb0, mb1 = max(mb0, math.Float64bits(e0)&^(1<<63)), max(mb1, math.Float64bits(e1)&^(1<<63))
	}
	for ; i < n; i++ {
		h := binary.LittleEndian.Uint16(src[2*i:])
		x := float64(f16Table[h])
		if bf {
			x = float64(math.Float32frombits(uint32(h) << sh))
		}
		c := e4m3Fast(x * inv)
		codes[i] = c
		y := dec(c)
		e := x - y
		ss0, sse0, ssd0 = ss0+x*x, sse0+e*e, ssd0+y*y
		mb0 = max(mb0, math.Float64bits(e)&^(1<<63))
	}
	return rowSums(ss0+ss1, sse0+sse1, ssd0+ssd1), math.Float64frombits(max(mb0, mb1))
}

func (c *fp8Codec) Decode(dst, src []byte, dt dtype.DType, rawLen int) ([]byte, error) {
	out, err := decodeFP8(dst, src, dt, rawLen)
	if err != nil {
		return nil, fmt.Errorf("fp8: %w", err)
	}
	return out, nil
}

func decodeFP8(dst, src []byte, dt dtype.DType, rawLen int) ([]byte, error) {
	if out, done, err := decodeLosslessMode(dst, src, dt, rawLen); done {
		return out, err
	}
	w := dt.Size()
	if !fp8Able(dt) || rawLen%w != 0 || rawLen == 0 {
		return nil, fmt.Errorf("fp8 block of %s, %d bytes: %w", dt, rawLen, ErrCorrupt)
	}
	n := rawLen / w
	if len(src) < fp8Header {
		return nil, fmt.Errorf("short header: %w", ErrCorrupt)
	}
	rowLen := int(binary.LittleEndian.Uint32(src[1:]))
	first := int(binary.LittleEndian.Uint32(src[5:]))
	if first < 1 || first > rowLen || first > n {
		return nil, fmt.Errorf("row length %d, first part %d of %d values: %w", rowLen, first, n, ErrCorrupt)
	}
	groups := 1 + (n-first+rowLen-1)/rowLen
	if len(src) != fp8Header+4*groups+n {
		return nil, fmt.Errorf("%d bytes for %d rows of %d values: %w", len(src), groups, n, ErrCorrupt)
	}
	scales, codes := src[fp8Header:fp8Header+4*groups], src[fp8Header+4*groups:]
	start := len(dst)
	dst = grow(dst, rawLen)
	out := dst[start:]
	for g, lo := 0, 0; g < groups; g++ {
		hi := min(n, first+g*rowLen)
		if g == 0 {
			hi = first
		}
		s := math.Float32frombits(binary.LittleEndian.Uint32(scales[4*g:]))
		if !(s >= 0) || math.IsInf(float64(s), 0) || math.Signbit(float64(s)) {
			return nil, fmt.Errorf("row part %d: scale %g: %w", g, s, ErrCorrupt)
		}
		cs := codes[lo:hi]
		switch dt {
		case dtype.Float32:
			o := out[4*lo : 4*hi]
			for i, c := range cs {
				if c&0x7F == 0x7F {
					return nil, fmt.Errorf("NaN code at %d: %w", lo+i, ErrCorrupt)
				}
				binary.LittleEndian.PutUint32(o[4*i:], math.Float32bits(E4M3[c]*s))
			}
		case dtype.BFloat16:
			o := out[2*lo : 2*hi]
			for i, c := range cs {
				if c&0x7F == 0x7F {
					return nil, fmt.Errorf("NaN code at %d: %w", lo+i, ErrCorrupt)
				}
				binary.LittleEndian.PutUint16(o[2*i:], dtype.Float32ToBFloat16(E4M3[c]*s))
			}
		case dtype.Float16:
			o := out[2*lo : 2*hi]
			if len(cs) < 256 {
				for i, c := range cs {
					if c&0x7F == 0x7F {
						return nil, fmt.Errorf("NaN code at %d: %w", lo+i, ErrCorrupt)
					}
					binary.LittleEndian.PutUint16(o[2*i:], dtype.Float32ToFloat16(E4M3[c]*s))
				}
				break
			}
			// A long part: its 256 values rounded once (the rounding is a branchy function).
			var tab [256]uint16
			for c := range 256 {
				tab[c] = dtype.Float32ToFloat16(E4M3[c] * s)
			}
			for i, c := range cs {
				if c&0x7F == 0x7F {
					return nil, fmt.Errorf("NaN code at %d: %w", lo+i, ErrCorrupt)
				}
				binary.LittleEndian.PutUint16(o[2*i:], tab[c])
			}
		}
		lo = hi
	}
	return dst, nil
}
