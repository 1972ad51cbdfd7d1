//go:build amd64 && !purego

package cpu

// The float32 kernels of elementwise_amd64.s, over n elements, n a
// multiple of 8.

//go:noescape
func addVV32(y, a, b *float32, n int)

//go:noescape
func subVV32(y, a, b *float32, n int)

//go:noescape
func mulVV32(y, a, b *float32, n int)

//go:noescape
func divVV32(y, a, b *float32, n int)

//go:noescape
func relu32(y, x *float32, n int)

//go:noescape
func addWidened8(acc *float64, x *float32, n int)

//go:noescape
func sign32(y, x *float32, n int)

func init() {
	if hasAVX2FMA {
		vecGrain = 8
	}
}

// vv32 runs k, one of the kernels above, over the first elements of y, a
// and b that make a multiple of 8 (all of them have at least len(y)) and
// returns how many it did: the caller's loop does the rest.
func vv32(k func(y, a, b *float32, n int), y, a, b []float32) int {
	n := len(y) &^ 7
	if !hasAVX2FMA || n == 0 {
		return 0
	}
	_, _ = a[n-1], b[n-1]
	k(&y[0], &a[0], &b[0], n)
	return n
}

// unary32 is vv32 for a unary kernel.
func unary32(k func(y, x *float32, n int), y, x []float32) int {
	n := len(y) &^ 7
	if !hasAVX2FMA || n == 0 {
		return 0
	}
	_ = x[n-1]
	k(&y[0], &x[0], n)
	return n
}

// The binary float32 ops whose same-shape runs take the vector kernels.
func addF32(y, a, b []float32, m mode) {
	if m == vv {
		n := vv32(addVV32, y, a, b)
		y, a, b = y[n:], a[n:], b[n:]
	}
	addK(y, a, b, m)
}

func subF32(y, a, b []float32, m mode) {
	if m == vv {
		n := vv32(subVV32, y, a, b)
		y, a, b = y[n:], a[n:], b[n:]
	}
	subK(y, a, b, m)
}

func mulF32(y, a, b []float32, m mode) {
	if m == vv {
		n := vv32(mulVV32, y, a, b)
		y, a, b = y[n:], a[n:], b[n:]
	}
	mulK(y, a, b, m)
}

func divF32(y, a, b []float32, m mode) {
	if m == vv {
		n := vv32(divVV32, y, a, b)
		y, a, b = y[n:], a[n:], b[n:]
	}
	divK(y, a, b, m)
}

// reluF32 and signF32 run relu and sign of float32 with the vector
// kernels, the last elements with the Go loops.
func reluF32(x, y []float32) {
	n := unary32(relu32, y, x)
	for i, v := range x[n:len(y)] {
		y[n+i] = max(v, 0)
	}
}

func signF32(x, y []float32) {
	n := unary32(sign32, y, x)
	signFloat(x[n:len(y)], y[n:])
}

// addWidened adds x's elements, widened to float64, to acc's, the first
// that make a multiple of 8 of len(acc) (x holds as many), on vectors, and
// returns how many: a column sum's row, with the bits of the Go loop.
func addWidened(acc []float64, x []float32) int {
	n := len(acc) &^ 7
	if !hasAVX2FMA || n == 0 {
		return 0
	}
	_ = x[n-1]
	addWidened8(&acc[0], &x[0], n)
	return n
}
