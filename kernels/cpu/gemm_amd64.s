//go:build amd64 && !purego

#include "textflag.h"

// STEP is one k step of the 6×16 kernel: B's 16 columns at bo(DI) into Y0
// and Y1, each of A's 6 rows at ao(SI) broadcast in turn into Y2 or Y3,
// and 12 fused multiply-adds into the accumulators Y4…Y15 (row r in
// Y(4+2r), Y(5+2r)).
#define STEP(ao, bo) \
	VMOVUPS (bo)(DI), Y0; \
	VMOVUPS (bo+32)(DI), Y1; \
	VBROADCASTSS (ao)(SI), Y2; \
	VFMADD231PS Y0, Y2, Y4; \
	VFMADD231PS Y1, Y2, Y5; \
	VBROADCASTSS (ao+4)(SI), Y3; \
	VFMADD231PS Y0, Y3, Y6; \
	VFMADD231PS Y1, Y3, Y7; \
	VBROADCASTSS (ao+8)(SI), Y2; \
	VFMADD231PS Y0, Y2, Y8; \
	VFMADD231PS Y1, Y2, Y9; \
	VBROADCASTSS (ao+12)(SI), Y3; \
	VFMADD231PS Y0, Y3, Y10; \
	VFMADD231PS Y1, Y3, Y11; \
	VBROADCASTSS (ao+16)(SI), Y2; \
	VFMADD231PS Y0, Y2, Y12; \
	VFMADD231PS Y1, Y2, Y13; \
	VBROADCASTSS (ao+20)(SI), Y3; \
	VFMADD231PS Y0, Y3, Y14; \
	VFMADD231PS Y1, Y3, Y15

// STORE writes the row of accumulators lo, hi to the 16 floats at DX.
#define STORE(lo, hi) \
	VMOVUPS lo, (DX); \
	VMOVUPS hi, 32(DX); \
	ADDQ R8, DX

// ADDSTORE adds the row of accumulators lo, hi to the 16 floats at DX.
#define ADDSTORE(lo, hi) \
	VADDPS (DX), lo, lo; \
	VADDPS 32(DX), hi, hi; \
	VMOVUPS lo, (DX); \
	VMOVUPS hi, 32(DX); \
	ADDQ R8, DX

// func gemm6x16(k int, a, b, c *float32, ldc int, add bool)
TEXT ·gemm6x16(SB), NOSPLIT, $0-41
	MOVQ k+0(FP), CX
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DI
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	VXORPS Y8, Y8, Y8
	VXORPS Y9, Y9, Y9
	VXORPS Y10, Y10, Y10
	VXORPS Y11, Y11, Y11
	VXORPS Y12, Y12, Y12
	VXORPS Y13, Y13, Y13
	VXORPS Y14, Y14, Y14
	VXORPS Y15, Y15, Y15
	CMPQ CX, $4
	JLT tail

loop4:
	STEP(0, 0)
	STEP(24, 64)
	STEP(48, 128)
	STEP(72, 192)
	ADDQ $96, SI
	ADDQ $256, DI
	SUBQ $4, CX
	CMPQ CX, $4
	JGE loop4

tail:
	TESTQ CX, CX
	JZ done

loop1:
	STEP(0, 0)
	ADDQ $24, SI
	ADDQ $64, DI
	DECQ CX
	JNZ loop1

done:
	MOVQ c+24(FP), DX
	MOVQ ldc+32(FP), R8
	SHLQ $2, R8
	MOVBLZX add+40(FP), AX
	TESTB AL, AL
	JNZ accumulate
	STORE(Y4, Y5)
	STORE(Y6, Y7)
	STORE(Y8, Y9)
	STORE(Y10, Y11)
	STORE(Y12, Y13)
	STORE(Y14, Y15)
	VZEROUPPER
	RET

accumulate:
	ADDSTORE(Y4, Y5)
	ADDSTORE(Y6, Y7)
	ADDSTORE(Y8, Y9)
	ADDSTORE(Y10, Y11)
	ADDSTORE(Y12, Y13)
	ADDSTORE(Y14, Y15)
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
