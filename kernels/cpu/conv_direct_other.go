//go:build !amd64 || purego

package cpu

import "github.com/jetfabric/jetfabric/kernels"

// directOff turns the direct path off, for tests that compare the paths;
// there is no direct path here.
var directOff = true

// directKern reports that there is no micro-kernel for the direct path.
func directKern() (struct{}, bool) { return struct{}{}, false }

// direct reports false: there is no direct path here.
func (p *convPlan) direct(string) bool { return false }

// runConvDirect reports false: without the amd64 micro-kernels every
// convolution takes the column-matrix path.
func runConvDirect(*convPlan, string, []*kernels.Tensor, []*kernels.Tensor, bool) bool {
	return false
}
