package cpu_test

import (
	"testing"

	"github.com/jetfabric/jetfabric/kernels/cpu"
	"github.com/jetfabric/jetfabric/kernels/kernelstest"
)

func TestConformance(t *testing.T) {
	kernelstest.RunAll(t, cpu.New(), kernelstest.RequireAll(), kernelstest.Parallel())
}
