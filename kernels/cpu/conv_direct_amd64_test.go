//go:build amd64 && !purego

package cpu

import "testing"

// TestConvDirectAVX2 runs TestConvDirect's checks with the AVX2 micro-
// kernel, whose blocks (6×16) are not AVX-512's (12×32).
func TestConvDirectAVX2(t *testing.T) {
	if !hasAVX2FMA {
		t.Skip("no AVX2 and FMA")
	}
	directForce = &kern6x16
	defer func() { directForce = nil }()
	checkConvDirect(t)
}
