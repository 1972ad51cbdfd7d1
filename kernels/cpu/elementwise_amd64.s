//go:build amd64 && !purego

#include "textflag.h"

// Elementwise float32 kernels over n elements, n a multiple of 8, eight
// at a time in YMM registers (AVX2): each element gets the very IEEE
// operation the Go loops of binary.go and unary.go give it, so the bits
// are theirs.
//
//	func addVV32(y, a, b *float32, n int)  // and sub, mul, div: y = a op b
//	func relu32(y, x *float32, n int)
//	func sign32(y, x *float32, n int)
//	func addWidened8(acc *float64, x *float32, n int) // acc += float64(x)

// VVARGS loads y to DI, a to SI, b to DX and n, in bytes, to CX; AX = 0
// is the offset.
#define VVARGS \
	MOVQ y+0(FP), DI; \
	MOVQ a+8(FP), SI; \
	MOVQ b+16(FP), DX; \
	MOVQ n+24(FP), CX; \
	SHLQ $2, CX; \
	XORQ AX, AX

// VV4 computes 32 elements at offset AX: y = a op b.
#define VV4(op) \
	VMOVUPS (SI)(AX*1), Y0; \
	VMOVUPS 32(SI)(AX*1), Y1; \
	VMOVUPS 64(SI)(AX*1), Y2; \
	VMOVUPS 96(SI)(AX*1), Y3; \
	op (DX)(AX*1), Y0, Y0; \
	op 32(DX)(AX*1), Y1, Y1; \
	op 64(DX)(AX*1), Y2, Y2; \
	op 96(DX)(AX*1), Y3, Y3; \
	VMOVUPS Y0, (DI)(AX*1); \
	VMOVUPS Y1, 32(DI)(AX*1); \
	VMOVUPS Y2, 64(DI)(AX*1); \
	VMOVUPS Y3, 96(DI)(AX*1)

// VV1 computes 8 elements at offset AX.
#define VV1(op) \
	VMOVUPS (SI)(AX*1), Y0; \
	op (DX)(AX*1), Y0, Y0; \
	VMOVUPS Y0, (DI)(AX*1)

// UARGS loads y to DI, x to SI and n, in bytes, to CX; AX = 0 is the
// offset; Y13 = 0x80000000, Y14 = 0x7fffffff, Y15 = 0x7f800000 in every
// lane.
#define UARGS \
	MOVQ y+0(FP), DI; \
	MOVQ x+8(FP), SI; \
	MOVQ n+16(FP), CX; \
	SHLQ $2, CX; \
	XORQ AX, AX; \
	MOVL $0x80000000, BX; \
	MOVQ BX, X13; \
	VPBROADCASTD X13, Y13; \
	MOVL $0x7fffffff, BX; \
	MOVQ BX, X14; \
	VPBROADCASTD X14, Y14; \
	MOVL $0x7f800000, BX; \
	MOVQ BX, X15; \
	VPBROADCASTD X15, Y15

// RELU1 is relu of the vector in x into y, through t: as Go's max(x, 0),
// 0 for a negative x or -0, a NaN with its sign cleared, x otherwise:
// y = |x| &^ (sign(x) &^ isNaN(x)).
#define RELU1(x, t, y) \
	VPAND x, Y14, y; \
	VPCMPGTD Y15, y, t; \
	VPSRAD $31, x, x; \
	VPANDN x, t, t; \
	VPANDN y, t, y

// func addVV32(y, a, b *float32, n int)
TEXT ·addVV32(SB), NOSPLIT, $0-32
	VVARGS
	LEAQ -128(CX), BX

loop4:
	CMPQ AX, BX
	JGT tail
	VV4(VADDPS)
	ADDQ $128, AX
	JMP loop4

tail:
	CMPQ AX, CX
	JGE done
	VV1(VADDPS)
	ADDQ $32, AX
	JMP tail

done:
	VZEROUPPER
	RET

// func subVV32(y, a, b *float32, n int)
TEXT ·subVV32(SB), NOSPLIT, $0-32
	VVARGS
	LEAQ -128(CX), BX

loop4:
	CMPQ AX, BX
	JGT tail
	VV4(VSUBPS)
	ADDQ $128, AX
	JMP loop4

tail:
	CMPQ AX, CX
	JGE done
	VV1(VSUBPS)
	ADDQ $32, AX
	JMP tail

done:
	VZEROUPPER
	RET

// func mulVV32(y, a, b *float32, n int)
TEXT ·mulVV32(SB), NOSPLIT, $0-32
	VVARGS
	LEAQ -128(CX), BX

loop4:
	CMPQ AX, BX
	JGT tail
	VV4(VMULPS)
	ADDQ $128, AX
	JMP loop4

tail:
	CMPQ AX, CX
	JGE done
	VV1(VMULPS)
	ADDQ $32, AX
	JMP tail

done:
	VZEROUPPER
	RET

// func divVV32(y, a, b *float32, n int)
TEXT ·divVV32(SB), NOSPLIT, $0-32
	VVARGS
	LEAQ -128(CX), BX

loop4:
	CMPQ AX, BX
	JGT tail
	VV4(VDIVPS)
	ADDQ $128, AX
	JMP loop4

tail:
	CMPQ AX, CX
	JGE done
	VV1(VDIVPS)
	ADDQ $32, AX
	JMP tail

done:
	VZEROUPPER
	RET

// func relu32(y, x *float32, n int)
TEXT ·relu32(SB), NOSPLIT, $0-24
	UARGS

loop:
	CMPQ AX, CX
	JGE done
	VMOVUPS (SI)(AX*1), Y0
	RELU1(Y0, Y1, Y2)
	VMOVUPS Y2, (DI)(AX*1)
	ADDQ $32, AX
	JMP loop

done:
	VZEROUPPER
	RET

// func sign32(y, x *float32, n int)
//
// As signFloat: x's sign bit or 1 with it, x itself for ±0 and NaN.
TEXT ·sign32(SB), NOSPLIT, $0-24
	UARGS
	MOVL $0x3f800000, BX
	MOVQ BX, X12
	VPBROADCASTD X12, Y12
	VPXOR Y11, Y11, Y11

loop:
	CMPQ AX, CX
	JGE done
	VMOVUPS (SI)(AX*1), Y0
	VPAND Y0, Y14, Y1      // |x|
	VPCMPEQD Y11, Y1, Y2   // |x| == 0
	VPANDN Y12, Y2, Y3     // 1 where x is not ±0
	VPAND Y0, Y13, Y4      // x's sign
	VPOR Y4, Y3, Y3        // ±1, or ±0
	VPCMPGTD Y15, Y1, Y2   // NaN
	VPAND Y2, Y0, Y4       // x where NaN
	VPANDN Y3, Y2, Y3      // the rest elsewhere
	VPOR Y4, Y3, Y3
	VMOVUPS Y3, (DI)(AX*1)
	ADDQ $32, AX
	JMP loop

done:
	VZEROUPPER
	RET

// func addWidened8(acc *float64, x *float32, n int)
TEXT ·addWidened8(SB), NOSPLIT, $0-24
	MOVQ acc+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ n+16(FP), CX
	SHLQ $2, CX // bytes of x; acc's offset is twice x's
	XORQ AX, AX

loop:
	CMPQ AX, CX
	JGE done
	VCVTPS2PD (SI)(AX*1), Y0
	VCVTPS2PD 16(SI)(AX*1), Y1
	VADDPD (DI)(AX*2), Y0, Y0
	VADDPD 32(DI)(AX*2), Y1, Y1
	VMOVUPD Y0, (DI)(AX*2)
	VMOVUPD Y1, 32(DI)(AX*2)
	ADDQ $32, AX
	JMP loop

done:
	VZEROUPPER
	RET
