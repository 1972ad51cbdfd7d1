package cpu_test

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/kernels/cpu"
)

func Example() {
	b := cpu.New()
	// x = arange(0, 6) reshaped to 2×3, then the sum of each row.
	x, _ := b.Alloc(6 * 4)
	y, _ := b.Alloc(2 * 4)
	xt := &kernels.Tensor{Meta: kernels.Meta{DType: kernels.Float32, Shape: []int{6}}, Buf: x}
	if err := b.Exec(&kernels.Op{Name: kernels.OpArange, Stop: 6, Step: 1}, nil, []*kernels.Tensor{xt}); err != nil {
		panic(err)
	}
	xt.Shape = []int{2, 3} // contiguous, so a reshape is only a new meta
	yt := &kernels.Tensor{Meta: kernels.Meta{DType: kernels.Float32, Shape: []int{2}}, Buf: y}
	if err := b.Exec(&kernels.Op{Name: kernels.OpSum, Axes: []int{-1}}, []*kernels.Tensor{xt}, []*kernels.Tensor{yt}); err != nil {
		panic(err)
	}
	out := make([]byte, 8)
	_ = b.Download(out, y)
	fmt.Println(math.Float32frombits(binary.LittleEndian.Uint32(out)), math.Float32frombits(binary.LittleEndian.Uint32(out[4:])))
	// Output: 3 12
}
