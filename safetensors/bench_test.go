package safetensors_test

import (
	"bytes"
	"fmt"
	"io"
	"testing"

	"github.com/jetfabric/jetfabric/safetensors"
)

// benchTensors is a model-like file: n tensors sharing size bytes.
func benchTensors(n, size int) []safetensors.Tensor {
	ts := make([]safetensors.Tensor, n)
	per := size / n / 4
	for i := range ts {
		ts[i] = safetensors.Tensor{Name: fmt.Sprintf("layers.%d.weight", i), DType: safetensors.F32, Shape: []int{per}, Data: make([]byte, 4*per)}
	}
	return ts
}

func BenchmarkEncode(b *testing.B) {
	for _, c := range []struct{ n, size int }{{4, 1 << 20}, {256, 16 << 20}} {
		b.Run(fmt.Sprintf("tensors=%d/bytes=%d", c.n, c.size), func(b *testing.B) {
			ts := benchTensors(c.n, c.size)
			b.SetBytes(int64(c.size))
			for b.Loop() {
				if err := safetensors.Encode(io.Discard, ts, map[string]string{"format": "pt"}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkDecode(b *testing.B) {
	for _, c := range []struct{ n, size int }{{4, 1 << 20}, {256, 16 << 20}} {
		var buf bytes.Buffer
		if err := safetensors.Encode(&buf, benchTensors(c.n, c.size), nil); err != nil {
			b.Fatal(err)
		}
		file := buf.Bytes()
		b.Run(fmt.Sprintf("Decode/tensors=%d/bytes=%d", c.n, c.size), func(b *testing.B) {
			b.SetBytes(int64(len(file)))
			for b.Loop() {
				if _, err := safetensors.Decode(file); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("Read/tensors=%d/bytes=%d", c.n, c.size), func(b *testing.B) {
			b.SetBytes(int64(len(file)))
			for b.Loop() {
				if _, err := safetensors.Read(bytes.NewReader(file)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
