//go:build cgo && linux

package cuda

import (
	"github.com/jetfabric/jetfabric/kernels"
)

// blasWorkspace is the cuBLAS workspace each backend gives its handle.
const blasWorkspace = 32 << 20

// blasState is the backend's cuBLAS handle, made on first use, bound to
// the backend's stream with a workspace from the backend.
type blasState struct {
	h     blasHandle
	ws    uint64
	err   error
	tried bool
}

func (s *blasState) handle(b *Backend) (blasHandle, error) {
	if s.tried {
		return s.h, s.err
	}
	s.tried = true
	if s.err = loadCUBLAS(); s.err != nil {
		return nil, s.err
	}
	h, err := blasCreate()
	if err != nil {
		s.err = err
		return nil, err
	}
	s.h = h
	if s.err = blasSetStream(h, b.stream); s.err != nil {
		return nil, s.err
	}
	if s.ws, s.err = memAlloc(blasWorkspace); s.err != nil {
		return nil, s.err
	}
	if s.err = blasSetWorkspace(h, s.ws, blasWorkspace); s.err != nil {
		return nil, s.err
	}
	return h, nil
}

func (s *blasState) close(*Backend) {
	if s.h != nil {
		_ = blasDestroy(s.h)
	}
	if s.ws != 0 {
		_ = memFree(s.ws)
	}
	*s = blasState{}
}

// blasTypes maps a dtype to cuBLAS's data and compute types.
func (b *Backend) blasTypes(dt kernels.DType) (data, compute int, ok bool) {
	switch dt {
	case kernels.Float32:
		if b.opts.tf32 {
			return dataF32, computeF32TF32, true
		}
		return dataF32, computeF32, true
	case kernels.Float16:
		return dataF16, computeF32, true
	case kernels.BFloat16:
		return dataBF16, computeF32, true
	case kernels.Float64:
		return dataF64, computeF64, true
	}
	return 0, 0, false
}

// matmul queues a (batched, broadcast) matrix product: row-major C = A*B
// is column-major C' = B'*A', so cuBLAS gets B first.
func (b *Backend) matmul(in []kernels.Meta, out kernels.Meta, inB []*buffer, outB *buffer) error {
	if out.Numel() == 0 {
		return nil
	}
	p, err := planMatmul(in[0].Shape, in[1].Shape)
	if err != nil {
		return err
	}
	dt := out.DType
	es := uint64(dt.Size())
	if p.k == 0 {
		b.queueMemset(outB.ptr, 0, out.Bytes())
		return nil
	}
	if data, compute, ok := b.blasTypes(dt); ok {
		if h, err := b.blasHandle(); err == nil {
			for _, c := range p.calls {
				g := gemmArgs{
					m: p.n, n: p.m, k: p.k,
					a: inB[1].ptr + uint64(c[1])*es, lda: p.n, sa: p.sB,
					b: inB[0].ptr + uint64(c[0])*es, ldb: p.k, sb: p.sA,
					c: outB.ptr + uint64(c[2])*es, ldc: p.n, sc: p.sC,
					count: p.count, dtype: data, compute: compute,
				}
				b.queueGemm(h, g)
			}
			return nil
		}
	}
	spec := mmSpec{dt: dt}
	f, err := b.function(spec.key(), func() (string, error) { return spec.source(), nil })
	if err != nil {
		return err
	}
	// gridDim.y and gridDim.z are at most 65535: rows and batch in chunks.
	const maxRows, maxBatch = 65535 * 16, 65535
	for _, c := range p.calls {
		for z := 0; z < p.count; z += maxBatch {
			nz := min(maxBatch, p.count-z)
			for r := 0; r < p.m; r += maxRows {
				nr := min(maxRows, p.m-r)
				var a kargs
				a.ptr(inB[0].ptr + uint64(c[0]+z*p.sA+r*p.k)*es)
				a.ptr(inB[1].ptr + uint64(c[1]+z*p.sB)*es)
				a.ptr(outB.ptr + uint64(c[2]+z*p.sC+r*p.n)*es)
				a.i64(nr)
				a.i64(p.n)
				a.i64(p.k)
				a.i64(p.sA)
				a.i64(p.sB)
				a.i64(p.sC)
				grid := [3]uint32{uint32(ceilDiv(p.n, 16)), uint32(ceilDiv(nr, 16)), uint32(nz)}
				b.queueLaunch(f, grid, 256, &a)
			}
		}
	}
	return nil
}
