package worker

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/subjects"
)

// A checkpoint is a device's every session at one stream sequence: each
// session's seed, unreported errors, failed ids and tensors. The tensors'
// bytes and a manifest are written as one object in FABRIC_CKPT; then the
// key ckpt.<device> is written, fenced on the device lease, naming the
// object; then the device's frames up to that sequence are purged from
// FABRIC_OPS and the previous checkpoint object is deleted. A new owner
// restores the last committed checkpoint and replays the frames after it.

// checkpointRef is the value of ckpt.<device>.
type checkpointRef struct {
	Device string    `json:"device"`
	Seq    uint64    `json:"seq"`
	Object string    `json:"object"`
	SHA256 string    `json:"sha256"`
	Size   int64     `json:"size"`
	Worker string    `json:"worker"`
	Time   time.Time `json:"time"`
}

type ckptManifest struct {
	V        int           `cbor:"v"`
	Device   string        `cbor:"device"`
	Seq      uint64        `cbor:"seq"`
	Sessions []ckptSession `cbor:"sessions"`
}

type ckptSession struct {
	ID      string        `cbor:"id"`
	Seed    uint64        `cbor:"seed"`
	Pending []codec.Error `cbor:"pending,omitempty"`
	Tensors []ckptTensor  `cbor:"tensors,omitempty"`
	Failed  []ckptFailed  `cbor:"failed,omitempty"`
}

type ckptTensor struct {
	ID     uint64 `cbor:"id"`
	DType  uint8  `cbor:"dtype"`
	Shape  []int  `cbor:"shape"`
	Offset int64  `cbor:"off"`
}

type ckptFailed struct {
	ID  uint64      `cbor:"id"`
	Err codec.Error `cbor:"err"`
}

const ckptMagic = "JFCKPT01"

// checkpoint writes and commits a checkpoint at the last applied sequence.
// It runs on the device loop. It returns the reference committed, or nil
// when nothing was applied since the last checkpoint.
func (d *device) checkpoint(ctx context.Context) (*checkpointRef, error) {
	seq := d.applied.Load()
	if seq == 0 || seq == d.ckptSeq {
		return nil, nil
	}
	start := time.Now()
	man := ckptManifest{V: 1, Device: d.cfg.Name, Seq: seq}
	total := 0
	for _, s := range d.sessions {
		for _, e := range s.tensors {
			if e.t != nil {
				total += e.t.Bytes()
			}
		}
	}
	// Every tensor is downloaded straight into its place in one buffer.
	data := make([]byte, total)
	off := 0
	b := d.cfg.Backend
	for _, s := range d.sessions {
		cs := ckptSession{ID: s.id, Seed: s.seed, Pending: s.pending, Tensors: make([]ckptTensor, 0, len(s.tensors))}
		for id, e := range s.tensors {
			if e.fail != nil {
				cs.Failed = append(cs.Failed, ckptFailed{ID: id, Err: *e.fail})
				continue
			}
			n := e.t.Bytes()
			if err := b.Download(data[off:off+n], e.t.Buf); err != nil {
				return nil, fmt.Errorf("worker: checkpoint %s: download tensor %d: %w", d.cfg.Name, id, err)
			}
			cs.Tensors = append(cs.Tensors, ckptTensor{ID: id, DType: uint8(e.t.DType), Shape: e.t.Shape, Offset: int64(off)})
			off += n
		}
		man.Sessions = append(man.Sessions, cs)
	}
	mb, err := codec.Marshal(codec.CBOR, &man)
	if err != nil {
		return nil, fmt.Errorf("worker: checkpoint %s: manifest: %w", d.cfg.Name, err)
	}
	blob := make([]byte, 0, len(ckptMagic)+8+len(mb)+len(data))
	blob = append(blob, ckptMagic...)
	blob = binary.LittleEndian.AppendUint64(blob, uint64(len(mb)))
	blob = append(blob, mb...)
	blob = append(blob, data...)
	name := subjects.CheckpointObject(d.cfg.Name, seq)
	info, err := d.w.ckpt.Put(ctx, name, blob, map[string]string{"device": d.cfg.Name, "seq": fmt.Sprint(seq)})
	if err != nil {
		return nil, fmt.Errorf("worker: checkpoint %s: store: %w", d.cfg.Name, err)
	}
	ref := &checkpointRef{Device: d.cfg.Name, Seq: seq, Object: name, SHA256: info.SHA256, Size: info.Size, Worker: d.w.cfg.ID, Time: time.Now().UTC()}
	rb, _ := json.Marshal(ref)
	if err := d.lease.write(ctx, subjects.CheckpointKey(d.cfg.Name), rb); err != nil {
		_ = d.w.ckpt.Delete(ctx, name)
		return nil, err
	}
	// Committed: the frames it covers and the previous object can go.
	if stream, err := d.w.js.Stream(ctx, d.w.names.OpsStream()); err == nil {
		if err := stream.Purge(ctx, jetstream.WithPurgeSubject(d.w.names.OpsDevice(d.cfg.Name)), jetstream.WithPurgeSequence(seq+1)); err != nil {
			d.w.logf("worker: %s: purge frames below %d: %v", d.cfg.Name, seq+1, err)
		}
	}
	if d.ckptObject != "" && d.ckptObject != name {
		if err := d.w.ckpt.Delete(ctx, d.ckptObject); err != nil {
			d.w.logf("worker: %s: delete old checkpoint %s: %v", d.cfg.Name, d.ckptObject, err)
		}
	}
	d.ckptSeq, d.ckptObject = seq, name
	d.dropConsumed(ctx)
	took := time.Since(start)
	d.m.checkpoint(took, info.Size)
	d.w.logf("worker: %s: checkpoint at sequence %d: %d sessions, %d bytes in %v", d.cfg.Name, seq, len(man.Sessions), info.Size, took.Round(time.Millisecond))
	return ref, nil
}

// restore loads the device's last committed checkpoint, if any, and returns
// the sequence it covers.
func (d *device) restore(ctx context.Context) (uint64, error) {
	e, err := d.w.ctrl.Get(ctx, subjects.CheckpointKey(d.cfg.Name))
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return 0, nil
	} else if err != nil {
		return 0, fmt.Errorf("worker: %s: read checkpoint: %w", d.cfg.Name, err)
	}
	var ref checkpointRef
	if err := json.Unmarshal(e.Value(), &ref); err != nil {
		return 0, fmt.Errorf("worker: %s: checkpoint reference: %w", d.cfg.Name, err)
	}
	blob, info, err := d.w.ckpt.Get(ctx, ref.Object)
	if err != nil {
		return 0, fmt.Errorf("worker: %s: checkpoint object %s: %w", d.cfg.Name, ref.Object, err)
	}
	if ref.SHA256 != "" && info.SHA256 != ref.SHA256 {
		return 0, fmt.Errorf("worker: %s: checkpoint object %s has digest %s, committed %s", d.cfg.Name, ref.Object, info.SHA256, ref.SHA256)
	}
	if len(blob) < len(ckptMagic)+8 || string(blob[:len(ckptMagic)]) != ckptMagic {
		return 0, fmt.Errorf("worker: %s: checkpoint object %s is not a checkpoint", d.cfg.Name, ref.Object)
	}
	n := binary.LittleEndian.Uint64(blob[len(ckptMagic):])
	body := blob[len(ckptMagic)+8:]
	if n > uint64(len(body)) {
		return 0, fmt.Errorf("worker: %s: checkpoint %s: manifest of %d bytes in %d", d.cfg.Name, ref.Object, n, len(body))
	}
	var man ckptManifest
	if err := codec.Unmarshal(codec.CBOR, body[:n], &man); err != nil {
		return 0, fmt.Errorf("worker: %s: checkpoint %s: %w", d.cfg.Name, ref.Object, err)
	}
	data := body[n:]
	now := time.Now()
	for _, cs := range man.Sessions {
		s := newSession(cs.ID)
		s.seed, s.pending, s.last = cs.Seed, cs.Pending, now
		for _, f := range cs.Failed {
			err := f.Err
			s.tensors[f.ID] = entry{fail: &err}
		}
		for _, ct := range cs.Tensors {
			m := kernels.Meta{DType: kernels.DType(ct.DType), Shape: ct.Shape}
			end := ct.Offset + int64(m.Bytes())
			if !m.DType.Valid() || ct.Offset < 0 || end > int64(len(data)) {
				return 0, fmt.Errorf("worker: %s: checkpoint %s: tensor %d out of bounds", d.cfg.Name, ref.Object, ct.ID)
			}
			buf, err := d.cfg.Backend.Alloc(m.Bytes())
			if err != nil {
				return 0, fmt.Errorf("worker: %s: restore tensor %d: %w", d.cfg.Name, ct.ID, err)
			}
			if err := d.cfg.Backend.Upload(buf, data[ct.Offset:end]); err != nil {
				return 0, fmt.Errorf("worker: %s: restore tensor %d: %w", d.cfg.Name, ct.ID, err)
			}
			s.tensors[ct.ID] = entry{t: &kernels.Tensor{Meta: m, Buf: buf}}
			s.bytes += int64(buf.Bytes())
			d.mem.held.Add(int64(buf.Bytes()))
		}
		d.sessions[cs.ID] = s
	}
	d.sessionCount.Store(int64(len(d.sessions)))
	d.ckptSeq, d.ckptObject = man.Seq, ref.Object
	return man.Seq, nil
}
