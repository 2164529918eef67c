package codec

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"

	"github.com/strap-llm/strap/internal/dtype"
)

// The lossy codecs (opt-in; docs/COMPRESSION.md section 3). Each block's stored form starts
// with a mode byte: 0 lossy, 1 lossless (a shuffle payload of the original bytes: the
// flagged fallback for data the codec cannot carry within its bound). The encoder decodes
// what it wrote, value by value, with the decoder's own arithmetic, so the error it reports
// is the error a reader will see.

const (
	modeLossy    = 0
	modeLossless = 1
	// maxExceptionShare: above n/8 exact exceptions a block is cheaper stored losslessly.
	maxExceptionShare = 8
	// quantLimit keeps |k| well inside int32 so zigzag fits 32 bits.
	quantLimit = 1 << 30
)

func init() {
	Register("quant", Quant, newQuant)
	Register("fp16", FP16, newFP16)
}

func checkLevel(name string, l int) error {
	if l < 0 || l > 4 {
		return fmt.Errorf("%s level %d (0–4): %w", name, l, ErrBadLevel)
	}
	return nil
}

// newQuant builds the quant codec. A nil bound gives a decode-only instance (ByID).
func newQuant(o Options) (Codec, error) {
	if err := checkLevel("quant", o.Level); err != nil {
		return nil, err
	}
	c := &quantCodec{level: o.Level}
	if o.Lossy != nil {
		b := *o.Lossy
		if (b.Mode != "abs" && b.Mode != "rel") || !(b.Value > 0) || math.IsInf(b.Value, 0) {
			return nil, fmt.Errorf("quant bound %s %g (want abs|rel > 0): %w", b.Mode, b.Value, ErrBadBound)
		}
		c.bound = &b
	}
	return c, nil
}

type quantCodec struct {
	bound *LossyBound
	level int
	// rms is the tensor's RMS over finite values, set by ForTensor (rel mode); 0: per block.
	rms float64
}

// Bound implements LossyCodec (zero for a decode-only instance).
func (c *quantCodec) Bound() LossyBound {
	if c.bound == nil {
		return LossyBound{}
	}
	return *c.bound
}

func (*quantCodec) ID() ID       { return Quant }
func (*quantCodec) Name() string { return "quant" }

// ForTensor implements TensorPreparer: a rel bound is relative to the whole tensor's RMS.
func (c *quantCodec) ForTensor(tensor []byte, dt dtype.DType) (Codec, error) {
	if c.bound == nil || c.bound.Mode != "rel" || !quantizable(dt) {
		return c, nil
	}
	n, ss := sumSquares(tensor[:len(tensor)/dt.Size()*dt.Size()], dt)
	cc := *c
	if n > 0 {
		cc.rms = math.Sqrt(ss / float64(n))
	}
	return &cc, nil
}

func (c *quantCodec) Encode(dst, src []byte, dt dtype.DType) ([]byte, bool, error) {
	out, ok, _, err := c.EncodeStats(dst, src, dt)
	return out, ok, err
}

// quantTry is one quantization attempt at step q.
type quantTry struct {
	zz       []uint32
	exc      []uint32
	maxZZ    uint32
	sse, max float64
}

func (c *quantCodec) EncodeStats(dst, src []byte, dt dtype.DType) ([]byte, bool, BlockStats, error) {
	if c.bound == nil {
		return nil, false, BlockStats{}, fmt.Errorf("quant: encoding needs a bound: %w", ErrBadBound)
	}
	w := dt.Size()
	if !quantizable(dt) || len(src)%w != 0 {
		return encodeLossless(dst, src, dt, c.level)
	}
	n := len(src) / w
	nf, ss := sumSquares(src, dt)
	st := BlockStats{Values: n, SumSq: ss}
	var q0, budget float64
	if c.bound.Mode == "abs" {
		q0 = 2 * c.bound.Value * 0.995
	} else {
		r := c.rms
		if r == 0 && nf > 0 {
			r = math.Sqrt(ss / float64(nf))
		}
		if r == 0 || math.IsInf(r, 0) {
			return encodeLossless(dst, src, dt, c.level)
		}
		budget = c.bound.Value * c.bound.Value * r * r * float64(nf)
		// Uniform rounding error has variance q²/12; aim 2% under the bound so that
		// few blocks need a second try.
		q0 = math.Sqrt(12) * c.bound.Value * r * 0.98
	}
	t := quantTry{zz: make([]uint32, n)}
	for try, q := 0, q0; try < 4; try, q = try+1, q*0.7 {
		if !(q > 0) || math.IsInf(q, 0) {
			break
		}
		c.quantize(&t, src, dt, q)
		if len(t.exc) > n/maxExceptionShare {
			break // smaller steps will not remove exceptions (range, non-finite, dtype rounding)
		}
		if c.bound.Mode == "rel" && t.sse > budget {
			continue
		}
		st.MaxAbs, st.SumSqErr = t.max, t.sse
		out := appendQuant(dst, src, dt, q, &t, c.level)
		if out == nil || len(out)-len(dst) >= len(src) {
			return dst, false, BlockStats{Values: n, SumSq: ss, Lossless: true}, nil
		}
		return out, true, st, nil
	}
	return encodeLossless(dst, src, dt, c.level)
}

func (c *quantCodec) quantize(t *quantTry, src []byte, dt dtype.DType, q float64) {
	inv := 1 / q
	abs := c.bound.Mode == "abs"
	t.exc, t.maxZZ, t.sse, t.max = t.exc[:0], 0, 0, 0
	switch dt {
	case dtype.Float32:
		quantizeF32(t, src, q, abs, c.bound.Value)
		return
	case dtype.Float16, dtype.BFloat16:
		quantize16(t, src, q, abs, c.bound.Value, dt == dtype.BFloat16)
		return
	}
	for i := range t.zz {
		x := loadFloat(src, dt, i)
		r := math.Floor(x*inv + 0.5)
		if !(math.Abs(r) < quantLimit) { // also catches NaN and ±inf
			t.zz[i] = 0
			t.exc = append(t.exc, uint32(i))
			continue
		}
		k := int32(r)
		e := math.Abs(x - dequant(k, q, dt))
		if abs && !(e <= c.bound.Value) {
			t.zz[i] = 0
			t.exc = append(t.exc, uint32(i))
			continue
		}
		z := uint32(k<<1) ^ uint32(k>>31)
		t.zz[i] = z
		t.maxZZ = max(t.maxZZ, z)
		t.sse += e * e
		t.max = max(t.max, e)
	}
}

// quantizeF32 is quantize for float32, the common case, without per-element dtype switches.
func quantizeF32(t *quantTry, src []byte, q float64, abs bool, bound float64) {
	inv := 1 / q
	zz := t.zz
	src = src[:4*len(zz)]
	var sse, mx float64
	var maxZZ uint32
	for i := range zz {
		x := float64(math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:])))
		r := math.Floor(x*inv + 0.5)
		if !(math.Abs(r) < quantLimit) {
			zz[i] = 0
			t.exc = append(t.exc, uint32(i))
			continue
		}
		k := int32(r)
		e := math.Abs(x - float64(float32(float64(k)*q)))
		if abs && !(e <= bound) {
			zz[i] = 0
			t.exc = append(t.exc, uint32(i))
			continue
		}
		z := uint32(k<<1) ^ uint32(k>>31)
		zz[i] = z
		maxZZ = max(maxZZ, z)
		sse += e * e
		mx = max(mx, e)
	}
	t.sse, t.max, t.maxZZ = sse, mx, maxZZ
}

// quantize16 is quantize for float16 and bfloat16.
func quantize16(t *quantTry, src []byte, q float64, abs bool, bound float64, bf bool) {
	inv := 1 / q
	zz := t.zz
	src = src[:2*len(zz)]
	var sse, mx float64
	var maxZZ uint32
	for i := range zz {
		h := binary.LittleEndian.Uint16(src[2*i:])
		var x float64
		if bf {
			x = float64(dtype.BFloat16ToFloat32(h))
		} else {
			x = float64(f16Table[h])
		}
		r := math.Floor(x*inv + 0.5)
		if !(math.Abs(r) < quantLimit) {
			zz[i] = 0
			t.exc = append(t.exc, uint32(i))
			continue
		}
		k := int32(r)
		f := float32(float64(k) * q)
		var y float64
		if bf {
			y = float64(dtype.BFloat16ToFloat32(dtype.Float32ToBFloat16(f)))
		} else {
			y = float64(f16Table[dtype.Float32ToFloat16(f)])
		}
		e := math.Abs(x - y)
		if abs && !(e <= bound) {
			zz[i] = 0
			t.exc = append(t.exc, uint32(i))
			continue
		}
		z := uint32(k<<1) ^ uint32(k>>31)
		zz[i] = z
		maxZZ = max(maxZZ, z)
		sse += e * e
		mx = max(mx, e)
	}
	t.sse, t.max, t.maxZZ = sse, mx, maxZZ
}

// dequant is the decoded value of quantized integer k at step q in dtype dt, exactly as
// both decoders compute it: float64 product, then rounding to the element type (through
// float32 for float16 and bfloat16).
func dequant(k int32, q float64, dt dtype.DType) float64 {
	v := float64(k) * q
	switch dt {
	case dtype.Float32:
		return float64(float32(v))
	case dtype.Float16:
		return float64(dtype.Float16ToFloat32(dtype.Float32ToFloat16(float32(v))))
	case dtype.BFloat16:
		return float64(dtype.BFloat16ToFloat32(dtype.Float32ToBFloat16(float32(v))))
	}
	return v
}

func storeFloat(dst []byte, dt dtype.DType, i int, v float64) {
	switch dt {
	case dtype.Float32:
		binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(float32(v)))
	case dtype.Float64:
		binary.LittleEndian.PutUint64(dst[8*i:], math.Float64bits(v))
	case dtype.Float16:
		binary.LittleEndian.PutUint16(dst[2*i:], dtype.Float32ToFloat16(float32(v)))
	case dtype.BFloat16:
		binary.LittleEndian.PutUint16(dst[2*i:], dtype.Float32ToBFloat16(float32(v)))
	}
}

// appendQuant writes a mode-0 quant block; nil on an internal encoder failure.
func appendQuant(dst, src []byte, dt dtype.DType, q float64, t *quantTry, level int) []byte {
	w := dt.Size()
	b := max(1, (32-bits.LeadingZeros32(t.maxZZ)+7)/8)
	dst = append(dst, modeLossy)
	dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(q))
	dst = append(dst, byte(b))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(t.exc)))
	for _, i := range t.exc {
		dst = binary.LittleEndian.AppendUint32(dst, i)
	}
	for _, i := range t.exc {
		dst = append(dst, src[int(i)*w:int(i+1)*w]...)
	}
	n := len(t.zz)
	buf := make([]byte, b*n)
	for i, z := range t.zz {
		for j := range b {
			buf[j*n+i] = byte(z >> (8 * j))
		}
	}
	planes := make([][]byte, b)
	for j := range b {
		planes[j] = buf[j*n : (j+1)*n]
	}
	out, err := appendPlanes(dst, planes, level)
	if err != nil {
		return nil
	}
	return out
}

// encodeLossless writes a mode-1 block: the flagged lossless fallback.
func encodeLossless(dst, src []byte, dt dtype.DType, level int) ([]byte, bool, BlockStats, error) {
	st := BlockStats{Lossless: true}
	if w := dt.Size(); w > 0 {
		st.Values = len(src) / w
		if quantizable(dt) {
			_, st.SumSq = sumSquares(src[:len(src)/w*w], dt)
		}
	}
	out, err := appendShuffled(append(dst, modeLossless), src, dt, level)
	if err != nil {
		return nil, false, st, err
	}
	if len(out)-len(dst) >= len(src) {
		return dst, false, st, nil
	}
	return out, true, st, nil
}

func (c *quantCodec) Decode(dst, src []byte, dt dtype.DType, rawLen int) ([]byte, error) {
	out, err := decodeQuant(dst, src, dt, rawLen)
	if err != nil {
		return nil, fmt.Errorf("quant: %w", err)
	}
	return out, nil
}

// decodeLosslessMode reads the mode byte that starts every quant and fp16 block. A block
// stored losslessly (mode 0: it could not meet its bound, or held values the lossy form
// cannot carry) is decoded here and done is true, as it is for a bad block; for mode 1 the
// caller decodes the lossy body at src[1:].
func decodeLosslessMode(dst, src []byte, dt dtype.DType, rawLen int) (out []byte, done bool, err error) {
	if rawLen < 0 || rawLen > MaxBlockSize {
		return nil, true, fmt.Errorf("block of %d bytes: %w", rawLen, ErrCorrupt)
	}
	if len(src) < 1 {
		return nil, true, fmt.Errorf("empty block: %w", ErrCorrupt)
	}
	switch src[0] {
	case modeLossless:
		out, err = decodeShuffled(dst, src[1:], dt, rawLen)
		return out, true, err
	case modeLossy:
		return nil, false, nil
	default:
		return nil, true, fmt.Errorf("mode %d: %w", src[0], ErrCorrupt)
	}
}

func decodeQuant(dst, src []byte, dt dtype.DType, rawLen int) ([]byte, error) {
	if out, done, err := decodeLosslessMode(dst, src, dt, rawLen); done {
		return out, err
	}
	w := dt.Size()
	if !quantizable(dt) || rawLen < 0 || rawLen%w != 0 {
		return nil, fmt.Errorf("lossy block of %s, %d bytes: %w", dt, rawLen, ErrCorrupt)
	}
	n := rawLen / w
	const hdr = 1 + 8 + 1 + 4
	if len(src) < hdr {
		return nil, fmt.Errorf("short header: %w", ErrCorrupt)
	}
	q := math.Float64frombits(binary.LittleEndian.Uint64(src[1:]))
	b := int(src[9])
	nexc := int(binary.LittleEndian.Uint32(src[10:]))
	if !(q > 0) || math.IsInf(q, 0) || b < 1 || b > 4 || nexc > n {
		return nil, fmt.Errorf("step %g, width %d, %d exceptions: %w", q, b, nexc, ErrCorrupt)
	}
	p := src[hdr:]
	if len(p) < nexc*(4+w) {
		return nil, fmt.Errorf("exceptions overrun block: %w", ErrCorrupt)
	}
	idx, vals := p[:4*nexc], p[4*nexc:nexc*(4+w)]
	planes, rest, err := readPlanes(p[nexc*(4+w):], b, n)
	if err != nil {
		return nil, err
	}
	if len(rest) != 0 {
		return nil, fmt.Errorf("%d trailing bytes: %w", len(rest), ErrCorrupt)
	}
	start := len(dst)
	dst = grow(dst, rawLen)
	out := dst[start:]
	if dt == dtype.Float32 && b <= 2 {
		p0, p1 := planes[:n], planes[:n]
		if b == 2 {
			p1 = planes[n : 2*n]
		}
		out := out[:4*n]
		for i := range n {
			z := uint32(p0[i])
			if b == 2 {
				z |= uint32(p1[i]) << 8
			}
			k := int32(z>>1) ^ -int32(z&1)
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(float32(float64(k)*q)))
		}
	} else if dt == dtype.Float16 || dt == dtype.BFloat16 {
		bf := dt == dtype.BFloat16
		for i := range n {
			var z uint32
			for j := range b {
				z |= uint32(planes[j*n+i]) << (8 * j)
			}
			k := int32(z>>1) ^ -int32(z&1)
			f := float32(float64(k) * q)
			if bf {
				binary.LittleEndian.PutUint16(out[2*i:], dtype.Float32ToBFloat16(f))
			} else {
				binary.LittleEndian.PutUint16(out[2*i:], dtype.Float32ToFloat16(f))
			}
		}
	} else {
		for i := range n {
			var z uint32
			for j := range b {
				z |= uint32(planes[j*n+i]) << (8 * j)
			}
			k := int32(z>>1) ^ -int32(z&1)
			storeFloat(out, dt, i, dequant(k, q, dt))
		}
	}
	prev := -1
	for e := range nexc {
		i := int(binary.LittleEndian.Uint32(idx[4*e:]))
		if i <= prev || i >= n {
			return nil, fmt.Errorf("exception index %d: %w", i, ErrCorrupt)
		}
		prev = i
		copy(out[i*w:(i+1)*w], vals[e*w:(e+1)*w])
	}
	return dst, nil
}

// --- fp16 --------------------------------------------------------------------------------

// newFP16 builds the fp16 codec. Its bound is fp16 rounding; Lossy{Mode:"fp16", Value:v}
// with v > 0 additionally stores losslessly any block whose relative L2 error exceeds v.
func newFP16(o Options) (Codec, error) {
	if err := checkLevel("fp16", o.Level); err != nil {
		return nil, err
	}
	c := &fp16Codec{level: o.Level}
	if o.Lossy != nil {
		if o.Lossy.Mode != "fp16" || o.Lossy.Value < 0 || math.IsInf(o.Lossy.Value, 0) || math.IsNaN(o.Lossy.Value) {
			return nil, fmt.Errorf("fp16 bound %s %g: %w", o.Lossy.Mode, o.Lossy.Value, ErrBadBound)
		}
		c.relL2 = o.Lossy.Value
	}
	return c, nil
}

type fp16Codec struct {
	level int
	relL2 float64
}

// Bound implements LossyCodec.
func (c *fp16Codec) Bound() LossyBound { return LossyBound{Mode: "fp16", Value: c.relL2} }

func (*fp16Codec) ID() ID       { return FP16 }
func (*fp16Codec) Name() string { return "fp16" }

func (c *fp16Codec) Encode(dst, src []byte, dt dtype.DType) ([]byte, bool, error) {
	out, ok, _, err := c.EncodeStats(dst, src, dt)
	return out, ok, err
}

func (c *fp16Codec) EncodeStats(dst, src []byte, dt dtype.DType) ([]byte, bool, BlockStats, error) {
	w := dt.Size()
	if (dt != dtype.Float32 && dt != dtype.Float64) || len(src)%w != 0 {
		return encodeLossless(dst, src, dt, c.level)
	}
	n := len(src) / w
	half := make([]byte, 2*n)
	st := BlockStats{Values: n}
	var ok bool
	if dt == dtype.Float32 {
		ok = downcastF32(half, src, &st)
	} else {
		ok = downcastF64(half, src, &st)
	}
	if !ok {
		// NaN (kept exact) or a finite value beyond fp16's range (never inf): lossless.
		return encodeLossless(dst, src, dt, c.level)
	}
	if c.relL2 > 0 && st.SumSqErr > c.relL2*c.relL2*st.SumSq {
		return encodeLossless(dst, src, dt, c.level)
	}
	out, err := appendShuffled(append(dst, modeLossy), half, dtype.Float16, c.level)
	if err != nil {
		return nil, false, st, fmt.Errorf("fp16: %w", err)
	}
	if len(out)-len(dst) >= len(src) {
		return dst, false, BlockStats{Values: n, SumSq: st.SumSq, Lossless: true}, nil
	}
	return out, true, st, nil
}

// downcastF32 writes the fp16 of each float32 of src into half and accumulates the error;
// false when the block has a NaN or a finite value that fp16 cannot hold.
func downcastF32(half, src []byte, st *BlockStats) bool {
	n := len(half) / 2
	src = src[:4*n]
	var ss, sse, mx float64
	for i := range n {
		u := binary.LittleEndian.Uint32(src[4*i:])
		if u&0x7f800000 == 0x7f800000 {
			if u&0x7fffff != 0 {
				return false
			}
			binary.LittleEndian.PutUint16(half[2*i:], uint16(u>>16)&0x8000|0x7c00)
			continue
		}
		f := math.Float32frombits(u)
		h := dtype.Float32ToFloat16(f)
		if h&0x7c00 == 0x7c00 {
			return false
		}
		binary.LittleEndian.PutUint16(half[2*i:], h)
		x := float64(f)
		e := x - float64(f16Table[h])
		ss += x * x
		sse += e * e
		mx = max(mx, math.Abs(e))
	}
	st.SumSq, st.SumSqErr, st.MaxAbs = ss, sse, mx
	return true
}

func downcastF64(half, src []byte, st *BlockStats) bool {
	for i := range len(half) / 2 {
		x := loadFloat(src, dtype.Float64, i)
		if math.IsNaN(x) {
			return false
		}
		h := dtype.Float32ToFloat16(float32(x))
		y := float64(f16Table[h])
		if math.IsInf(y, 0) && !math.IsInf(x, 0) {
			return false
		}
		binary.LittleEndian.PutUint16(half[2*i:], h)
		if !math.IsInf(x, 0) {
			e := math.Abs(x - y)
			st.SumSq += x * x
			st.SumSqErr += e * e
			st.MaxAbs = max(st.MaxAbs, e)
		}
	}
	return true
}

func (c *fp16Codec) Decode(dst, src []byte, dt dtype.DType, rawLen int) ([]byte, error) {
	out, err := decodeFP16(dst, src, dt, rawLen)
	if err != nil {
		return nil, fmt.Errorf("fp16: %w", err)
	}
	return out, nil
}

func decodeFP16(dst, src []byte, dt dtype.DType, rawLen int) ([]byte, error) {
	if out, done, err := decodeLosslessMode(dst, src, dt, rawLen); done {
		return out, err
	}
	w := dt.Size()
	if (dt != dtype.Float32 && dt != dtype.Float64) || rawLen < 0 || rawLen%w != 0 {
		return nil, fmt.Errorf("fp16 block of %s, %d bytes: %w", dt, rawLen, ErrCorrupt)
	}
	n := rawLen / w
	half, err := decodeShuffled(nil, src[1:], dtype.Float16, 2*n)
	if err != nil {
		return nil, err
	}
	start := len(dst)
	dst = grow(dst, rawLen)
	out := dst[start:]
	for i := range n {
		f := f16Table[binary.LittleEndian.Uint16(half[2*i:])]
		if dt == dtype.Float32 {
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(f))
		} else {
			binary.LittleEndian.PutUint64(out[8*i:], math.Float64bits(float64(f)))
		}
	}
	return dst, nil
}
