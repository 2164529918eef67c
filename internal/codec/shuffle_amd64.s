//go:build !purego

#include "textflag.h"

// Per 128-bit lane: byte j of each of the four 4-byte elements, plane by plane.
DATA shuf4<>+0(SB)/8, $0x0d0905010c080400
DATA shuf4<>+8(SB)/8, $0x0f0b07030e0a0602
DATA shuf4<>+16(SB)/8, $0x0d0905010c080400
DATA shuf4<>+24(SB)/8, $0x0f0b07030e0a0602
GLOBL shuf4<>(SB), RODATA|NOPTR, $32

// Dword order that puts each plane's 4+4 bytes from the two lanes side by side.
DATA perm4<>+0(SB)/8, $0x0000000400000000
DATA perm4<>+8(SB)/8, $0x0000000500000001
DATA perm4<>+16(SB)/8, $0x0000000600000002
DATA perm4<>+24(SB)/8, $0x0000000700000003
GLOBL perm4<>(SB), RODATA|NOPTR, $32

// Per 128-bit lane: the low bytes of the eight 2-byte elements, then the high bytes.
DATA shuf2<>+0(SB)/8, $0x0e0c0a0806040200
DATA shuf2<>+8(SB)/8, $0x0f0d0b0907050301
DATA shuf2<>+16(SB)/8, $0x0e0c0a0806040200
DATA shuf2<>+24(SB)/8, $0x0f0d0b0907050301
GLOBL shuf2<>(SB), RODATA|NOPTR, $32

// func shuffle4AVX2(p0, p1, p2, p3, src *byte, blocks int, rot bool)
// 16 elements (64 bytes of src, 16 bytes of each plane) per block.
TEXT ·shuffle4AVX2(SB), NOSPLIT, $0-49
	MOVQ    p0+0(FP), R8
	MOVQ    p1+8(FP), R9
	MOVQ    p2+16(FP), R10
	MOVQ    p3+24(FP), R11
	MOVQ    src+32(FP), SI
	MOVQ    blocks+40(FP), CX
	MOVBQZX rot+48(FP), AX
	// Rotate left by rot: (x << rot) | (x >> (32-rot)); a shift by 32 gives 0.
	MOVQ    $32, DX
	SUBQ    AX, DX
	MOVQ    AX, X4
	MOVQ    DX, X5
	VMOVDQU shuf4<>(SB), Y6
	VMOVDQU perm4<>(SB), Y7
	XORQ    DI, DI
	TESTQ   CX, CX
	JZ      done4

loop4:
	VMOVDQU      (SI), Y0
	VMOVDQU      32(SI), Y1
	VPSLLD       X4, Y0, Y2
	VPSRLD       X5, Y0, Y3
	VPOR         Y2, Y3, Y0
	VPSLLD       X4, Y1, Y2
	VPSRLD       X5, Y1, Y3
	VPOR         Y2, Y3, Y1
	VPSHUFB      Y6, Y0, Y0
	VPSHUFB      Y6, Y1, Y1
	VPERMD       Y0, Y7, Y0
	VPERMD       Y1, Y7, Y1
	VPUNPCKLQDQ  Y1, Y0, Y2
	VPUNPCKHQDQ  Y1, Y0, Y3
	VMOVDQU      X2, (R8)(DI*1)
	VMOVDQU      X3, (R9)(DI*1)
	VEXTRACTI128 $1, Y2, (R10)(DI*1)
	VEXTRACTI128 $1, Y3, (R11)(DI*1)
	ADDQ         $64, SI
	ADDQ         $16, DI
	DECQ         CX
	JNZ          loop4

done4:
	VZEROUPPER
	RET

// func shuffle2AVX2(p0, p1, src *byte, blocks int, rot bool)
// 32 elements (64 bytes of src, 32 bytes of each plane) per block.
TEXT ·shuffle2AVX2(SB), NOSPLIT, $0-33
	MOVQ    p0+0(FP), R8
	MOVQ    p1+8(FP), R9
	MOVQ    src+16(FP), SI
	MOVQ    blocks+24(FP), CX
	MOVBQZX rot+32(FP), AX
	MOVQ    $16, DX
	SUBQ    AX, DX
	MOVQ    AX, X4
	MOVQ    DX, X5
	VMOVDQU shuf2<>(SB), Y6
	XORQ    DI, DI
	TESTQ   CX, CX
	JZ      done2

loop2:
	VMOVDQU    (SI), Y0
	VMOVDQU    32(SI), Y1
	VPSLLW     X4, Y0, Y2
	VPSRLW     X5, Y0, Y3
	VPOR       Y2, Y3, Y0
	VPSLLW     X4, Y1, Y2
	VPSRLW     X5, Y1, Y3
	VPOR       Y2, Y3, Y1
	VPSHUFB    Y6, Y0, Y0
	VPSHUFB    Y6, Y1, Y1
	VPERMQ     $0xD8, Y0, Y0
	VPERMQ     $0xD8, Y1, Y1
	VPERM2I128 $0x20, Y1, Y0, Y2
	VPERM2I128 $0x31, Y1, Y0, Y3
	VMOVDQU    Y2, (R8)(DI*1)
	VMOVDQU    Y3, (R9)(DI*1)
	ADDQ       $64, SI
	ADDQ       $32, DI
	DECQ       CX
	JNZ        loop2

done2:
	VZEROUPPER
	RET
