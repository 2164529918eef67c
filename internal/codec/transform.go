package codec

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/strap-llm/strap/internal/dtype"
)

// transform (codec 20, docs/COMPRESSION.md section 5.2): each block may carry its own
// orthonormal basis — the leading principal directions of its rows (a row = one token's
// vector, the tensor's last dimension), found from up to 256 of them, kept only where it
// pays — and codes whole rows as their mean-removed coefficients on its first k vectors, quantized with a
// step of the row's own so that the row's relative L2 error stays under the user's bound.
// Rows the basis cannot carry within the bound (and the parts of rows cut by the block's
// edges) are coded directly, value by value, at a step of their own; the integers are
// entropy-coded in plane frames. Every row is decoded by the encoder with the decoder's own
// arithmetic and checked against the bound; a block that cannot be carried (NaN, ±inf, a
// dtype other than float32/bfloat16/float16, a row too small or too large for a float32
// step) is stored losslessly and flagged (mode 1).
//
// Why the basis lives in every block rather than once per module: the stored bytes must be a
// function of the block alone. The pipeline codes a record's blocks in parallel, may store any
// block raw when its CPU budget is spent, and a resumed capture must equal the uninterrupted
// one byte for byte (COMPRESSION.md 11: an encoder that depended on what it had coded before
// broke exactly that); a reader may also start at any packet. A basis kept across records
// would need the pipeline to pass the module, to order basis refreshes across blocks coded
// concurrently, and every reader (Go and Python) to carry state from packet to packet. The
// price is the basis' bytes in every block (section 5.2 measures it). Modes 3 and 4
// (transform_shared.go, section 5.3) are that shared basis on the codec's side: a block's bytes
// are then a function of the block and one basis packet it names by crc32.

// Transform is the per-block PCA transform codec (docs/COMPRESSION.md 5.2).
const Transform ID = 20

// DefaultTransformBound is the per-row relative L2 error of a "transform" codec given no
// bound: √(1 − 0.995²), which guarantees a per-row cosine of at least 0.995 (‖x̂ − x‖ ≤ r‖x‖
// puts x̂ within the angle asin r of x).
var DefaultTransformBound = math.Sqrt(1 - 0.995*0.995)

const (
	// transformHeader is mode, row_len, first, k, shift, width.
	transformHeader = 1 + 4 + 4 + 2 + 1 + 1
	// Part kinds (one byte per row part).
	partDirect = 0 // values coded one by one: x̂ = float32(step·k)
	partBasis  = 1 // a whole row coded by its k coefficients on the block's basis
	partZero   = 2 // all values zero: decoded as +0, step 0
	// maxBasis bounds k; with |B| < 2¹⁵ and |coefficient| < 2²³ every sum of k products
	// stays below 2⁴⁸: exact in int64 and in float64, in any order (Python sums with BLAS).
	maxBasis = 1024
	// maxInt is the largest |integer| stored (zigzag below 2²⁴: at most 3 bytes).
	maxInt = 1<<23 - 1
	// pcaSample is the most rows the basis is computed from; pcaWidth the most vectors.
	pcaSample   = 256
	pcaWidth    = 96
	probeSample = 64
	probeWidth  = 16
	// minBasisRows: fewer whole rows in a block are coded directly (a basis would cost more
	// than it saves).
	minBasisRows = 16
	// stepMargin: steps aim at this share of the bound, so that few rows need a second try.
	stepMargin = 0.97
)

// A directly coded part's first step aims at the bound itself (the rounding error of many
// values lands close to its expectation q²/12); a miss retries at a step this much smaller.
// Measured on MiniLM (bf16, rel-L2 0.1): margin 0.97 and retries at 0.7q stored 4.83×,
// these 5.08×.
var directMargin, directRetry = 1.0, 0.95

// transformMode is the layout the encoder writes: modeGrouped (2), or modeLossy (0, the
// layout before issue 40's second pass; kept for the tests that compare the two).
var transformMode = modeGrouped

func init() {
	Register("transform", Transform, newTransform)
}

// newTransform builds the transform codec. Lossy{Mode: "transform", Value: r} bounds every
// row's relative L2 error by r (0 < r < 1); no bound means DefaultTransformBound.
func newTransform(o Options) (Codec, error) {
	if o.Level != 0 {
		return nil, fmt.Errorf("transform level %d (only 0: huff0 plane frames): %w", o.Level, ErrBadLevel)
	}
	c := &transformCodec{relL2: DefaultTransformBound}
	if o.Lossy != nil {
		v := o.Lossy.Value
		if o.Lossy.Mode != "transform" || !(v > 0) || !(v < 1) {
			return nil, fmt.Errorf("transform bound %s %g (want transform, a per-row rel-L2 in (0, 1)): %w", o.Lossy.Mode, v, ErrBadBound)
		}
		c.relL2 = v
	}
	return c, nil
}

type transformCodec struct {
	// relL2 is the largest relative L2 error any row (row part) may have.
	relL2 float64
	// rows locates blocks in the record (rowLen 0: unprepared, the block is one row).
	rows fp8Codec
	// shared is the module's basis (WithBasis), nil when blocks carry their own.
	shared *SharedBasis
}

// Bound implements LossyCodec.
func (c *transformCodec) Bound() LossyBound { return LossyBound{Mode: "transform", Value: c.relL2} }

func (*transformCodec) ID() ID       { return Transform }
func (*transformCodec) Name() string { return "transform" }

// ForRows implements RowPreparer: rows are the tensor's last dimension, as for fp8.
func (c *transformCodec) ForRows(tensor []byte, dt dtype.DType, rowLen, skip int) (Codec, error) {
	if rowLen <= 0 || skip < 0 || skip >= rowLen {
		return nil, fmt.Errorf("transform: row length %d, skip %d: %w", rowLen, skip, ErrBadBound)
	}
	cc := *c
	cc.rows = fp8Codec{rowLen: rowLen, tensor: tensor, skip: skip}
	return &cc, nil
}

// ForTensor implements TensorPreparer for callers that know no shape: one row.
func (c *transformCodec) ForTensor(tensor []byte, dt dtype.DType) (Codec, error) {
	if w := dt.Size(); w > 0 && len(tensor) >= w {
		return c.ForRows(tensor, dt, len(tensor)/w, 0)
	}
	return c, nil
}

func (c *transformCodec) Encode(dst, src []byte, dt dtype.DType) ([]byte, bool, error) {
	out, ok, _, err := c.EncodeStats(dst, src, dt)
	return out, ok, err
}

// tPart is one row part of a block while it is coded.
type tPart struct {
	lo, hi int     // values [lo, hi) of the block
	kind   uint8   // partDirect, partBasis, partZero
	step   float32 // the stored step
	ints   []int32 // k coefficients (basis) or hi-lo values (direct)
	sums   RowSums
	maxAbs float64
}

func (c *transformCodec) EncodeStats(dst, src []byte, dt dtype.DType) ([]byte, bool, BlockStats, error) {
	if c.shared != nil {
		return c.encodeShared(dst, src, dt)
	}
	return c.encodePlain(dst, src, dt)
}

// encodePlain codes a block with nothing shared: modes 0 and 2.
func (c *transformCodec) encodePlain(dst, src []byte, dt dtype.DType) ([]byte, bool, BlockStats, error) {
	w := dt.Size()
	if !fp8Able(dt) || len(src)%w != 0 || len(src) == 0 {
		return encodeLossless(dst, src, dt, 0)
	}
	n := len(src) / w
	x := make([]float64, n)
	for i := range n {
		v := loadFloat(src, dt, i)
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return encodeLossless(dst, src, dt, 0)
		}
		x[i] = v
	}
	rowLen, first, cont := c.rows.locate(src, w, n)
	groups := 1 + (n-first+rowLen-1)/rowLen
	parts := make([]tPart, groups)
	var full []int // indices of whole rows
	for g, lo := 0, 0; g < groups; g++ {
		hi := min(n, first+g*rowLen)
		if g == 0 {
			hi = first
		}
		parts[g] = tPart{lo: lo, hi: hi}
		if hi-lo == rowLen && !(g == 0 && cont) {
			full = append(full, g)
		}
		lo = hi
	}
	d := rowLen
	var basis *tBasis
	if len(full) >= minBasisRows && d >= 8 && d <= 1<<16 {
		// A small basis first (probeSample rows, probeWidth vectors), the encoder's main
		// cost being the basis: a block where it does not pay is coded directly, one where
		// fewer vectors than it has pay is coded on it, and only one that wants them all
		// gets the full basis (pcaSample rows, pcaWidth vectors).
		if probe := newBasis(x, parts, full, d, c.relL2, probeSample, probeWidth); probe != nil {
			switch k, _, _ := probe.pickK(x, parts, full, c.relL2); {
			case k == probe.l && probe.l < min(pcaWidth, len(full), d):
				basis = newBasis(x, parts, full, d, c.relL2, pcaSample, pcaWidth)
			case k > 0:
				basis = probe
			}
		}
	}
	if basis != nil {
		basis.code(x, parts, full, dt, c.relL2)
		if basis.k == 0 {
			basis = nil
		}
	}
	out, st, lossy, err := finishTransform(dst, x, dt, parts, basis, c.relL2, rowLen, first, cont)
	if err != nil {
		return nil, false, st, fmt.Errorf("transform: %w", err)
	}
	if lossy && basis != nil && transformMode == modeGrouped {
		// Whether the basis pays is measured, not estimated: the block coded without it
		// (pickK's estimate assumes one entropy table for all values, which the channel
		// groups beat; on MiniLM a basis kept by the estimate cost 3 % of the ratio).
		plain := make([]tPart, len(parts))
		for g, p := range parts {
			plain[g] = tPart{lo: p.lo, hi: p.hi}
		}
		alt, st2, lossy2, err := finishTransform(nil, x, dt, plain, nil, c.relL2, rowLen, first, cont)
		if err != nil {
			return nil, false, st, fmt.Errorf("transform: %w", err)
		}
		if lossy2 && len(alt) < len(out)-len(dst) {
			out, st = append(out[:len(dst)], alt...), st2
		}
	}
	if !lossy || len(out)-len(dst) >= len(src) {
		return encodeLossless(dst, src, dt, 0)
	}
	return out, true, st, nil
}

// finishTransform codes the parts the basis did not take directly and writes the block;
// lossy false: a part cannot be carried (the block is then stored losslessly).
func finishTransform(dst []byte, x []float64, dt dtype.DType, parts []tPart, basis *tBasis, bound float64, rowLen, first int, cont bool) ([]byte, BlockStats, bool, error) {
	st := BlockStats{Values: len(x), Rows: make([]RowSums, len(parts)), FirstContinues: cont}
	for g := range parts {
		p := &parts[g]
		if p.kind == partBasis {
			continue
		}
		if !codeDirect(p, x[p.lo:p.hi], dt, bound) {
			return nil, st, false, nil
		}
	}
	for g, p := range parts {
		st.Rows[g] = p.sums
		st.SumSq += p.sums.SumSq
		st.SumSqErr += p.sums.SumSqErr
		st.MaxAbs = max(st.MaxAbs, p.maxAbs)
	}
	var out []byte
	var err error
	if transformMode == modeGrouped && len(parts) >= minGroupedParts {
		out, err = appendTransformGrouped(dst, parts, basis, rowLen, first)
	} else {
		out, err = appendTransform(dst, parts, basis, rowLen, first)
	}
	return out, st, true, err
}

// roundTo rounds a decoded float32 to dt, as both decoders do.
func roundTo(f float32, dt dtype.DType) float64 {
	switch dt {
	case dtype.BFloat16:
		return float64(dtype.BFloat16ToFloat32(dtype.Float32ToBFloat16(f)))
	case dtype.Float16:
		return float64(f16Table[dtype.Float32ToFloat16(f)])
	}
	return float64(f)
}

// codeDirect codes a part value by value: an all-zero part as partZero, else at the step
// that puts its rel-L2 error under the bound (smaller steps on a miss). False when no step
// works (a part too small or too large for a normal float32 step).
func codeDirect(p *tPart, x []float64, dt dtype.DType, bound float64) bool {
	var ss float64
	for _, v := range x {
		ss += v * v
	}
	p.kind, p.ints = partDirect, make([]int32, len(x))
	if ss == 0 {
		p.kind, p.step, p.sums, p.maxAbs = partZero, 0, RowSums{}, 0
		return true
	}
	q := directMargin * bound * math.Sqrt(12*ss/float64(len(x)))
	for try := 0; try < 16; try, q = try+1, q*directRetry {
		s := float32(q)
		if !(s >= 0x1p-126) || math.IsInf(float64(s), 0) {
			return false
		}
		inv, qs := 1/float64(s), float64(s)
		var sse, ssd, mx float64
		ok := true
		for i, v := range x {
			r := math.RoundToEven(v * inv)
			if !(math.Abs(r) <= maxInt) {
				ok = false
				break
			}
			p.ints[i] = int32(r)
			y := roundTo(float32(qs*r), dt)
			e := v - y
			sse, ssd, mx = sse+e*e, ssd+y*y, max(mx, math.Abs(e))
		}
		if ok && sse <= bound*bound*ss {
			p.step, p.sums, p.maxAbs = s, rowSums(ss, sse, ssd), mx
			return true
		}
	}
	return false
}

// tBasis is a block's basis while it is coded: k vectors of d integers, each vector's
// value B·2⁻ˢʰⁱᶠᵗ, and the rows' mean.
type tBasis struct {
	d, k, shift int
	mean        []float32 // d
	b           []int32   // k×d, |b| ≤ 32767
	v           []float64 // k×d: b·2⁻ˢʰⁱᶠᵗ (the basis the decoder uses)
	coef        []float64 // len(full)×l coefficients on all l vectors (k chosen from them)
	l           int
}

// newBasis computes the mean and the principal directions of the block's whole rows, rounds
// them to the stored integers, and projects every whole row on them (nil when the rows have
// no spread).
func newBasis(x []float64, parts []tPart, full []int, d int, bound float64, sample, width int) *tBasis {
	nb := len(full)
	mean64 := make([]float64, d)
	for _, g := range full {
		row := x[parts[g].lo:parts[g].hi]
		for i, v := range row {
			mean64[i] += v
		}
	}
	tb := &tBasis{d: d, mean: make([]float32, d)}
	for i := range mean64 {
		tb.mean[i] = float32(mean64[i] / float64(nb))
	}
	m := min(nb, sample)
	rows := make([]float64, m*d)
	for s := range m {
		g := full[s*nb/m]
		row := x[parts[g].lo:parts[g].hi]
		for i, v := range row {
			rows[s*d+i] = v - float64(tb.mean[i])
		}
	}
	l := min(width, m, d, maxBasis)
	vecs := principal(rows, m, d, l)
	if len(vecs) == 0 {
		return nil
	}
	l = len(vecs) / d
	// Stored basis resolution: the rounding of a unit vector then moves a row by about
	// 2⁻ˢʰⁱᶠᵗ·√(d/12) of its norm; keep that under 5 % of the bound.
	shift := int(math.Ceil(math.Log2(math.Sqrt(float64(d)/12) / (0.05 * bound))))
	shift = min(max(shift, 8), 15)
	tb.shift, tb.l = shift, l
	tb.b = make([]int32, l*d)
	tb.v = make([]float64, l*d)
	sc := math.Ldexp(1, shift)
	for i, v := range vecs {
		r := math.RoundToEven(v * sc)
		r = min(max(r, -32767), 32767)
		tb.b[i] = int32(r)
		tb.v[i] = r / sc
	}
	tb.coef = make([]float64, nb*l)
	c := make([]float64, d)
	for r, g := range full {
		row := x[parts[g].lo:parts[g].hi]
		for i, v := range row {
			c[i] = v - float64(tb.mean[i])
		}
		for j := range l {
			tb.coef[r*l+j] = dot(c, tb.v[j*d:(j+1)*d])
		}
	}
	return tb
}

// pickK is the k (a multiple of 8 up to l, or 0) with the smallest estimated block, and the
// whole rows' Σx² and Σ(x−μ)².
func (tb *tBasis) pickK(x []float64, parts []tPart, full []int, bound float64) (k int, ss, cs []float64) {
	d, l := tb.d, tb.l
	nb := len(full)
	ss = make([]float64, nb) // Σx²
	cs = make([]float64, nb) // Σ(x−μ)²
	for r, g := range full {
		row := x[parts[g].lo:parts[g].hi]
		for i, v := range row {
			ss[r] += v * v
			e := v - float64(tb.mean[i])
			cs[r] += e * e
		}
	}
	// Estimated bits of the block for k vectors: the basis, each row's coefficients at the
	// step its left-over budget allows (≈ log2 of its magnitude in steps, plus one), and the
	// rows that must be coded directly (≈ log2 √(2πe/12)·‖x‖/budget a value).
	bitsB := max(2, float64(tb.shift)-0.5*math.Log2(float64(d))+2.05)
	direct := func(r int) float64 {
		b2 := stepMargin * stepMargin * bound * bound * ss[r]
		return float64(d) * max(1, 0.5*math.Log2(2*math.Pi*math.E/12*ss[r]/b2))
	}
	bestK, best := 0, 0.0
	for r := range nb {
		best += direct(r)
	}
	stride := max(1, nb/128) // estimate on up to 128 rows, scaled
	for k := 8; k <= l; k += 8 {
		var bits float64
		for r := 0; r < nb; r += stride {
			bits += tb.rowBits(r, k, ss[r], cs[r], bound, direct)
		}
		bits = bits*float64(nb)/float64((nb+stride-1)/stride) + float64(k*d)*bitsB + float64(32*d)
		if bits < best {
			bestK, best = k, bits
		}
	}
	return bestK, ss, cs
}

// code picks k (pickK) and codes every whole row it can on the first k vectors; the others
// stay for codeDirect. k = 0 when no row is worth it.
func (tb *tBasis) code(x []float64, parts []tPart, full []int, dt dtype.DType, bound float64) {
	d, l := tb.d, tb.l
	k, ss, cs := tb.pickK(x, parts, full, bound)
	tb.k = k
	if k == 0 {
		return
	}
	acc := make([]float64, d)
	ints := make([]int32, k)
	used := 0
	for r, g := range full {
		p := &parts[g]
		coef := tb.coef[r*l : r*l+k]
		var kept float64
		for _, v := range coef {
			kept += v * v
		}
		b2 := stepMargin * stepMargin * bound * bound * ss[r]
		rho2 := max(0, cs[r]-kept)
		if ss[r] == 0 || rho2 >= 0.85*b2 {
			continue
		}
		q := math.Sqrt(12 * (b2 - rho2) / float64(k))
		for try := 0; try < 6; try, q = try+1, q*0.9 {
			s := float32(q)
			if !(s >= 0x1p-126) || math.IsInf(float64(s), 0) {
				break
			}
			qs := float64(s)
			inv := 1 / qs
			ok := true
			for j, v := range coef {
				rr := math.RoundToEven(v * inv)
				if !(math.Abs(rr) <= maxInt) {
					ok = false
					break
				}
				ints[j] = int32(rr)
			}
			if !ok {
				break
			}
			sums, mx := tb.reconstruct(acc, ints, s, x[p.lo:p.hi], dt)
			if sums.SumSqErr <= bound*bound*sums.SumSq {
				p.kind, p.step, p.ints, p.sums, p.maxAbs = partBasis, s, append([]int32(nil), ints...), sums, mx
				used++
				break
			}
		}
	}
	if used == 0 {
		tb.k = 0
		return
	}
	tb.b = tb.b[:k*d]
}

// rowBits estimates the bits of row r on k vectors (direct coding when the basis leaves
// more than the budget).
func (tb *tBasis) rowBits(r, k int, ss, cs, bound float64, direct func(int) float64) float64 {
	coef := tb.coef[r*tb.l : r*tb.l+k]
	var kept float64
	for _, v := range coef {
		kept += v * v
	}
	b2 := stepMargin * stepMargin * bound * bound * ss
	rho2 := max(0, cs-kept)
	if ss == 0 || rho2 >= 0.85*b2 {
		return direct(r)
	}
	q := math.Sqrt(12 * (b2 - rho2) / float64(k))
	bits := 8.0 // the step, and a kind byte
	for _, v := range coef {
		bits += math.Log2(1+2*math.Abs(v)/q) + 0.6
	}
	return bits
}

// reconstruct decodes a basis row exactly as the decoders do — A = Σⱼ intsⱼ·Bⱼ (exact),
// x̂ = float32(μ + (step·2⁻ˢʰⁱᶠᵗ)·A) rounded to dt — and returns its sums against x.
func (tb *tBasis) reconstruct(acc []float64, ints []int32, step float32, x []float64, dt dtype.DType) (RowSums, float64) {
	d := tb.d
	clear(acc)
	for j, c := range ints {
		if c == 0 {
			continue
		}
		cf := float64(c)
		bj := tb.b[j*d : (j+1)*d]
		for i := range acc {
			acc[i] += cf * float64(bj[i])
		}
	}
	qs := math.Ldexp(float64(step), -tb.shift)
	var ss, sse, ssd, mx float64
	for i, v := range x {
		y := roundTo(float32(float64(tb.mean[i])+float64(qs*acc[i])), dt) // no fused multiply-add
		e := v - y
		ss, sse, ssd, mx = ss+v*v, sse+e*e, ssd+y*y, max(mx, math.Abs(e))
	}
	return rowSums(ss, sse, ssd), mx
}

func dot(a, b []float64) float64 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float64
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}

func axpy(y []float64, a float64, x []float64) {
	x = x[:len(y)]
	for i := range y {
		y[i] += a * x[i]
	}
}

// orthonormalize makes the vectors (rows of vs, each of length n) orthonormal in order by
// modified Gram–Schmidt (twice, for accuracy), dropping those with nothing left; it returns
// the kept vectors.
func orthonormalize(vs []float64, n int) []float64 {
	out := vs[:0]
	for off := 0; off+n <= len(vs); off += n {
		v := vs[off : off+n]
		orig := math.Sqrt(dot(v, v))
		for range 2 {
			for o := 0; o < len(out); o += n {
				u := out[o : o+n]
				axpy(v, -dot(u, v), u)
			}
		}
		nv := math.Sqrt(dot(v, v))
		if !(nv > 1e-9*orig) || nv == 0 {
			continue
		}
		for i := range v {
			v[i] /= nv
		}
		out = append(out, v...) // out never overtakes v: append copies forward in place
	}
	return out
}

// principal returns up to l orthonormal vectors of length d spanning (approximately) the
// leading right singular vectors of the m×d matrix a, strongest first: a randomized range
// finder with one power iteration and a Rayleigh–Ritz step (Halko, Martinsson & Tropp 2011).
// The test matrix comes from a fixed-seed generator, so the result is a function of a alone.
func principal(a []float64, m, d, l int) []float64 {
	rng := uint64(0x9E3779B97F4A7C15)
	next := func() uint64 { // splitmix64
		rng += 0x9E3779B97F4A7C15
		z := rng
		z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
		z = (z ^ (z >> 27)) * 0x94D049BB133111EB
		return z ^ (z >> 31)
	}
	omega := make([]float64, l*d)
	for i := range omega {
		omega[i] = float64(int(next()>>63)*2 - 1)
	}
	mul := func(z []float64) []float64 { // y_j = A z_j (length m)
		k := len(z) / d
		y := make([]float64, k*m)
		for j := range k {
			zj := z[j*d : (j+1)*d]
			for t := range m {
				y[j*m+t] = dot(a[t*d:(t+1)*d], zj)
			}
		}
		return y
	}
	mulT := func(y []float64) []float64 { // z_j = Aᵀ y_j (length d)
		k := len(y) / m
		z := make([]float64, k*d)
		for j := range k {
			zj := z[j*d : (j+1)*d]
			for t := range m {
				if c := y[j*m+t]; c != 0 {
					axpy(zj, c, a[t*d:(t+1)*d])
				}
			}
		}
		return z
	}
	y := orthonormalize(mul(omega), m)
	z := orthonormalize(mulT(y), d)
	y = orthonormalize(mul(z), m)
	b := mulT(y) // rows of B = Yᵀ A span A's leading row space
	k := len(b) / d
	if k == 0 {
		return nil
	}
	g := make([]float64, k*k)
	for i := range k {
		for j := i; j < k; j++ {
			g[i*k+j] = dot(b[i*d:(i+1)*d], b[j*d:(j+1)*d])
			g[j*k+i] = g[i*k+j]
		}
	}
	vals, vecs := jacobiEigen(g, k)
	order := make([]int, k)
	for i := range order {
		order[i] = i
	}
	// Strongest first (insertion sort: k ≤ pcaWidth).
	for i := 1; i < k; i++ {
		for j := i; j > 0 && vals[order[j]] > vals[order[j-1]]; j-- {
			order[j], order[j-1] = order[j-1], order[j]
		}
	}
	out := make([]float64, 0, k*d)
	for _, p := range order {
		if !(vals[p] > 0) {
			continue
		}
		v := make([]float64, d)
		for i := range k {
			axpy(v, vecs[i*k+p], b[i*d:(i+1)*d])
		}
		out = append(out, v...)
	}
	return orthonormalize(out, d)
}

// jacobiEigen diagonalizes the symmetric n×n matrix a (overwritten) by cyclic Jacobi
// rotations; it returns the eigenvalues and the eigenvectors as the columns of v.
func jacobiEigen(a []float64, n int) (vals, v []float64) {
	v = make([]float64, n*n)
	for i := range n {
		v[i*n+i] = 1
	}
	for sweep := 0; sweep < 60; sweep++ {
		var off, diag float64
		for i := range n {
			diag += a[i*n+i] * a[i*n+i]
			for j := i + 1; j < n; j++ {
				off += a[i*n+j] * a[i*n+j]
			}
		}
		if off <= 1e-30*diag || off == 0 {
			break
		}
		for p := range n {
			for q := p + 1; q < n; q++ {
				apq := a[p*n+q]
				if apq == 0 {
					continue
				}
				theta := (a[q*n+q] - a[p*n+p]) / (2 * apq)
				t := math.Copysign(1, theta) / (math.Abs(theta) + math.Sqrt(theta*theta+1))
				c := 1 / math.Sqrt(t*t+1)
				s := t * c
				for r := range n {
					arp, arq := a[r*n+p], a[r*n+q]
					a[r*n+p], a[r*n+q] = c*arp-s*arq, s*arp+c*arq
				}
				for r := range n {
					apr, aqr := a[p*n+r], a[q*n+r]
					a[p*n+r], a[q*n+r] = c*apr-s*aqr, s*apr+c*aqr
				}
				for r := range n {
					vrp, vrq := v[r*n+p], v[r*n+q]
					v[r*n+p], v[r*n+q] = c*vrp-s*vrq, s*vrp+c*vrq
				}
			}
		}
	}
	vals = make([]float64, n)
	for i := range n {
		vals[i] = a[i*n+i]
	}
	return vals, v
}

// zigzag maps a signed integer to an unsigned one (0, −1, 1, −2 … → 0, 1, 2, 3 …).
func zigzag(k int32) uint32 { return uint32(k<<1) ^ uint32(k>>31) }

// appendTransform writes a mode-0 transform block (docs/COMPRESSION.md 5.2).
func appendTransform(dst []byte, parts []tPart, tb *tBasis, rowLen, first int) ([]byte, error) {
	k, shift := 0, 0
	if tb != nil {
		k, shift = tb.k, tb.shift
	}
	// The integers: coefficients component by component (values of like spread together,
	// for the entropy coder), then the direct parts' values in order.
	var nb, m int
	for _, p := range parts {
		switch p.kind {
		case partBasis:
			nb++
		case partDirect:
			m += p.hi - p.lo
		}
	}
	m += nb * k
	zz := make([]uint32, 0, m)
	if k > 0 {
		for j := range k {
			for _, p := range parts {
				if p.kind == partBasis {
					zz = append(zz, zigzag(p.ints[j]))
				}
			}
		}
	}
	for _, p := range parts {
		if p.kind == partDirect {
			for _, v := range p.ints {
				zz = append(zz, zigzag(v))
			}
		}
	}
	width := codeWidth(zz, m)
	dst = append(dst, modeLossy)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(rowLen))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(first))
	dst = binary.LittleEndian.AppendUint16(dst, uint16(k))
	dst = append(dst, byte(shift), byte(width))
	if k > 0 {
		for _, f := range tb.mean {
			dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(f))
		}
	}
	for _, p := range parts {
		dst = append(dst, p.kind)
	}
	for _, p := range parts {
		dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(p.step))
	}
	var err error
	if k > 0 {
		if dst, err = appendBasis(dst, tb.b[:k*rowLen]); err != nil {
			return nil, err
		}
	}
	if width > 0 {
		pl := make([]byte, width*m)
		planes := make([][]byte, width)
		for j := range width {
			planes[j] = pl[j*m : (j+1)*m]
			sh := 8 * j
			for i, z := range zz {
				planes[j][i] = byte(z >> sh)
			}
		}
		if dst, err = appendPlanes(dst, planes, 0); err != nil {
			return nil, err
		}
	}
	return dst, nil
}

func (c *transformCodec) Decode(dst, src []byte, dt dtype.DType, rawLen int) ([]byte, error) {
	if len(src) > 0 && (src[0] == modeShared || src[0] == modeBasis) {
		return DecodeShared(dst, src, dt, rawLen, c.shared)
	}
	out, err := decodeTransform(dst, src, dt, rawLen)
	if err != nil {
		return nil, fmt.Errorf("transform: %w", err)
	}
	return out, nil
}

func decodeTransform(dst, src []byte, dt dtype.DType, rawLen int) ([]byte, error) {
	grouped := len(src) > 0 && src[0] == modeGrouped
	if !grouped {
		if out, done, err := decodeLosslessMode(dst, src, dt, rawLen); done {
			return out, err
		}
	} else if rawLen < 0 || rawLen > MaxBlockSize {
		return nil, fmt.Errorf("block of %d bytes: %w", rawLen, ErrCorrupt)
	}
	w := dt.Size()
	if !fp8Able(dt) || rawLen%w != 0 || rawLen == 0 {
		return nil, fmt.Errorf("transform block of %s, %d bytes: %w", dt, rawLen, ErrCorrupt)
	}
	n := rawLen / w
	hl := transformHeader
	if grouped {
		hl++
	}
	if len(src) < hl {
		return nil, fmt.Errorf("short header: %w", ErrCorrupt)
	}
	rowLen := int(binary.LittleEndian.Uint32(src[1:]))
	first := int(binary.LittleEndian.Uint32(src[5:]))
	k := int(binary.LittleEndian.Uint16(src[9:]))
	shift, width := int(src[11]), int(src[12])
	if first < 1 || first > rowLen || first > n {
		return nil, fmt.Errorf("row length %d, first part %d of %d values: %w", rowLen, first, n, ErrCorrupt)
	}
	// k ≤ row_len and k·row_len ≤ n bound what the basis and the integers (at most n of
	// them) make a reader allocate by the block's raw length.
	if k > maxBasis || k > rowLen || k*rowLen > n || shift > 15 || (k == 0 && shift != 0) || width > 3 {
		return nil, fmt.Errorf("basis of %d vectors, shift %d, width %d: %w", k, shift, width, ErrCorrupt)
	}
	groups := 1 + (n-first+rowLen-1)/rowLen
	p := src[hl:]
	meanLen := 0
	if k > 0 {
		meanLen = 4 * rowLen
	}
	var grp []uint8 // mode 2: the channel group of each value of a row
	var kinds, stepsB []byte
	if grouped {
		ng := int(src[13])
		if ng < 1 || ng > maxGroups || (ng > 1 && rowLen < ng) {
			return nil, fmt.Errorf("%d channel groups for rows of %d: %w", ng, rowLen, ErrCorrupt)
		}
		mapLen := 0
		if ng > 1 {
			mapLen = (rowLen + 1) / 2
		}
		if len(p) < meanLen+mapLen {
			return nil, fmt.Errorf("%d bytes for the mean and the channel groups: %w", len(p), ErrCorrupt)
		}
		grp = make([]uint8, rowLen)
		for i := range grp {
			if ng > 1 {
				grp[i] = p[meanLen+i/2] >> (4 * (i & 1)) & 15
				if int(grp[i]) >= ng {
					return nil, fmt.Errorf("channel %d in group %d of %d: %w", i, grp[i], ng, ErrCorrupt)
				}
			}
		}
		if ng > 1 && rowLen%2 == 1 && p[meanLen+mapLen-1]>>4 != 0 {
			return nil, fmt.Errorf("channel group padding: %w", ErrCorrupt)
		}
		pl, rest, err := readPlanes(p[meanLen+mapLen:], 5, groups)
		if err != nil {
			return nil, fmt.Errorf("row parts: %w", err)
		}
		kinds = pl[:groups]
		stepsB = make([]byte, 4*groups)
		for g := range groups {
			for j := range 4 {
				stepsB[4*g+j] = pl[(1+j)*groups+g]
			}
		}
		p = rest
	} else {
		if len(p) < meanLen+5*groups {
			return nil, fmt.Errorf("%d bytes for the mean and %d row parts: %w", len(p), groups, ErrCorrupt)
		}
		kinds = p[meanLen : meanLen+groups]
		stepsB = p[meanLen+groups : meanLen+5*groups]
		p = p[meanLen+5*groups:]
	}
	mean := make([]float64, rowLen*min(k, 1))
	for i := range mean {
		f := math.Float32frombits(binary.LittleEndian.Uint32(src[hl+4*i:]))
		if math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
			return nil, fmt.Errorf("mean %d: %g: %w", i, f, ErrCorrupt)
		}
		mean[i] = float64(f)
	}
	// Part bounds and the number of integers they hold.
	var nb, m int
	steps := make([]float64, groups)
	for g := range groups {
		lo, hi := partBounds(g, first, rowLen, n)
		s := math.Float32frombits(binary.LittleEndian.Uint32(stepsB[4*g:]))
		steps[g] = float64(s)
		switch kinds[g] {
		case partBasis:
			if k == 0 || hi-lo != rowLen || !(s > 0) || math.IsInf(float64(s), 0) {
				return nil, fmt.Errorf("row part %d: basis part of %d values, k %d, step %g: %w", g, hi-lo, k, s, ErrCorrupt)
			}
			nb++
		case partDirect:
			if !(s > 0) || math.IsInf(float64(s), 0) {
				return nil, fmt.Errorf("row part %d: step %g: %w", g, s, ErrCorrupt)
			}
			m += hi - lo
		case partZero:
			if math.Float32bits(s) != 0 {
				return nil, fmt.Errorf("row part %d: zero part with step %g: %w", g, s, ErrCorrupt)
			}
		default:
			return nil, fmt.Errorf("row part %d: kind %d: %w", g, kinds[g], ErrCorrupt)
		}
	}
	m += nb * k
	var basis []float64
	if k > 0 {
		pl, rest, err := readPlanes(p, 2, k*rowLen)
		if err != nil {
			return nil, fmt.Errorf("basis: %w", err)
		}
		p = rest
		kn := k * rowLen
		basis = make([]float64, kn)
		for i := range kn {
			z := uint32(pl[i]) | uint32(pl[kn+i])<<8
			if z == 0xFFFF { // −32768: outside ±32767
				return nil, fmt.Errorf("basis value %d out of range: %w", i, ErrCorrupt)
			}
			basis[i] = float64(int32(z>>1) ^ -int32(z&1))
		}
	}
	if (m > 0) != (width > 0) {
		return nil, fmt.Errorf("%d integers of width %d: %w", m, width, ErrCorrupt)
	}
	var ints []float64
	if grouped {
		var err error
		if ints, p, err = readGroupedInts(p, kinds, grp, int(src[13]), nb*k, m, width, first, rowLen, n); err != nil {
			return nil, err
		}
	} else {
		ints = make([]float64, m)
		if m > 0 {
			pl, rest, err := readPlanes(p, width, m)
			if err != nil {
				return nil, fmt.Errorf("integers: %w", err)
			}
			p = rest
			for i := range m {
				var z uint32
				for j := range width {
					z |= uint32(pl[j*m+i]) << (8 * j)
				}
				ints[i] = float64(int32(z>>1) ^ -int32(z&1))
			}
		}
	}
	if len(p) != 0 {
		return nil, fmt.Errorf("%d trailing bytes: %w", len(p), ErrCorrupt)
	}
	start := len(dst)
	dst = grow(dst, rawLen)
	out := dst[start:]
	put := func(i int, f float32) {
		switch dt {
		case dtype.Float32:
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(f))
		case dtype.BFloat16:
			binary.LittleEndian.PutUint16(out[2*i:], dtype.Float32ToBFloat16(f))
		default:
			binary.LittleEndian.PutUint16(out[2*i:], dtype.Float32ToFloat16(f))
		}
	}
	acc := make([]float64, rowLen*min(k, 1))
	coefs := ints[:nb*k]
	direct := ints[nb*k:]
	br := 0
	for g := range groups {
		lo, hi := partBounds(g, first, rowLen, n)
		switch kinds[g] {
		case partZero:
			for i := lo; i < hi; i++ {
				put(i, 0)
			}
		case partDirect:
			q := steps[g]
			for i := lo; i < hi; i++ {
				put(i, float32(q*direct[i-lo]))
			}
			direct = direct[hi-lo:]
		case partBasis:
			clear(acc)
			for j := range k {
				if c := coefs[j*nb+br]; c != 0 {
					axpy(acc, c, basis[j*rowLen:(j+1)*rowLen])
				}
			}
			qs := math.Ldexp(steps[g], -shift)
			for i := range rowLen {
				put(lo+i, float32(mean[i]+float64(qs*acc[i]))) // no fused multiply-add
			}
			br++
		}
	}
	return dst, nil
}

// partBounds is row part g's values [lo, hi) in a block of n values whose first part holds
// first values.
func partBounds(g, first, rowLen, n int) (lo, hi int) {
	if g == 0 {
		return 0, first
	}
	lo = first + (g-1)*rowLen
	return lo, min(n, lo+rowLen)
}

// codeWidth is the byte width of the zigzag codes zz (1 to 4; 0 when the block has no value
// to code, m = 0): the number of planes the codes take. Modes 0 and 2 write it alike.
func codeWidth(zz []uint32, m int) int {
	if m == 0 {
		return 0
	}
	var maxZZ uint32
	for _, z := range zz {
		maxZZ = max(maxZZ, z)
	}
	width := 1
	for maxZZ>>(8*width) != 0 {
		width++
	}
	return width
}

// appendBasis appends the basis entries (int16, zigzag) as two plane frames, low bytes then
// high bytes (|b| ≤ 32767). Modes 0 and 2 store it alike.
func appendBasis(dst []byte, b []int32) ([]byte, error) {
	n := len(b)
	pl := make([]byte, 2*n)
	for i, v := range b {
		z := zigzag(v)
		pl[i], pl[n+i] = byte(z), byte(z>>8)
	}
	return appendPlanes(dst, [][]byte{pl[:n], pl[n:]}, 0)
}
