//go:build amd64 && !purego

package cpu

// adam8 is the float32 adam_step on n elements, n a multiple of 8, with
// AVX (optim_amd64.s): the bits of the loop in optim.go.
//
//go:noescape
func adam8(n int, p, grad, m, v, po, mo, vo *float32, c *[8]float32, wd bool)

// adamVec runs the float32 adam_step (m by lerp from m, the usual case)
// on the longest prefix whose length is a multiple of 8, where the CPU
// has AVX, and returns that length.
func adamVec(p, g, m, v, po, mo, vo []float32, c *[8]float32, wd bool) int {
	n := len(po) &^ 7
	if !hasAVX2FMA || n == 0 {
		return 0
	}
	_, _, _, _, _, _ = p[n-1], g[n-1], m[n-1], v[n-1], mo[n-1], vo[n-1]
	adam8(n, &p[0], &g[0], &m[0], &v[0], &po[0], &mo[0], &vo[0], c, wd)
	return n
}
