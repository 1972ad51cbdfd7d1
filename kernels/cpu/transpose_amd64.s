//go:build amd64 && !purego

#include "textflag.h"

// The block transposes of packing (gemm_amd64.go): n square blocks, block
// i at src + i*sstep (rows lds apart) written transposed to dst + i*dstep
// (rows ldd apart); lengths in elements. They need AVX.
//
//	func transpose8x8(n int, src *float32, lds, sstep int, dst *float32, ldd, dstep int)
//	func transpose4x4d(n int, src *float64, lds, sstep int, dst *float64, ldd, dstep int)

// TARGS loads the arguments, lengths scaled by the element size 1<<shift:
// n to CX, src to SI, lds to R8, 3*lds to R9, src+4*lds to R10, sstep to
// AX, dst to DI, ldd to R11, 3*ldd to R12, dst+4*ldd to R13, dstep to BX.
#define TARGS(shift) \
	MOVQ n+0(FP), CX; \
	MOVQ src+8(FP), SI; \
	MOVQ lds+16(FP), R8; \
	SHLQ $shift, R8; \
	MOVQ sstep+24(FP), AX; \
	SHLQ $shift, AX; \
	MOVQ dst+32(FP), DI; \
	MOVQ ldd+40(FP), R11; \
	SHLQ $shift, R11; \
	MOVQ dstep+48(FP), BX; \
	SHLQ $shift, BX; \
	LEAQ (R8)(R8*2), R9; \
	LEAQ (SI)(R8*4), R10; \
	LEAQ (R11)(R11*2), R12; \
	LEAQ (DI)(R11*4), R13

// func transpose8x8(n int, src *float32, lds, sstep int, dst *float32, ldd, dstep int)
TEXT ·transpose8x8(SB), NOSPLIT, $0-56
	TARGS(2)
	TESTQ CX, CX
	JZ done

loop:
	VMOVUPS (SI), Y0
	VMOVUPS (SI)(R8*1), Y1
	VMOVUPS (SI)(R8*2), Y2
	VMOVUPS (SI)(R9*1), Y3
	VMOVUPS (R10), Y4
	VMOVUPS (R10)(R8*1), Y5
	VMOVUPS (R10)(R8*2), Y6
	VMOVUPS (R10)(R9*1), Y7
	// Pairs of rows interleaved: t0 = r0[0] r1[0] r0[1] r1[1] | r0[4] r1[4] r0[5] r1[5], ...
	VUNPCKLPS Y1, Y0, Y8
	VUNPCKHPS Y1, Y0, Y9
	VUNPCKLPS Y3, Y2, Y10
	VUNPCKHPS Y3, Y2, Y11
	VUNPCKLPS Y5, Y4, Y12
	VUNPCKHPS Y5, Y4, Y13
	VUNPCKLPS Y7, Y6, Y14
	VUNPCKHPS Y7, Y6, Y15
	// Columns of four rows: r0[j] r1[j] r2[j] r3[j] | the same of j+4.
	VSHUFPS $0x44, Y10, Y8, Y0
	VSHUFPS $0xEE, Y10, Y8, Y1
	VSHUFPS $0x44, Y11, Y9, Y2
	VSHUFPS $0xEE, Y11, Y9, Y3
	VSHUFPS $0x44, Y14, Y12, Y4
	VSHUFPS $0xEE, Y14, Y12, Y5
	VSHUFPS $0x44, Y15, Y13, Y6
	VSHUFPS $0xEE, Y15, Y13, Y7
	// Whole columns: the low lanes, then the high lanes.
	VPERM2F128 $0x20, Y4, Y0, Y8
	VPERM2F128 $0x20, Y5, Y1, Y9
	VPERM2F128 $0x20, Y6, Y2, Y10
	VPERM2F128 $0x20, Y7, Y3, Y11
	VPERM2F128 $0x31, Y4, Y0, Y12
	VPERM2F128 $0x31, Y5, Y1, Y13
	VPERM2F128 $0x31, Y6, Y2, Y14
	VPERM2F128 $0x31, Y7, Y3, Y15
	VMOVUPS Y8, (DI)
	VMOVUPS Y9, (DI)(R11*1)
	VMOVUPS Y10, (DI)(R11*2)
	VMOVUPS Y11, (DI)(R12*1)
	VMOVUPS Y12, (R13)
	VMOVUPS Y13, (R13)(R11*1)
	VMOVUPS Y14, (R13)(R11*2)
	VMOVUPS Y15, (R13)(R12*1)
	ADDQ AX, SI
	ADDQ AX, R10
	ADDQ BX, DI
	ADDQ BX, R13
	DECQ CX
	JNZ loop
	VZEROUPPER

done:
	RET

// func transpose4x4d(n int, src *float64, lds, sstep int, dst *float64, ldd, dstep int)
TEXT ·transpose4x4d(SB), NOSPLIT, $0-56
	TARGS(3)
	TESTQ CX, CX
	JZ done

loop:
	VMOVUPD (SI), Y0
	VMOVUPD (SI)(R8*1), Y1
	VMOVUPD (SI)(R8*2), Y2
	VMOVUPD (SI)(R9*1), Y3
	// r0[0] r1[0] | r0[2] r1[2], r0[1] r1[1] | r0[3] r1[3], the same of r2, r3.
	VUNPCKLPD Y1, Y0, Y4
	VUNPCKHPD Y1, Y0, Y5
	VUNPCKLPD Y3, Y2, Y6
	VUNPCKHPD Y3, Y2, Y7
	VPERM2F128 $0x20, Y6, Y4, Y0
	VPERM2F128 $0x20, Y7, Y5, Y1
	VPERM2F128 $0x31, Y6, Y4, Y2
	VPERM2F128 $0x31, Y7, Y5, Y3
	VMOVUPD Y0, (DI)
	VMOVUPD Y1, (DI)(R11*1)
	VMOVUPD Y2, (DI)(R11*2)
	VMOVUPD Y3, (DI)(R12*1)
	ADDQ AX, SI
	ADDQ BX, DI
	DECQ CX
	JNZ loop
	VZEROUPPER

done:
	RET
