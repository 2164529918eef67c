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

// func fp8F32AVX2(src, codes *byte, n int, inv float64, s float32, acc *[16]float64)
// n: a multiple of 4, > 0.
TEXT ·fp8F32AVX2(SB), NOSPLIT, $0-48
	MOVQ         src+0(FP), SI
	MOVQ         codes+8(FP), DI
	MOVQ         n+16(FP), CX
	VBROADCASTSD inv+24(FP), Y15
	VBROADCASTSS s+32(FP), X14
	MOVQ         acc+40(FP), R8
	VXORPD       Y8, Y8, Y8
	VXORPD       Y9, Y9, Y9
	VXORPD       Y10, Y10, Y10
	VXORPD       Y11, Y11, Y11
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

// func fp8BF16AVX2(src, codes *byte, n int, inv float64, s float32, acc *[16]float64)
// As fp8F32AVX2 for bfloat16 values; the decoded value is rounded to bfloat16.
TEXT ·fp8BF16AVX2(SB), NOSPLIT, $0-48
	MOVQ         src+0(FP), SI
	MOVQ         codes+8(FP), DI
	MOVQ         n+16(FP), CX
	VBROADCASTSD inv+24(FP), Y15
	VBROADCASTSS s+32(FP), X14
	MOVQ         acc+40(FP), R8
	VXORPD       Y8, Y8, Y8
	VXORPD       Y9, Y9, Y9
	VXORPD       Y10, Y10, Y10
	VXORPD       Y11, Y11, Y11
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

// func fp8F16AVX2(src, codes *byte, n int, inv float64, s float32, acc *[16]float64)
// As fp8F32AVX2 for float16 values (F16C); the decoded value is rounded to float16.
TEXT ·fp8F16AVX2(SB), NOSPLIT, $0-48
	MOVQ         src+0(FP), SI
	MOVQ         codes+8(FP), DI
	MOVQ         n+16(FP), CX
	VBROADCASTSD inv+24(FP), Y15
	VBROADCASTSS s+32(FP), X14
	MOVQ         acc+40(FP), R8
	VXORPD       Y8, Y8, Y8
	VXORPD       Y9, Y9, Y9
	VXORPD       Y10, Y10, Y10
	VXORPD       Y11, Y11, Y11
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
