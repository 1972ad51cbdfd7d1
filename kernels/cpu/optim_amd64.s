//go:build amd64 && !purego

#include "textflag.h"

// func adam8(n int, p, grad, m, v, po, mo, vo *float32, c *[8]float32, wd bool)
//
// The float32 adam_step of optim.go, 8 elements at a time, n a multiple of
// 8: the same operations in the same order, each rounded once (no fused
// multiply-add). c holds decay, 1-beta1, beta2, 1-beta2, step size,
// sqrt(1-beta2^t), eps and the L2 weight decay, which is added to the
// gradient only if wd. All of a chunk's inputs are read before its
// outputs are written, so outputs may alias inputs.
TEXT ·adam8(SB), NOSPLIT, $0-73
	MOVQ n+0(FP), CX
	MOVQ p+8(FP), AX
	MOVQ grad+16(FP), BX
	MOVQ m+24(FP), DX
	MOVQ v+32(FP), SI
	MOVQ po+40(FP), DI
	MOVQ mo+48(FP), R8
	MOVQ vo+56(FP), R9
	MOVQ c+64(FP), R10
	MOVBQZX wd+72(FP), R11
	VBROADCASTSS 0(R10), Y8   // decay
	VBROADCASTSS 4(R10), Y9   // 1-beta1
	VBROADCASTSS 8(R10), Y10  // beta2
	VBROADCASTSS 12(R10), Y11 // 1-beta2
	VBROADCASTSS 16(R10), Y12 // step size
	VBROADCASTSS 20(R10), Y13 // sqrt(1-beta2^t)
	VBROADCASTSS 24(R10), Y14 // eps
	VBROADCASTSS 28(R10), Y15 // L2 weight decay
	SHLQ $2, CX
	XORQ R12, R12

loop:
	CMPQ R12, CX
	JGE  done
	VMOVUPS (AX)(R12*1), Y0 // p
	VMOVUPS (BX)(R12*1), Y1 // g
	TESTQ   R11, R11
	JZ      nowd
	VMULPS  Y15, Y0, Y2 // l2*p
	VADDPS  Y2, Y1, Y1  // g += l2*p

nowd:
	VMULPS  Y8, Y0, Y0      // p *= decay
	VMOVUPS (DX)(R12*1), Y2 // m
	VSUBPS  Y2, Y1, Y3      // g - m
	VMULPS  Y9, Y3, Y3      // (1-beta1)*(g - m)
	VADDPS  Y3, Y2, Y2      // m' = m + (1-beta1)*(g - m)
	VMOVUPS (SI)(R12*1), Y4 // v
	VMULPS  Y10, Y4, Y4     // v*beta2
	VMULPS  Y11, Y1, Y5     // (1-beta2)*g
	VMULPS  Y1, Y5, Y5      // (1-beta2)*g*g
	VADDPS  Y5, Y4, Y4      // v' = v*beta2 + (1-beta2)*g*g
	VSQRTPS Y4, Y6
	VDIVPS  Y13, Y6, Y6     // sqrt(v')/sqrt(1-beta2^t)
	VADDPS  Y14, Y6, Y6     // denom
	VDIVPS  Y6, Y2, Y7      // m'/denom
	VMULPS  Y12, Y7, Y7     // step*(m'/denom)
	VSUBPS  Y7, Y0, Y0      // p'
	VMOVUPS Y0, (DI)(R12*1)
	VMOVUPS Y2, (R8)(R12*1)
	VMOVUPS Y4, (R9)(R12*1)
	ADDQ    $32, R12
	JMP     loop

done:
	VZEROUPPER
	RET
