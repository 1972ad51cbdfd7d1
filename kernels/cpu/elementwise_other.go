//go:build !amd64 || purego

package cpu

// The float32 kernels that amd64 runs on vectors (elementwise_amd64.go):
// here the Go loops.

func addF32(y, a, b []float32, m mode) { addK(y, a, b, m) }
func subF32(y, a, b []float32, m mode) { subK(y, a, b, m) }
func mulF32(y, a, b []float32, m mode) { mulK(y, a, b, m) }
func divF32(y, a, b []float32, m mode) { divK(y, a, b, m) }

func reluF32(x, y []float32) {
	for i, v := range x[:len(y)] {
		y[i] = max(v, 0)
	}
}

func signF32(x, y []float32) { signFloat(x[:len(y)], y) }

// addWidened leaves every element to the caller's loop.
func addWidened(acc []float64, x []float32) int { return 0 }
