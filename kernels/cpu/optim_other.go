//go:build !amd64 || purego

package cpu

// adamVec does nothing where there is no vector path: the loop of
// optim.go runs every element.
func adamVec(p, g, m, v, po, mo, vo []float32, c *[8]float32, wd bool) int { return 0 }
