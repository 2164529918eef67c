//go:build !purego

#include "textflag.h"

// The fp8 coding loop (fp8.go: e4m3Fast, fp8CodeF32, fp8Code16) four values at a time in
// float64 lanes, with the same arithmetic: r = x·inv; |r| rounded to 3 mantissa bits by
// integer add on its bits (normal range) or as m·2⁻⁹ (below 2⁻⁶), min 448; code from the
// rounded bits; decoded value float32(±q) × s (bfloat16: rounded to nearest even).

DATA fp8abs<>+0(SB)/8, $0x7fffffffffffffff
DATA fp8abs<>+8(SB)/8, $0x7fffffffffffffff
DATA fp8abs<>+16(SB)/8, $0x7fffffffffffffff
DATA fp8abs<>+24(SB)/8, $0x7fffffffffffffff
GLOBL fp8abs<>(SB), RODATA|NOPTR, $32

DATA fp8sign<>+0(SB)/8, $0x8000000000000000
DATA fp8sign<>+8(SB)/8, $0x8000000000000000
DATA fp8sign<>+16(SB)/8, $0x8000000000000000
DATA fp8sign<>+24(SB)/8, $0x8000000000000000
GLOBL fp8sign<>(SB), RODATA|NOPTR, $32

DATA fp8one<>+0(SB)/8, $1
DATA fp8one<>+8(SB)/8, $1
DATA fp8one<>+16(SB)/8, $1
DATA fp8one<>+24(SB)/8, $1
GLOBL fp8one<>(SB), RODATA|NOPTR, $32

// 1<<48 - 1: with the kept bit's parity, round half to even at bit 49.
DATA fp8half<>+0(SB)/8, $0x0000ffffffffffff
DATA fp8half<>+8(SB)/8, $0x0000ffffffffffff
DATA fp8half<>+16(SB)/8, $0x0000ffffffffffff
DATA fp8half<>+24(SB)/8, $0x0000ffffffffffff
GLOBL fp8half<>(SB), RODATA|NOPTR, $32

DATA fp8keep<>+0(SB)/8, $0xfffe000000000000
DATA fp8keep<>+8(SB)/8, $0xfffe000000000000
DATA fp8keep<>+16(SB)/8, $0xfffe000000000000
DATA fp8keep<>+24(SB)/8, $0xfffe000000000000
GLOBL fp8keep<>(SB), RODATA|NOPTR, $32

DATA fp8k512<>+0(SB)/8, $0x4080000000000000
DATA fp8k512<>+8(SB)/8, $0x4080000000000000
DATA fp8k512<>+16(SB)/8, $0x4080000000000000
DATA fp8k512<>+24(SB)/8, $0x4080000000000000
GLOBL fp8k512<>(SB), RODATA|NOPTR, $32

DATA fp8inv512<>+0(SB)/8, $0x3f60000000000000
DATA fp8inv512<>+8(SB)/8, $0x3f60000000000000
DATA fp8inv512<>+16(SB)/8, $0x3f60000000000000
DATA fp8inv512<>+24(SB)/8, $0x3f60000000000000
GLOBL fp8inv512<>(SB), RODATA|NOPTR, $32

DATA fp8two52<>+0(SB)/8, $0x4330000000000000
DATA fp8two52<>+8(SB)/8, $0x4330000000000000
DATA fp8two52<>+16(SB)/8, $0x4330000000000000
DATA fp8two52<>+24(SB)/8, $0x4330000000000000
GLOBL fp8two52<>(SB), RODATA|NOPTR, $32

// 2⁻⁶, the smallest normal e4m3 value.
DATA fp8minnorm<>+0(SB)/8, $0x3f90000000000000
DATA fp8minnorm<>+8(SB)/8, $0x3f90000000000000
DATA fp8minnorm<>+16(SB)/8, $0x3f90000000000000
DATA fp8minnorm<>+24(SB)/8, $0x3f90000000000000
GLOBL fp8minnorm<>(SB), RODATA|NOPTR, $32

DATA fp8max<>+0(SB)/8, $0x407c000000000000
DATA fp8max<>+8(SB)/8, $0x407c000000000000
DATA fp8max<>+16(SB)/8, $0x407c000000000000
DATA fp8max<>+24(SB)/8, $0x407c000000000000
GLOBL fp8max<>(SB), RODATA|NOPTR, $32

// Exponent bias 1023 → 7.
DATA fp8rebias<>+0(SB)/8, $0x3f80000000000000
DATA fp8rebias<>+8(SB)/8, $0x3f80000000000000
DATA fp8rebias<>+16(SB)/8, $0x3f80000000000000
DATA fp8rebias<>+24(SB)/8, $0x3f80000000000000
GLOBL fp8rebias<>(SB), RODATA|NOPTR, $32

// Dwords 0, 2, 4, 6: the low halves of the four qword codes.
DATA fp8perm<>+0(SB)/8, $0x0000000200000000
DATA fp8perm<>+8(SB)/8, $0x0000000600000004
DATA fp8perm<>+16(SB)/8, $0x0000000000000000
DATA fp8perm<>+24(SB)/8, $0x0000000000000000
GLOBL fp8perm<>(SB), RODATA|NOPTR, $32

DATA fp8bfr<>+0(SB)/8, $0x00007fff00007fff
DATA fp8bfr<>+8(SB)/8, $0x00007fff00007fff
GLOBL fp8bfr<>(SB), RODATA|NOPTR, $16

DATA fp8one32<>+0(SB)/8, $0x0000000100000001
DATA fp8one32<>+8(SB)/8, $0x0000000100000001
GLOBL fp8one32<>(SB), RODATA|NOPTR, $16

DATA fp8hi16<>+0(SB)/8, $0xffff0000ffff0000
DATA fp8hi16<>+8(SB)/8, $0xffff0000ffff0000
GLOBL fp8hi16<>(SB), RODATA|NOPTR, $16

// CODE4 codes the four float64 values in Y0 (x) into 4 bytes at (DI) and leaves the
// decoded float32 values in X4. Uses Y1–Y5; Y15 = inv, Y6 = |·| mask, Y7 = 2⁵², Y12 = 512,
// Y13 = 2⁻⁶ (loaded by FP8CONSTS).
#define CODE4 \
	VMULPD     Y15, Y0, Y1 \
	VANDPD     Y6, Y1, Y2 \
	VPSRLQ     $49, Y2, Y3 \
	VPAND      fp8one<>(SB), Y3, Y3 \
	VPADDQ     fp8half<>(SB), Y2, Y4 \
	VPADDQ     Y3, Y4, Y4 \
	VPAND      fp8keep<>(SB), Y4, Y4 \
	VMULPD     Y12, Y2, Y3 \
	VADDPD     Y7, Y3, Y3 \
	VSUBPD     Y7, Y3, Y3 \
	VMULPD     fp8inv512<>(SB), Y3, Y3 \
	VPCMPGTQ   Y2, Y13, Y5 \
	VBLENDVPD  Y5, Y3, Y4, Y4 \
	VMINPD     fp8max<>(SB), Y4, Y4 \
	VPSUBQ     fp8rebias<>(SB), Y4, Y3 \
	VPSRLQ     $49, Y3, Y3 \
	VMULPD     Y12, Y4, Y2 \
	VADDPD     Y7, Y2, Y2 \
	VPSUBQ     Y7, Y2, Y2 \
	VBLENDVPD  Y5, Y2, Y3, Y3 \
	VANDPD     fp8sign<>(SB), Y1, Y1 \
	VPSRLQ     $56, Y1, Y2 \
	VPOR       Y2, Y3, Y3 \
	VMOVDQU    fp8perm<>(SB), Y2 \
	VPERMD     Y3, Y2, Y2 \
	VPACKUSDW  X2, X2, X2 \
	VPACKUSWB  X2, X2, X2 \
	VMOVD      X2, (DI) \
	VORPD      Y1, Y4, Y4 \
	VCVTPD2PSY Y4, X4 \
	VMULPS     X14, X4, X4

// FP8LOADACC starts the sums from acc[0:16] (zeros, or where the 8-wide loop left them:
// the sums stay one float64 chain per lane, element i in lane i mod 4, in element order).
#define FP8LOADACC \
	VMOVUPD 0(R8), Y8 \
	VMOVUPD 32(R8), Y9 \
	VMOVUPD 64(R8), Y10 \
	VMOVUPD 96(R8), Y11

// FP8CONSTS loads the constants CODE4 keeps in registers.
#define FP8CONSTS \
	VMOVDQU fp8abs<>(SB), Y6 \
	VMOVDQU fp8two52<>(SB), Y7 \
	VMOVDQU fp8k512<>(SB), Y12 \
	VMOVDQU fp8minnorm<>(SB), Y13

// STATS4 adds x (Y0) and the decoded values (X4, float32) to the sums: Y8 Σx², Y9 Σe²,
// Y10 Σy², Y11 max |e|.
#define STATS4 \
	VCVTPS2PD X4, Y4 \
	VSUBPD    Y4, Y0, Y2 \
	VMULPD    Y0, Y0, Y3 \
	VADDPD    Y3, Y8, Y8 \
	VMULPD    Y2, Y2, Y3 \
	VADDPD    Y3, Y9, Y9 \
	VMULPD    Y4, Y4, Y3 \
	VADDPD    Y3, Y10, Y10 \
	VANDPD    Y6, Y2, Y2 \
	VMAXPD    Y2, Y11, Y11

// func fp8F32AVX2(src, codes *byte, n int, inv float64, s float32, acc *[24]float64)
// n: a multiple of 4, > 0.
TEXT ·fp8F32AVX2(SB), NOSPLIT, $0-48
	MOVQ         src+0(FP), SI
	MOVQ         codes+8(FP), DI
	MOVQ         n+16(FP), CX
	VBROADCASTSD inv+24(FP), Y15
	VBROADCASTSS s+32(FP), X14
	MOVQ         acc+40(FP), R8
	FP8LOADACC
	FP8CONSTS

f32loop:
	VCVTPS2PD (SI), Y0
	CODE4
	STATS4
	ADDQ      $16, SI
	ADDQ      $4, DI
	SUBQ      $4, CX
	JNZ       f32loop

	VMOVUPD Y8, 0(R8)
	VMOVUPD Y9, 32(R8)
	VMOVUPD Y10, 64(R8)
	VMOVUPD Y11, 96(R8)
	VZEROUPPER
	RET

// func fp8BF16AVX2(src, codes *byte, n int, inv float64, s float32, acc *[24]float64)
// As fp8F32AVX2 for bfloat16 values; the decoded value is rounded to bfloat16.
TEXT ·fp8BF16AVX2(SB), NOSPLIT, $0-48
	MOVQ         src+0(FP), SI
	MOVQ         codes+8(FP), DI
	MOVQ         n+16(FP), CX
	VBROADCASTSD inv+24(FP), Y15
	VBROADCASTSS s+32(FP), X14
	MOVQ         acc+40(FP), R8
	FP8LOADACC
	FP8CONSTS

bf16loop:
	VPMOVZXWD (SI), X0
	VPSLLD    $16, X0, X0
	VCVTPS2PD X0, Y0
	CODE4
	VPSRLD    $16, X4, X5
	VPAND     fp8one32<>(SB), X5, X5
	VPADDD    fp8bfr<>(SB), X4, X4
	VPADDD    X5, X4, X4
	VPAND     fp8hi16<>(SB), X4, X4
	STATS4
	ADDQ      $8, SI
	ADDQ      $4, DI
	SUBQ      $4, CX
	JNZ       bf16loop

	VMOVUPD Y8, 0(R8)
	VMOVUPD Y9, 32(R8)
	VMOVUPD Y10, 64(R8)
	VMOVUPD Y11, 96(R8)
	VZEROUPPER
	RET

DATA fp8abs32<>+0(SB)/8, $0x7fffffff7fffffff
DATA fp8abs32<>+8(SB)/8, $0x7fffffff7fffffff
DATA fp8abs32<>+16(SB)/8, $0x7fffffff7fffffff
DATA fp8abs32<>+24(SB)/8, $0x7fffffff7fffffff
GLOBL fp8abs32<>(SB), RODATA|NOPTR, $32

DATA fp8abs16<>+0(SB)/8, $0x7fff7fff7fff7fff
DATA fp8abs16<>+8(SB)/8, $0x7fff7fff7fff7fff
DATA fp8abs16<>+16(SB)/8, $0x7fff7fff7fff7fff
DATA fp8abs16<>+24(SB)/8, $0x7fff7fff7fff7fff
GLOBL fp8abs16<>(SB), RODATA|NOPTR, $32

// func fp8Max32AVX2(src *byte, n int, out *[8]uint32)
// The largest bit pattern of |x| over n (a multiple of 8, > 0) 4-byte values, per lane.
TEXT ·fp8Max32AVX2(SB), NOSPLIT, $0-24
	MOVQ    src+0(FP), SI
	MOVQ    n+8(FP), CX
	MOVQ    out+16(FP), R8
	VPXOR   Y1, Y1, Y1
	VMOVDQU fp8abs32<>(SB), Y2

max32loop:
	VPAND   (SI), Y2, Y0
	VPMAXUD Y0, Y1, Y1
	ADDQ    $32, SI
	SUBQ    $8, CX
	JNZ     max32loop

	VMOVDQU Y1, (R8)
	VZEROUPPER
	RET

// func fp8Max16AVX2(src *byte, n int, out *[16]uint16)
// As fp8Max32AVX2 for 2-byte values, n a multiple of 16.
TEXT ·fp8Max16AVX2(SB), NOSPLIT, $0-24
	MOVQ    src+0(FP), SI
	MOVQ    n+8(FP), CX
	MOVQ    out+16(FP), R8
	VPXOR   Y1, Y1, Y1
	VMOVDQU fp8abs16<>(SB), Y2

max16loop:
	VPAND   (SI), Y2, Y0
	VPMAXUW Y0, Y1, Y1
	ADDQ    $32, SI
	SUBQ    $16, CX
	JNZ     max16loop

	VMOVDQU Y1, (R8)
	VZEROUPPER
	RET

// func fp8F16AVX2(src, codes *byte, n int, inv float64, s float32, acc *[24]float64)
// As fp8F32AVX2 for float16 values (F16C); the decoded value is rounded to float16.
TEXT ·fp8F16AVX2(SB), NOSPLIT, $0-48
	MOVQ         src+0(FP), SI
	MOVQ         codes+8(FP), DI
	MOVQ         n+16(FP), CX
	VBROADCASTSD inv+24(FP), Y15
	VBROADCASTSS s+32(FP), X14
	MOVQ         acc+40(FP), R8
	FP8LOADACC
	FP8CONSTS

f16loop:
	VCVTPH2PS (SI), X0
	VCVTPS2PD X0, Y0
	CODE4
	VCVTPS2PH $0, X4, X5
	VCVTPH2PS X5, X4
	STATS4
	ADDQ      $8, SI
	ADDQ      $4, DI
	SUBQ      $4, CX
	JNZ       f16loop

	VMOVUPD Y8, 0(R8)
	VMOVUPD Y9, 32(R8)
	VMOVUPD Y10, 64(R8)
	VMOVUPD Y11, 96(R8)
	VZEROUPPER
	RET

// 1 in each dword.
DATA fp8x1<>+0(SB)/8, $0x0000000100000001
DATA fp8x1<>+8(SB)/8, $0x0000000100000001
DATA fp8x1<>+16(SB)/8, $0x0000000100000001
DATA fp8x1<>+24(SB)/8, $0x0000000100000001
GLOBL fp8x1<>(SB), RODATA|NOPTR, $32

// with the kept bit's parity, round half to even at bit 20.
DATA fp8x7ffff<>+0(SB)/8, $0x0007ffff0007ffff
DATA fp8x7ffff<>+8(SB)/8, $0x0007ffff0007ffff
DATA fp8x7ffff<>+16(SB)/8, $0x0007ffff0007ffff
DATA fp8x7ffff<>+24(SB)/8, $0x0007ffff0007ffff
GLOBL fp8x7ffff<>(SB), RODATA|NOPTR, $32

// sign, exponent and 3 mantissa bits of a float32.
DATA fp8xkeep<>+0(SB)/8, $0xfff00000fff00000
DATA fp8xkeep<>+8(SB)/8, $0xfff00000fff00000
DATA fp8xkeep<>+16(SB)/8, $0xfff00000fff00000
DATA fp8xkeep<>+24(SB)/8, $0xfff00000fff00000
GLOBL fp8xkeep<>(SB), RODATA|NOPTR, $32

// 448.0, the largest e4m3fn value.
DATA fp8x448<>+0(SB)/8, $0x43e0000043e00000
DATA fp8x448<>+8(SB)/8, $0x43e0000043e00000
DATA fp8x448<>+16(SB)/8, $0x43e0000043e00000
DATA fp8x448<>+24(SB)/8, $0x43e0000043e00000
GLOBL fp8x448<>(SB), RODATA|NOPTR, $32

// the near-tie window, see X8NORM.
DATA fp8x4<>+0(SB)/8, $0x0000000400000004
DATA fp8x4<>+8(SB)/8, $0x0000000400000004
DATA fp8x4<>+16(SB)/8, $0x0000000400000004
DATA fp8x4<>+24(SB)/8, $0x0000000400000004
GLOBL fp8x4<>(SB), RODATA|NOPTR, $32

DATA fp8xtiemask<>+0(SB)/8, $0x000ffff8000ffff8
DATA fp8xtiemask<>+8(SB)/8, $0x000ffff8000ffff8
DATA fp8xtiemask<>+16(SB)/8, $0x000ffff8000ffff8
DATA fp8xtiemask<>+24(SB)/8, $0x000ffff8000ffff8
GLOBL fp8xtiemask<>(SB), RODATA|NOPTR, $32

DATA fp8xmid<>+0(SB)/8, $0x0008000000080000
DATA fp8xmid<>+8(SB)/8, $0x0008000000080000
DATA fp8xmid<>+16(SB)/8, $0x0008000000080000
DATA fp8xmid<>+24(SB)/8, $0x0008000000080000
GLOBL fp8xmid<>(SB), RODATA|NOPTR, $32

// 2^14: its float32 ulp is 2^-9, the e4m3 step below 2^-5.
DATA fp8x2p14<>+0(SB)/8, $0x4680000046800000
DATA fp8x2p14<>+8(SB)/8, $0x4680000046800000
DATA fp8x2p14<>+16(SB)/8, $0x4680000046800000
DATA fp8x2p14<>+24(SB)/8, $0x4680000046800000
GLOBL fp8x2p14<>(SB), RODATA|NOPTR, $32

// 2^-10 - 2^-26.
DATA fp8xtiesub<>+0(SB)/8, $0x3a7fff003a7fff00
DATA fp8xtiesub<>+8(SB)/8, $0x3a7fff003a7fff00
DATA fp8xtiesub<>+16(SB)/8, $0x3a7fff003a7fff00
DATA fp8xtiesub<>+24(SB)/8, $0x3a7fff003a7fff00
GLOBL fp8xtiesub<>(SB), RODATA|NOPTR, $32

// the bits of 2^-6 (the smallest normal e4m3 value), less one.
DATA fp8xminm1<>+0(SB)/8, $0x3c7fffff3c7fffff
DATA fp8xminm1<>+8(SB)/8, $0x3c7fffff3c7fffff
DATA fp8xminm1<>+16(SB)/8, $0x3c7fffff3c7fffff
DATA fp8xminm1<>+24(SB)/8, $0x3c7fffff3c7fffff
GLOBL fp8xminm1<>(SB), RODATA|NOPTR, $32

// (127 - 7) << 3: exponent bias 127 -> 7, in code units.
DATA fp8x960<>+0(SB)/8, $0x000003c0000003c0
DATA fp8x960<>+8(SB)/8, $0x000003c0000003c0
DATA fp8x960<>+16(SB)/8, $0x000003c0000003c0
DATA fp8x960<>+24(SB)/8, $0x000003c0000003c0
GLOBL fp8x960<>(SB), RODATA|NOPTR, $32

DATA fp8xsign<>+0(SB)/8, $0x8000000080000000
DATA fp8xsign<>+8(SB)/8, $0x8000000080000000
DATA fp8xsign<>+16(SB)/8, $0x8000000080000000
DATA fp8xsign<>+24(SB)/8, $0x8000000080000000
GLOBL fp8xsign<>(SB), RODATA|NOPTR, $32

// bfloat16 rounding, as fp8bfr.
DATA fp8x7fff<>+0(SB)/8, $0x00007fff00007fff
DATA fp8x7fff<>+8(SB)/8, $0x00007fff00007fff
DATA fp8x7fff<>+16(SB)/8, $0x00007fff00007fff
DATA fp8x7fff<>+24(SB)/8, $0x00007fff00007fff
GLOBL fp8x7fff<>(SB), RODATA|NOPTR, $32

DATA fp8xhi16<>+0(SB)/8, $0xffff0000ffff0000
DATA fp8xhi16<>+8(SB)/8, $0xffff0000ffff0000
DATA fp8xhi16<>+16(SB)/8, $0xffff0000ffff0000
DATA fp8xhi16<>+24(SB)/8, $0xffff0000ffff0000
GLOBL fp8xhi16<>(SB), RODATA|NOPTR, $32

// The 8-wide loops (fp8F32x8AVX2, fp8BF16x8AVX2, fp8F16x8AVX2) code 8 values a turn in
// float32 lanes and store the same bytes and the same float64 sums as the 4-wide loops
// above (TestFP8WideMatchesNarrow). Why that holds:
//
// Codes. The 4-wide loops round R = x·inv (float64) to e4m3; here r = x·inv32 with
// inv32 = float32(inv), both products rounded to float32, so |r − R| ≤ 2^-23·1.00002·|R|:
// at most 2.00002 float32 ulps of r's binade, or 2^-29 below 2^-6. Rounding to nearest is
// monotone, so r and R round to the same e4m3 value unless an e4m3 midpoint lies within
// that distance of r. The midpoints are at 20 dropped bits 0x80000 of a normal r, and
// at odd multiples of 2^-10 below 2^-6; X8NORM flags a normal lane whose dropped bits are
// within −4…+3 of 0x80000, X8MIXED a lane under 2^-6 whose distance to the 2^-9 grid is
// ≥ 2^-10 − 2^-26, and a turn with a flagged lane is coded by CODE4 in float64 (X8SLOW).
// No other midpoint is near: 2^-6 and 448 are grid points, everything from 448 up saturates.
//
// Sums. e = x − y is exact in float32 (x and y are within a factor of 2 or y is 0: the
// Sterbenz lemma; for 16-bit inputs both have ≤ 11-bit significands a few binades
// apart), so float64(e) is the 4-wide loops' x − y; x², e², y² are exact in float64, so
// an FMA into the sum rounds exactly as their multiply-then-add. Element 8k+j is added
// to lane j mod 4, lanes 0–3 before 4–7: the 4-wide loops' order. max |e| is kept in
// float32 (widening keeps the order).

// X8CONSTS loads the constants the 8-wide loops keep in registers: Y6 = |·| mask,
// Y7 = 2^14, Y15 = inv32 (float32(inv): round to nearest).
#define X8CONSTS \
	VMOVDQU      fp8abs32<>(SB), Y6 \
	VMOVDQU      fp8x2p14<>(SB), Y7 \
	VCVTSD2SS    inv+24(FP), X15, X15 \
	VBROADCASTSS X15, Y15

// X8NORM: from x (Y0, 8 float32), r = x·inv32 (Y1), |r| (Y2), its normal coding (Y4: the
// rounded value's bits, saturated at 448), the lanes too near a midpoint for it (Y3) and the
// lanes where |r| ≥ 2^-6 (Y13); AX = the lanes fit for X8FAST (normal and not near), 0xFF
// when all are.
#define X8NORM \
	VMULPS    Y15, Y0, Y1 \
	VANDPS    Y6, Y1, Y2 \
	VPSRLD    $20, Y2, Y3 \
	VPAND     fp8x1<>(SB), Y3, Y3 \
	VPADDD    fp8x7ffff<>(SB), Y2, Y4 \
	VPADDD    Y3, Y4, Y4 \
	VPAND     fp8xkeep<>(SB), Y4, Y4 \
	VPMINUD   fp8x448<>(SB), Y4, Y4 \
	VPADDD    fp8x4<>(SB), Y2, Y3 \
	VPAND     fp8xtiemask<>(SB), Y3, Y3 \
	VPCMPEQD  fp8xmid<>(SB), Y3, Y3 \
	VPCMPGTD  fp8xminm1<>(SB), Y2, Y13 \
	VPANDN    Y13, Y3, Y5 \
	VMOVMSKPS Y5, AX

// X8FAST: every lane normal and clear of midpoints: the codes in Y5, q in Y4.
#define X8FAST \
	VPSRLD $20, Y4, Y5 \
	VPSUBD fp8x960<>(SB), Y5, Y5

// X8MIXED: some lane under 2^-6 or near a midpoint. The lanes under 2^-6 are coded by
// rounding r to a multiple of 2^-9 (adding 2^14, whose float32 ulp that is); AX = the lanes
// too near a midpoint (X8SLOW then), else the codes in Y5 and q in Y4. Uses Y2, Y12.
#define X8MIXED \
	VADDPS    Y7, Y2, Y5 \
	VSUBPS    Y7, Y5, Y12 \
	VSUBPS    Y12, Y2, Y2 \
	VANDPS    Y6, Y2, Y2 \
	VCMPPS    $0x1D, fp8xtiesub<>(SB), Y2, Y2 \
	VBLENDVPS Y13, Y3, Y2, Y3 \
	VMOVMSKPS Y3, AX \
	VPSRLD    $20, Y4, Y2 \
	VPSUBD    fp8x960<>(SB), Y2, Y2 \
	VPSUBD    Y7, Y5, Y5 \
	VBLENDVPS Y13, Y2, Y5, Y5 \
	VBLENDVPS Y13, Y4, Y12, Y4

// X8PACK signs the codes (Y5) and values (Y4) as r (Y1) is signed, stores the 8 codes at
// (DI) and leaves the decoded values float32(±q)·s in Y4.
#define X8PACK \
	VANDPS       fp8xsign<>(SB), Y1, Y1 \
	VORPS        Y1, Y4, Y4 \
	VPSRLD       $24, Y1, Y1 \
	VPOR         Y1, Y5, Y5 \
	VEXTRACTI128 $1, Y5, X1 \
	VPACKUSDW    X1, X5, X5 \
	VPACKUSWB    X5, X5, X5 \
	VMOVQ        X5, (DI) \
	VMULPS       Y14, Y4, Y4

// X8SLOW codes the turn's 8 values (Y0) with CODE4 in float64, four at a time, as the
// 4-wide loops do, then restores Y0 and the 8-wide constants; Y4 = the decoded values.
// acc[16:24] holds x and y meanwhile.
#define X8SLOW \
	VMOVUPS      Y0, 128(R8) \
	FP8CONSTS \
	VBROADCASTSD inv+24(FP), Y15 \
	VCVTPS2PD    X0, Y0 \
	CODE4 \
	VMOVUPS      X4, 160(R8) \
	VCVTPS2PD    144(R8), Y0 \
	ADDQ         $4, DI \
	CODE4 \
	SUBQ         $4, DI \
	VMOVUPS      X4, 176(R8) \
	VMOVUPS      160(R8), Y4 \
	VMOVUPS      128(R8), Y0 \
	X8CONSTS

// X8STATS adds x (Y0) and the decoded values (Y4) to the sums: Y8 Σx², Y9 Σe², Y10 Σy²
// (float64, lanes 0–3 then 4–7), Y11 max |e| (float32).
#define X8STATS \
	VSUBPS       Y4, Y0, Y5 \
	VANDPS       Y6, Y5, Y1 \
	VMAXPS       Y1, Y11, Y11 \
	VCVTPS2PD    X0, Y1 \
	VFMADD231PD  Y1, Y1, Y8 \
	VEXTRACTF128 $1, Y0, X0 \
	VCVTPS2PD    X0, Y0 \
	VFMADD231PD  Y0, Y0, Y8 \
	VCVTPS2PD    X5, Y1 \
	VFMADD231PD  Y1, Y1, Y9 \
	VEXTRACTF128 $1, Y5, X5 \
	VCVTPS2PD    X5, Y5 \
	VFMADD231PD  Y5, Y5, Y9 \
	VCVTPS2PD    X4, Y1 \
	VFMADD231PD  Y1, Y1, Y10 \
	VEXTRACTF128 $1, Y4, X4 \
	VCVTPS2PD    X4, Y4 \
	VFMADD231PD  Y4, Y4, Y10

// X8START loads the arguments and the sums; X8STORE writes the sums back (the max widened
// to float64, as the 4-wide loops keep it).
#define X8START \
	MOVQ         src+0(FP), SI \
	MOVQ         codes+8(FP), DI \
	MOVQ         n+16(FP), CX \
	VBROADCASTSS s+32(FP), Y14 \
	MOVQ         acc+40(FP), R8 \
	VMOVUPD      0(R8), Y8 \
	VMOVUPD      32(R8), Y9 \
	VMOVUPD      64(R8), Y10 \
	VXORPS       Y11, Y11, Y11 \
	X8CONSTS

#define X8STORE \
	VMOVUPD      Y8, 0(R8) \
	VMOVUPD      Y9, 32(R8) \
	VMOVUPD      Y10, 64(R8) \
	VCVTPS2PD    X11, Y1 \
	VEXTRACTF128 $1, Y11, X2 \
	VCVTPS2PD    X2, Y2 \
	VMAXPD       Y2, Y1, Y1 \
	VMOVUPD      Y1, 96(R8) \
	VZEROUPPER

// func fp8F32x8AVX2(src, codes *byte, n int, inv float64, s float32, acc *[24]float64)
// n: a multiple of 8, > 0; acc[0:12] the sums to continue (zeros), acc[16:24] scratch.
// Needs AVX2 and FMA.
TEXT ·fp8F32x8AVX2(SB), NOSPLIT, $0-48
	X8START

f32x8loop:
	VMOVUPS   (SI), Y0
	X8NORM
	CMPL AX, $0xFF
	JNE  f32x8mixed
	X8FAST
	X8PACK

f32x8join:
	X8STATS
	ADDQ $32, SI
	ADDQ $8, DI
	SUBQ $8, CX
	JNZ  f32x8loop

	X8STORE
	RET

f32x8mixed:
	X8MIXED
	TESTL AX, AX
	JNZ   f32x8slow
	X8PACK
	JMP   f32x8join

f32x8slow:
	X8SLOW
	JMP f32x8join

// func fp8BF16x8AVX2(src, codes *byte, n int, inv float64, s float32, acc *[24]float64)
// As fp8F32x8AVX2 for bfloat16 values; the decoded value is rounded to bfloat16.
TEXT ·fp8BF16x8AVX2(SB), NOSPLIT, $0-48
	X8START

bf16x8loop:
	VPMOVZXWD (SI), Y0
	VPSLLD    $16, Y0, Y0
	X8NORM
	CMPL AX, $0xFF
	JNE  bf16x8mixed
	X8FAST
	X8PACK

bf16x8join:
	VPSRLD $16, Y4, Y5
	VPAND  fp8x1<>(SB), Y5, Y5
	VPADDD fp8x7fff<>(SB), Y4, Y4
	VPADDD Y5, Y4, Y4
	VPAND  fp8xhi16<>(SB), Y4, Y4
	X8STATS
	ADDQ   $16, SI
	ADDQ   $8, DI
	SUBQ   $8, CX
	JNZ    bf16x8loop

	X8STORE
	RET

bf16x8mixed:
	X8MIXED
	TESTL AX, AX
	JNZ   bf16x8slow
	X8PACK
	JMP   bf16x8join

bf16x8slow:
	X8SLOW
	JMP bf16x8join

// func fp8F16x8AVX2(src, codes *byte, n int, inv float64, s float32, acc *[24]float64)
// As fp8F32x8AVX2 for float16 values (F16C); the decoded value is rounded to float16.
TEXT ·fp8F16x8AVX2(SB), NOSPLIT, $0-48
	X8START

f16x8loop:
	VCVTPH2PS (SI), Y0
	X8NORM
	CMPL AX, $0xFF
	JNE  f16x8mixed
	X8FAST
	X8PACK

f16x8join:
	VCVTPS2PH $0, Y4, X5
	VCVTPH2PS X5, Y4
	X8STATS
	ADDQ      $16, SI
	ADDQ      $8, DI
	SUBQ      $8, CX
	JNZ       f16x8loop

	X8STORE
	RET

f16x8mixed:
	X8MIXED
	TESTL AX, AX
	JNZ   f16x8slow
	X8PACK
	JMP   f16x8join

f16x8slow:
	X8SLOW
	JMP f16x8join
