package worker

import (
	"errors"
	"fmt"

	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/kernels/cpu"
)

// hostFallback runs an op on the host CPU for a device whose backend
// declines it (kernels.ErrNotImplemented): its inputs are copied to host
// memory, the CPU backend computes, and the outputs are copied back into the
// device's buffers. Results are the CPU backend's bits. It is slow for large
// tensors, but every op of the op set runs on every device.
func (d *device) hostFallback(op *kernels.Op, in, out []*kernels.Tensor) error {
	if _, isCPU := d.cfg.Backend.(*cpu.Backend); isCPU {
		return fmt.Errorf("%w: %s", kernels.ErrNotImplemented, op.Name)
	}
	if d.host == nil {
		d.host = cpu.New()
	}
	if !d.fellBack[op.Name] {
		if d.fellBack == nil {
			d.fellBack = map[string]bool{}
		}
		d.fellBack[op.Name] = true
		d.w.logf("worker: %s: %s runs on the host CPU (the %s backend does not implement it)", d.cfg.Name, op.Name, d.cfg.Backend.Name())
	}
	h := d.host
	var bufs []kernels.Buffer
	defer func() {
		for _, b := range bufs {
			h.Free(b)
		}
	}()
	hostTensor := func(t *kernels.Tensor, fill bool) (*kernels.Tensor, error) {
		b, err := h.Alloc(t.Bytes())
		if err != nil {
			return nil, err
		}
		bufs = append(bufs, b)
		if fill {
			if err := d.cfg.Backend.Download(b.(*cpu.Buffer).Host()[:t.Bytes()], t.Buf); err != nil {
				return nil, err
			}
		}
		return &kernels.Tensor{Meta: t.Meta, Buf: b}, nil
	}
	hin := make([]*kernels.Tensor, len(in))
	for i, t := range in {
		var err error
		if hin[i], err = hostTensor(t, true); err != nil {
			return err
		}
	}
	hout := make([]*kernels.Tensor, len(out))
	for i, t := range out {
		var err error
		if hout[i], err = hostTensor(t, false); err != nil {
			return err
		}
	}
	if err := h.Exec(op, hin, hout); err != nil {
		return err
	}
	for i, t := range out {
		if err := d.cfg.Backend.Upload(t.Buf, hout[i].Buf.(*cpu.Buffer).Host()[:t.Bytes()]); err != nil {
			return err
		}
	}
	return nil
}

// execOn runs op on the device's backend, or on the host if the backend
// declines it.
func (d *device) execOn(op *kernels.Op, in, out []*kernels.Tensor) error {
	err := d.cfg.Backend.Exec(op, in, out)
	if errors.Is(err, kernels.ErrNotImplemented) {
		return d.hostFallback(op, in, out)
	}
	return err
}
