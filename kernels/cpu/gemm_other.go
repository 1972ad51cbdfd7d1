//go:build !amd64 || purego

package cpu

// matmulF32 is the float32 matmul: the pure-Go packed product.
func matmulF32(p *mm, c, a, b []float32) {
	matmulFloat(p, c, a, b, micro2x4)
}

// matmulF64 is the float64 matmul: the pure-Go packed product.
func matmulF64(p *mm, c, a, b []float64) {
	matmulFloat(p, c, a, b, micro2x4f64)
}
