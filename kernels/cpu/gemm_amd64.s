//go:build amd64 && !purego

#include "textflag.h"

// The micro-kernels compute an mr×nr block of C = A·B over k steps:
//
//	func gemmMRxNR(k int, a *T, lda int, b *T, ldb int, c *T, ldc int, add bool)
//
// A's row r is at a + r*lda, B's k step q at b + q*ldb (lda and ldb in
// elements), each holding consecutive elements: k of A, nr of B. Each k
// step loads B's nr elements into two vector registers (Y0, Y1 or Z0, Z1),
// broadcasts each row's element of A in turn and adds the products to that
// row's two accumulators. Rows 0-2 are addressed from SI, 3-5 from R10,
// 6-8 from R11 and 9-11 from R12, each plus 0, 1 or 2 times lda (R8, in
// bytes); k steps 0-3 of an unrolled loop from DI plus 0, 1 or 2 times
// ldb (R13, in bytes) or plus 3 times ldb (BX). Every element of C is one chain of fused
// multiply-adds in k order, whatever the kernel, so all kernels of a dtype
// give the same bits. The block is then stored to C at c (row length ldc),
// or added to what is there if add.

// ROW multiplies the B vectors by A's element at addr, broadcast into bc
// by the instruction bcast, and adds the products to acc0 and acc1.
#define ROW(bcast, fma, addr, b0, b1, bc, acc0, acc1) \
	bcast addr, bc; \
	fma b0, bc, acc0; \
	fma b1, bc, acc1

// STEP6 is one k step of a 6-row AVX2 kernel: B at b0 and b1, A's elements
// at offset ao of each row; accumulators Y4-Y15.
#define STEP6(bcast, fma, ao, b0, b1) \
	VMOVUPS b0, Y0; \
	VMOVUPS b1, Y1; \
	ROW(bcast, fma, ao(SI), Y0, Y1, Y2, Y4, Y5); \
	ROW(bcast, fma, ao(SI)(R8*1), Y0, Y1, Y3, Y6, Y7); \
	ROW(bcast, fma, ao(SI)(R8*2), Y0, Y1, Y2, Y8, Y9); \
	ROW(bcast, fma, ao(R10), Y0, Y1, Y3, Y10, Y11); \
	ROW(bcast, fma, ao(R10)(R8*1), Y0, Y1, Y2, Y12, Y13); \
	ROW(bcast, fma, ao(R10)(R8*2), Y0, Y1, Y3, Y14, Y15)

// STEP12 is one k step of a 12-row AVX-512 kernel: B at b0 and b1, A's
// elements at offset ao of each row; accumulators Z8-Z31.
#define STEP12(bcast, fma, ao, b0, b1) \
	VMOVUPS b0, Z0; \
	VMOVUPS b1, Z1; \
	ROW(bcast, fma, ao(SI), Z0, Z1, Z2, Z8, Z9); \
	ROW(bcast, fma, ao(SI)(R8*1), Z0, Z1, Z3, Z10, Z11); \
	ROW(bcast, fma, ao(SI)(R8*2), Z0, Z1, Z4, Z12, Z13); \
	ROW(bcast, fma, ao(R10), Z0, Z1, Z5, Z14, Z15); \
	ROW(bcast, fma, ao(R10)(R8*1), Z0, Z1, Z6, Z16, Z17); \
	ROW(bcast, fma, ao(R10)(R8*2), Z0, Z1, Z7, Z18, Z19); \
	ROW(bcast, fma, ao(R11), Z0, Z1, Z2, Z20, Z21); \
	ROW(bcast, fma, ao(R11)(R8*1), Z0, Z1, Z3, Z22, Z23); \
	ROW(bcast, fma, ao(R11)(R8*2), Z0, Z1, Z4, Z24, Z25); \
	ROW(bcast, fma, ao(R12), Z0, Z1, Z5, Z26, Z27); \
	ROW(bcast, fma, ao(R12)(R8*1), Z0, Z1, Z6, Z28, Z29); \
	ROW(bcast, fma, ao(R12)(R8*2), Z0, Z1, Z7, Z30, Z31)

// ROW1 is ROW for one B vector.
#define ROW1(bcast, fma, addr, b0, bc, acc) \
	bcast addr, bc; \
	fma b0, bc, acc

// STEP12N is one k step of a narrow 12-row AVX-512 kernel: B at b0, A's
// elements at offset ao of each row; accumulators Z8-Z19.
#define STEP12N(bcast, fma, ao, b0) \
	VMOVUPS b0, Z0; \
	ROW1(bcast, fma, ao(SI), Z0, Z2, Z8); \
	ROW1(bcast, fma, ao(SI)(R8*1), Z0, Z3, Z9); \
	ROW1(bcast, fma, ao(SI)(R8*2), Z0, Z4, Z10); \
	ROW1(bcast, fma, ao(R10), Z0, Z5, Z11); \
	ROW1(bcast, fma, ao(R10)(R8*1), Z0, Z6, Z12); \
	ROW1(bcast, fma, ao(R10)(R8*2), Z0, Z7, Z13); \
	ROW1(bcast, fma, ao(R11), Z0, Z2, Z14); \
	ROW1(bcast, fma, ao(R11)(R8*1), Z0, Z3, Z15); \
	ROW1(bcast, fma, ao(R11)(R8*2), Z0, Z4, Z16); \
	ROW1(bcast, fma, ao(R12), Z0, Z5, Z17); \
	ROW1(bcast, fma, ao(R12)(R8*1), Z0, Z6, Z18); \
	ROW1(bcast, fma, ao(R12)(R8*2), Z0, Z7, Z19)

// OUT1 is OUT for one vector.
#define OUT1(add, acc) \
	TESTQ AX, AX; \
	JZ 2(PC); \
	add (DX), acc, acc; \
	VMOVUPS acc, (DX); \
	ADDQ R9, DX

#define OUT12N(add) \
	OUT1(add, Z8); OUT1(add, Z9); OUT1(add, Z10); OUT1(add, Z11); \
	OUT1(add, Z12); OUT1(add, Z13); OUT1(add, Z14); OUT1(add, Z15); \
	OUT1(add, Z16); OUT1(add, Z17); OUT1(add, Z18); OUT1(add, Z19)

#define ZERO12N \
	VPXORD Z8, Z8, Z8; VPXORD Z9, Z9, Z9; VPXORD Z10, Z10, Z10; VPXORD Z11, Z11, Z11; \
	VPXORD Z12, Z12, Z12; VPXORD Z13, Z13, Z13; VPXORD Z14, Z14, Z14; VPXORD Z15, Z15, Z15; \
	VPXORD Z16, Z16, Z16; VPXORD Z17, Z17, Z17; VPXORD Z18, Z18, Z18; VPXORD Z19, Z19, Z19

// OUT stores the row of accumulators lo, hi (vectors of vb bytes) to C at
// DX, or adds them there if AX is not zero, and moves DX to the next row.
#define OUT(add, lo, hi, vb) \
	TESTQ AX, AX; \
	JZ 3(PC); \
	add (DX), lo, lo; \
	add vb(DX), hi, hi; \
	VMOVUPS lo, (DX); \
	VMOVUPS hi, vb(DX); \
	ADDQ R9, DX

// PROLOGUE loads the arguments: k to CX, a to SI, lda to R8, b to DI and
// ldb to R13, lda and ldb scaled by the element size 1<<shift; R10 = a +
// 3*lda, BX = 3*ldb.
#define PROLOGUE(shift) \
	MOVQ k+0(FP), CX; \
	MOVQ a+8(FP), SI; \
	MOVQ lda+16(FP), R8; \
	SHLQ $shift, R8; \
	MOVQ b+24(FP), DI; \
	MOVQ ldb+32(FP), R13; \
	SHLQ $shift, R13; \
	LEAQ (SI)(R8*2), R10; \
	ADDQ R8, R10; \
	LEAQ (R13)(R13*2), BX

// EPILOGUE loads c to DX, ldc scaled by 1<<shift to R9, add to AX.
#define EPILOGUE(shift) \
	MOVQ c+40(FP), DX; \
	MOVQ ldc+48(FP), R9; \
	SHLQ $shift, R9; \
	MOVBQZX add+56(FP), AX

#define ZERO6 \
	VXORPS Y4, Y4, Y4; VXORPS Y5, Y5, Y5; VXORPS Y6, Y6, Y6; VXORPS Y7, Y7, Y7; \
	VXORPS Y8, Y8, Y8; VXORPS Y9, Y9, Y9; VXORPS Y10, Y10, Y10; VXORPS Y11, Y11, Y11; \
	VXORPS Y12, Y12, Y12; VXORPS Y13, Y13, Y13; VXORPS Y14, Y14, Y14; VXORPS Y15, Y15, Y15

#define ZERO12 \
	VPXORD Z8, Z8, Z8; VPXORD Z9, Z9, Z9; VPXORD Z10, Z10, Z10; VPXORD Z11, Z11, Z11; \
	VPXORD Z12, Z12, Z12; VPXORD Z13, Z13, Z13; VPXORD Z14, Z14, Z14; VPXORD Z15, Z15, Z15; \
	VPXORD Z16, Z16, Z16; VPXORD Z17, Z17, Z17; VPXORD Z18, Z18, Z18; VPXORD Z19, Z19, Z19; \
	VPXORD Z20, Z20, Z20; VPXORD Z21, Z21, Z21; VPXORD Z22, Z22, Z22; VPXORD Z23, Z23, Z23; \
	VPXORD Z24, Z24, Z24; VPXORD Z25, Z25, Z25; VPXORD Z26, Z26, Z26; VPXORD Z27, Z27, Z27; \
	VPXORD Z28, Z28, Z28; VPXORD Z29, Z29, Z29; VPXORD Z30, Z30, Z30; VPXORD Z31, Z31, Z31

#define OUT6(add) \
	OUT(add, Y4, Y5, 32); OUT(add, Y6, Y7, 32); OUT(add, Y8, Y9, 32); \
	OUT(add, Y10, Y11, 32); OUT(add, Y12, Y13, 32); OUT(add, Y14, Y15, 32)

#define OUT12(add) \
	OUT(add, Z8, Z9, 64); OUT(add, Z10, Z11, 64); OUT(add, Z12, Z13, 64); \
	OUT(add, Z14, Z15, 64); OUT(add, Z16, Z17, 64); OUT(add, Z18, Z19, 64); \
	OUT(add, Z20, Z21, 64); OUT(add, Z22, Z23, 64); OUT(add, Z24, Z25, 64); \
	OUT(add, Z26, Z27, 64); OUT(add, Z28, Z29, 64); OUT(add, Z30, Z31, 64)

// func gemm6x16(k int, a *float32, lda int, b *float32, ldb int, c *float32, ldc int, add bool)
TEXT ·gemm6x16(SB), NOSPLIT, $0-57
	PROLOGUE(2)
	ZERO6
	CMPQ CX, $4
	JLT tail

loop4:
	STEP6(VBROADCASTSS, VFMADD231PS, 0, (DI), 32(DI))
	STEP6(VBROADCASTSS, VFMADD231PS, 4, (DI)(R13*1), 32(DI)(R13*1))
	STEP6(VBROADCASTSS, VFMADD231PS, 8, (DI)(R13*2), 32(DI)(R13*2))
	STEP6(VBROADCASTSS, VFMADD231PS, 12, (DI)(BX*1), 32(DI)(BX*1))
	ADDQ $16, SI
	ADDQ $16, R10
	LEAQ (DI)(R13*4), DI
	SUBQ $4, CX
	CMPQ CX, $4
	JGE loop4

tail:
	TESTQ CX, CX
	JZ done

loop1:
	STEP6(VBROADCASTSS, VFMADD231PS, 0, (DI), 32(DI))
	ADDQ $4, SI
	ADDQ $4, R10
	ADDQ R13, DI
	DECQ CX
	JNZ loop1

done:
	EPILOGUE(2)
	OUT6(VADDPS)
	VZEROUPPER
	RET

// func gemm6x8d(k int, a *float64, lda int, b *float64, ldb int, c *float64, ldc int, add bool)
TEXT ·gemm6x8d(SB), NOSPLIT, $0-57
	PROLOGUE(3)
	ZERO6
	CMPQ CX, $4
	JLT tail

loop4:
	STEP6(VBROADCASTSD, VFMADD231PD, 0, (DI), 32(DI))
	STEP6(VBROADCASTSD, VFMADD231PD, 8, (DI)(R13*1), 32(DI)(R13*1))
	STEP6(VBROADCASTSD, VFMADD231PD, 16, (DI)(R13*2), 32(DI)(R13*2))
	STEP6(VBROADCASTSD, VFMADD231PD, 24, (DI)(BX*1), 32(DI)(BX*1))
	ADDQ $32, SI
	ADDQ $32, R10
	LEAQ (DI)(R13*4), DI
	SUBQ $4, CX
	CMPQ CX, $4
	JGE loop4

tail:
	TESTQ CX, CX
	JZ done

loop1:
	STEP6(VBROADCASTSD, VFMADD231PD, 0, (DI), 32(DI))
	ADDQ $8, SI
	ADDQ $8, R10
	ADDQ R13, DI
	DECQ CX
	JNZ loop1

done:
	EPILOGUE(3)
	OUT6(VADDPD)
	VZEROUPPER
	RET

// func gemm12x32(k int, a *float32, lda int, b *float32, ldb int, c *float32, ldc int, add bool)
TEXT ·gemm12x32(SB), NOSPLIT, $0-57
	PROLOGUE(2)
	LEAQ (R10)(R8*2), R11
	ADDQ R8, R11
	LEAQ (R11)(R8*2), R12
	ADDQ R8, R12
	ZERO12
	CMPQ CX, $4
	JLT tail

loop4:
	STEP12(VBROADCASTSS, VFMADD231PS, 0, (DI), 64(DI))
	STEP12(VBROADCASTSS, VFMADD231PS, 4, (DI)(R13*1), 64(DI)(R13*1))
	STEP12(VBROADCASTSS, VFMADD231PS, 8, (DI)(R13*2), 64(DI)(R13*2))
	STEP12(VBROADCASTSS, VFMADD231PS, 12, (DI)(BX*1), 64(DI)(BX*1))
	ADDQ $16, SI
	ADDQ $16, R10
	ADDQ $16, R11
	ADDQ $16, R12
	LEAQ (DI)(R13*4), DI
	SUBQ $4, CX
	CMPQ CX, $4
	JGE loop4

tail:
	TESTQ CX, CX
	JZ done

loop1:
	STEP12(VBROADCASTSS, VFMADD231PS, 0, (DI), 64(DI))
	ADDQ $4, SI
	ADDQ $4, R10
	ADDQ $4, R11
	ADDQ $4, R12
	ADDQ R13, DI
	DECQ CX
	JNZ loop1

done:
	EPILOGUE(2)
	OUT12(VADDPS)
	VZEROUPPER
	RET

// func gemm12x16d(k int, a *float64, lda int, b *float64, ldb int, c *float64, ldc int, add bool)
TEXT ·gemm12x16d(SB), NOSPLIT, $0-57
	PROLOGUE(3)
	LEAQ (R10)(R8*2), R11
	ADDQ R8, R11
	LEAQ (R11)(R8*2), R12
	ADDQ R8, R12
	ZERO12
	CMPQ CX, $4
	JLT tail

loop4:
	STEP12(VBROADCASTSD, VFMADD231PD, 0, (DI), 64(DI))
	STEP12(VBROADCASTSD, VFMADD231PD, 8, (DI)(R13*1), 64(DI)(R13*1))
	STEP12(VBROADCASTSD, VFMADD231PD, 16, (DI)(R13*2), 64(DI)(R13*2))
	STEP12(VBROADCASTSD, VFMADD231PD, 24, (DI)(BX*1), 64(DI)(BX*1))
	ADDQ $32, SI
	ADDQ $32, R10
	ADDQ $32, R11
	ADDQ $32, R12
	LEAQ (DI)(R13*4), DI
	SUBQ $4, CX
	CMPQ CX, $4
	JGE loop4

tail:
	TESTQ CX, CX
	JZ done

loop1:
	STEP12(VBROADCASTSD, VFMADD231PD, 0, (DI), 64(DI))
	ADDQ $8, SI
	ADDQ $8, R10
	ADDQ $8, R11
	ADDQ $8, R12
	ADDQ R13, DI
	DECQ CX
	JNZ loop1

done:
	EPILOGUE(3)
	OUT12(VADDPD)
	VZEROUPPER
	RET

// func gemm12x16(k int, a *float32, lda int, b *float32, ldb int, c *float32, ldc int, add bool)
TEXT ·gemm12x16(SB), NOSPLIT, $0-57
	PROLOGUE(2)
	LEAQ (R10)(R8*2), R11
	ADDQ R8, R11
	LEAQ (R11)(R8*2), R12
	ADDQ R8, R12
	ZERO12N
	CMPQ CX, $4
	JLT tail

loop4:
	STEP12N(VBROADCASTSS, VFMADD231PS, 0, (DI))
	STEP12N(VBROADCASTSS, VFMADD231PS, 4, (DI)(R13*1))
	STEP12N(VBROADCASTSS, VFMADD231PS, 8, (DI)(R13*2))
	STEP12N(VBROADCASTSS, VFMADD231PS, 12, (DI)(BX*1))
	ADDQ $16, SI
	ADDQ $16, R10
	ADDQ $16, R11
	ADDQ $16, R12
	LEAQ (DI)(R13*4), DI
	SUBQ $4, CX
	CMPQ CX, $4
	JGE loop4

tail:
	TESTQ CX, CX
	JZ done

loop1:
	STEP12N(VBROADCASTSS, VFMADD231PS, 0, (DI))
	ADDQ $4, SI
	ADDQ $4, R10
	ADDQ $4, R11
	ADDQ $4, R12
	ADDQ R13, DI
	DECQ CX
	JNZ loop1

done:
	EPILOGUE(2)
	OUT12N(VADDPS)
	VZEROUPPER
	RET

// func gemm12x8d(k int, a *float64, lda int, b *float64, ldb int, c *float64, ldc int, add bool)
TEXT ·gemm12x8d(SB), NOSPLIT, $0-57
	PROLOGUE(3)
	LEAQ (R10)(R8*2), R11
	ADDQ R8, R11
	LEAQ (R11)(R8*2), R12
	ADDQ R8, R12
	ZERO12N
	CMPQ CX, $4
	JLT tail

loop4:
	STEP12N(VBROADCASTSD, VFMADD231PD, 0, (DI))
	STEP12N(VBROADCASTSD, VFMADD231PD, 8, (DI)(R13*1))
	STEP12N(VBROADCASTSD, VFMADD231PD, 16, (DI)(R13*2))
	STEP12N(VBROADCASTSD, VFMADD231PD, 24, (DI)(BX*1))
	ADDQ $32, SI
	ADDQ $32, R10
	ADDQ $32, R11
	ADDQ $32, R12
	LEAQ (DI)(R13*4), DI
	SUBQ $4, CX
	CMPQ CX, $4
	JGE loop4

tail:
	TESTQ CX, CX
	JZ done

loop1:
	STEP12N(VBROADCASTSD, VFMADD231PD, 0, (DI))
	ADDQ $8, SI
	ADDQ $8, R10
	ADDQ $8, R11
	ADDQ $8, R12
	ADDQ R13, DI
	DECQ CX
	JNZ loop1

done:
	EPILOGUE(3)
	OUT12N(VADDPD)
	VZEROUPPER
	RET

// func cpuid(leaf, sub uint32) (a, b, c, d uint32)
TEXT ·cpuid(SB), NOSPLIT, $0-24
	MOVL leaf+0(FP), AX
	MOVL sub+4(FP), CX
	CPUID
	MOVL AX, a+8(FP)
	MOVL BX, b+12(FP)
	MOVL CX, c+16(FP)
	MOVL DX, d+20(FP)
	RET

// func xgetbv0() (lo, hi uint32)
TEXT ·xgetbv0(SB), NOSPLIT, $0-8
	MOVL $0, CX
	XGETBV
	MOVL AX, lo+0(FP)
	MOVL DX, hi+4(FP)
	RET
