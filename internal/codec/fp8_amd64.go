//go:build !purego

package codec

import (
	"math"

	"golang.org/x/sys/cpu"

	"github.com/strap-llm/strap/internal/dtype"
)

// hasF16C selects the float16 vector loop (F16C converts float16 ↔ float32).
var hasF16C = cpu.X86.HasF16C

// fp8Wide selects the 8-wide loops (float32 lanes, FMA for the sums) over the 4-wide ones;
// both store the same bytes and sums. A variable so tests can compare them.
var fp8Wide = cpu.X86.HasFMA

// The loops take acc[0:16] as the sums to continue (Σx², Σe², Σy² and max |e| in four
// float64 lanes each) and leave them there; acc[16:24] is the 8-wide loops' scratch.

//go:noescape
func fp8F32AVX2(src, codes *byte, n int, inv float64, s float32, acc *[24]float64)

//go:noescape
func fp8BF16AVX2(src, codes *byte, n int, inv float64, s float32, acc *[24]float64)

//go:noescape
func fp8F16AVX2(src, codes *byte, n int, inv float64, s float32, acc *[24]float64)

//go:noescape
func fp8F32x8AVX2(src, codes *byte, n int, inv float64, s float32, acc *[24]float64)

//go:noescape
func fp8BF16x8AVX2(src, codes *byte, n int, inv float64, s float32, acc *[24]float64)

//go:noescape
func fp8F16x8AVX2(src, codes *byte, n int, inv float64, s float32, acc *[24]float64)

// fp8Vec codes the leading multiple of 4 values of src (of type dt: float32, bfloat16, or
// float16 with F16C) with AVX2, as the scalar loops would, and returns how many it did and
// their sums.
func fp8Vec(src, codes []byte, s float32, inv float64, dt dtype.DType) (done int, ss, sse, ssd float64, mb uint64) {
	n := len(codes) &^ 3
	if !hasAVX2 || n == 0 || dt == dtype.Float16 && !hasF16C {
		return 0, 0, 0, 0, 0
	}
	var acc [24]float64
	w := dt.Size()
	_ = src[w*n-1]
	wide := 0
	if fp8Wide {
		// 8 values a turn, then at most one 4-wide turn continuing the same sums.
		if wide = n &^ 7; wide > 0 {
			switch dt {
			case dtype.BFloat16:
				fp8BF16x8AVX2(&src[0], &codes[0], wide, inv, s, &acc)
			case dtype.Float16:
				fp8F16x8AVX2(&src[0], &codes[0], wide, inv, s, &acc)
			default:
				fp8F32x8AVX2(&src[0], &codes[0], wide, inv, s, &acc)
			}
		}
	}
	if wide < n {
		switch dt {
		case dtype.BFloat16:
			fp8BF16AVX2(&src[w*wide], &codes[wide], n-wide, inv, s, &acc)
		case dtype.Float16:
			fp8F16AVX2(&src[w*wide], &codes[wide], n-wide, inv, s, &acc)
		default:
			fp8F32AVX2(&src[w*wide], &codes[wide], n-wide, inv, s, &acc)
		}
	}
	ss = acc[0] + acc[1] + acc[2] + acc[3]
	sse = acc[4] + acc[5] + acc[6] + acc[7]
	ssd = acc[8] + acc[9] + acc[10] + acc[11]
	for _, m := range acc[12:16] {
		mb = max(mb, math.Float64bits(m))
	}
	return n, ss, sse, ssd, mb
}

//go:noescape
func fp8Max32AVX2(src *byte, n int, out *[8]uint32)

//go:noescape
func fp8Max16AVX2(src *byte, n int, out *[16]uint16)

// fp8AbsMax32 is the largest bit pattern of |x| over the leading multiple of 8 of the
// 4-byte values of src, and how many it covered.
func fp8AbsMax32(src []byte) (done int, m uint32) {
	n := len(src) / 4 &^ 7
	if !hasAVX2 || n == 0 {
		return 0, 0
	}
	var out [8]uint32
	fp8Max32AVX2(&src[0], n, &out)
	for _, v := range out {
		m = max(m, v)
	}
	return n, m
}

// fp8AbsMax16 is fp8AbsMax32 for 2-byte values, 16 at a time.
func fp8AbsMax16(src []byte) (done int, m uint16) {
	n := len(src) / 2 &^ 15
	if !hasAVX2 || n == 0 {
		return 0, 0
	}
	var out [16]uint16
	fp8Max16AVX2(&src[0], n, &out)
	for _, v := range out {
		m = max(m, v)
	}
	return n, m
}
