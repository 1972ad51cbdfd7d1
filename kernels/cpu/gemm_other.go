//go:build !amd64 || purego

package cpu

// matmulF32 is the float32 matmul: the pure-Go packed product.
func matmulF32(p *mm, c, a, b []float32) {
	matmulFloat(p, c, a, b, micro2x4)
}
