package codec

import (
	"fmt"
	"time"
)

// Version is the protocol version this build writes and reads.
const Version = 1

// Frame is one message on an op subject: a batch of ops for one session,
// executed in order. A frame's position in the ops stream plus an op's index
// in the frame is that op's identity.
type Frame struct {
	V   int  `cbor:"v" json:"v"`
	Ops []Op `cbor:"ops" json:"ops"`
}

// Op is one operation. Op names the operation; Out lists the tensor ids it
// produces and In the ids it consumes, both minted by the client and unique
// within a session. The other fields are attributes; which of them an op
// reads is listed in docs/PROTOCOL.md.
type Op struct {
	Op  string   `cbor:"op" json:"op"`
	Out []uint64 `cbor:"out,omitempty" json:"out,omitempty"`
	In  []uint64 `cbor:"in,omitempty" json:"in,omitempty"`
	// Tag is chosen by the client on read and sync ops and echoed in the
	// Result so the client can match replies.
	Tag uint64 `cbor:"tag,omitempty" json:"tag,omitempty"`

	DType    string `cbor:"dtype,omitempty" json:"dtype,omitempty"`
	Shape    []int  `cbor:"shape,omitempty" json:"shape,omitempty"`
	Axes     []int  `cbor:"axes,omitempty" json:"axes,omitempty"`
	Keepdims bool   `cbor:"keepdims,omitempty" json:"keepdims,omitempty"`
	Perm     []int  `cbor:"perm,omitempty" json:"perm,omitempty"`
	// Axis is the axis of softmax and log_softmax (-1: the last).
	Axis int `cbor:"axis,omitempty" json:"axis,omitempty"`
	// Correction is subtracted from the count in var's divisor (1: sample
	// variance).
	Correction int `cbor:"correction,omitempty" json:"correction,omitempty"`

	Value float64 `cbor:"value,omitempty" json:"value,omitempty"`
	Start float64 `cbor:"start,omitempty" json:"start,omitempty"`
	Stop  float64 `cbor:"stop,omitempty" json:"stop,omitempty"`
	Step  float64 `cbor:"step,omitempty" json:"step,omitempty"`
	Low   float64 `cbor:"low,omitempty" json:"low,omitempty"`
	High  float64 `cbor:"high,omitempty" json:"high,omitempty"`
	Mean  float64 `cbor:"mean,omitempty" json:"mean,omitempty"`
	Std   float64 `cbor:"std,omitempty" json:"std,omitempty"`
	Seed  uint64  `cbor:"seed,omitempty" json:"seed,omitempty"`

	// Starts, Ends and Steps are slice's per-axis bounds and strides
	// (Python slicing: negative values count from the end, bounds clamp,
	// missing trailing axes are taken whole).
	Starts []int `cbor:"starts,omitempty" json:"starts,omitempty"`
	Ends   []int `cbor:"ends,omitempty" json:"ends,omitempty"`
	Steps  []int `cbor:"steps,omitempty" json:"steps,omitempty"`
	// Pads is pad's widths: before and after, for each axis in turn.
	Pads []int `cbor:"pads,omitempty" json:"pads,omitempty"`
	// Sizes is split's output sizes along axis.
	Sizes []int `cbor:"sizes,omitempty" json:"sizes,omitempty"`
	// K is the diagonal of tril, triu and eye (0: the main one).
	K int `cbor:"k,omitempty" json:"k,omitempty"`
	// Depth is one_hot's number of classes.
	Depth int `cbor:"depth,omitempty" json:"depth,omitempty"`
	// Eps is added to the variance by layer_norm and rms_norm (absent or
	// 0: 1e-5), and to adam_step's denominator.
	Eps float64 `cbor:"eps,omitempty" json:"eps,omitempty"`
	// P is bernoulli's probability of a 1.
	P float64 `cbor:"p,omitempty" json:"p,omitempty"`
	// Num is linspace's number of points.
	Num int `cbor:"num,omitempty" json:"num,omitempty"`
	// N and M are eye's rows and columns (M absent: N).
	N int `cbor:"n,omitempty" json:"n,omitempty"`
	M int `cbor:"m,omitempty" json:"m,omitempty"`

	// Stride, Padding and Dilation are [h, w] window attributes of conv2d,
	// its gradients and the pools (absent: stride [1, 1], for pools the
	// kernel; padding [0, 0]; dilation [1, 1]).
	Stride   []int `cbor:"stride,omitempty" json:"stride,omitempty"`
	Padding  []int `cbor:"padding,omitempty" json:"padding,omitempty"`
	Dilation []int `cbor:"dilation,omitempty" json:"dilation,omitempty"`
	// Groups is conv2d's channel groups (absent or 0: 1).
	Groups int `cbor:"groups,omitempty" json:"groups,omitempty"`
	// Kernel is a pool's window [kh, kw].
	Kernel []int `cbor:"kernel,omitempty" json:"kernel,omitempty"`

	// LR, Beta1, Beta2, WeightDecay, Decoupled and T are adam_step's
	// learning rate, moment decay rates, weight decay (AdamW's when
	// decoupled) and step (from 1); it reads Eps too, with no default.
	// sgd_step reads LR, WeightDecay, Momentum, Dampening and Nesterov.
	LR          float64 `cbor:"lr,omitempty" json:"lr,omitempty"`
	Beta1       float64 `cbor:"beta1,omitempty" json:"beta1,omitempty"`
	Beta2       float64 `cbor:"beta2,omitempty" json:"beta2,omitempty"`
	WeightDecay float64 `cbor:"weight_decay,omitempty" json:"weight_decay,omitempty"`
	Momentum    float64 `cbor:"momentum,omitempty" json:"momentum,omitempty"`
	Dampening   float64 `cbor:"dampening,omitempty" json:"dampening,omitempty"`
	Decoupled   bool    `cbor:"decoupled,omitempty" json:"decoupled,omitempty"`
	Nesterov    bool    `cbor:"nesterov,omitempty" json:"nesterov,omitempty"`
	T           int     `cbor:"t,omitempty" json:"t,omitempty"`

	// Data is an upload's bytes: contiguous, row-major, little-endian.
	Data []byte `cbor:"data,omitempty" json:"data,omitempty"`
	// Values is an upload's elements as numbers, for clients that cannot
	// easily produce little-endian bytes (JSON). Data wins if both are set.
	Values []float64 `cbor:"values,omitempty" json:"values,omitempty"`
	// Object names an object in the transfer bucket holding an upload's
	// bytes, for uploads too large to travel inline.
	Object string `cbor:"object,omitempty" json:"object,omitempty"`
	// NUID, with Object, is the token of the object's chunk subject
	// ($O.<bucket>.C.<nuid>) when the uploader sends the op while it is
	// still writing the object: the worker copies the chunks as they are
	// stored and checks them against the object's meta at the end.
	NUID string `cbor:"nuid,omitempty" json:"nuid,omitempty"`
	// Pieces, on an upload with NUID, says the object comes as that many
	// pieces (2 to 64) written in parallel: piece i, the bytes from
	// i*size/pieces to (i+1)*size/pieces (integer division), is the object
	// <Object>.<i> on the chunk subject token <NUID>-<i>. On a read it is the most pieces the reader
	// takes a large result in (absent: one object).
	Pieces int `cbor:"pieces,omitempty" json:"pieces,omitempty"`

	// Transfer is the id of a transfer (expose, import): 32 hex digits
	// (128 random bits) minted by the client, never reused.
	Transfer string `cbor:"transfer,omitempty" json:"transfer,omitempty"`
	// Reads bounds how many imports may read an exposed tensor (default 1).
	Reads int `cbor:"reads,omitempty" json:"reads,omitempty"`
	// TimeoutMS bounds how long an import or a collective waits for its
	// peers (default 60000).
	TimeoutMS int `cbor:"timeout_ms,omitempty" json:"timeout_ms,omitempty"`
	// Group, Rank and Size place a collective op: the group id (32 hex
	// digits, the same on every rank), this rank, and the number of ranks.
	Group string `cbor:"group,omitempty" json:"group,omitempty"`
	Rank  int    `cbor:"rank,omitempty" json:"rank,omitempty"`
	Size  int    `cbor:"size,omitempty" json:"size,omitempty"`
	// Root is the rank a broadcast sends from.
	Root int `cbor:"root,omitempty" json:"root,omitempty"`
	// Reduce is a collective's reduction: sum (default), mean, max or min;
	// and cross_entropy's: mean (default), sum or none.
	Reduce string `cbor:"reduce,omitempty" json:"reduce,omitempty"`
	// Algo is an all_reduce's algorithm: "scatter" (every rank reduces
	// its own slice, then every rank gathers the reduced slices), "direct"
	// (every rank reads every other's tensor, in one round) or "naive"
	// (gather to rank 0, reduce there, fetch from it). Empty: direct for
	// two ranks or up to 1 MiB, scatter otherwise.
	Algo string `cbor:"algo,omitempty" json:"algo,omitempty"`

	// Graph, Base and Scalars are a replay's: the graph's name (the
	// SHA-256 of its definition, 64 lower-case hex digits), the first of
	// the ids reserved for the graph's internal tensors, and the values
	// bound to its scalar placeholders (see Graph).
	Graph   string    `cbor:"graph,omitempty" json:"graph,omitempty"`
	Base    uint64    `cbor:"base,omitempty" json:"base,omitempty"`
	Scalars []float64 `cbor:"scalars,omitempty" json:"scalars,omitempty"`
}

// Result answers a read or a sync on the frame's reply subject.
type Result struct {
	V int `cbor:"v" json:"v"`
	// Tag echoes the op's tag (0 for an answer to an undecodable frame).
	Tag uint64 `cbor:"tag,omitempty" json:"tag,omitempty"`
	// Seq and Index identify the op answered: the frame's stream sequence
	// and the op's index in it.
	Seq   uint64 `cbor:"seq,omitempty" json:"seq,omitempty"`
	Index int    `cbor:"index,omitempty" json:"index,omitempty"`
	// Errors lists the errors of this session not yet reported, oldest
	// first. A non-empty list means the read or sync failed.
	Errors []Error `cbor:"errors,omitempty" json:"errors,omitempty"`
	// Tensor is the data of a read.
	Tensor *Tensor `cbor:"tensor,omitempty" json:"tensor,omitempty"`
}

// Tensor is a tensor's bytes, inline or as an object in the transfer bucket.
type Tensor struct {
	DType string `cbor:"dtype" json:"dtype"`
	Shape []int  `cbor:"shape" json:"shape"`
	// Data holds the bytes inline: contiguous, row-major, little-endian.
	Data []byte `cbor:"data,omitempty" json:"data,omitempty"`
	// Values repeats Data as numbers in JSON replies when every element is
	// finite, for clients that prefer numbers.
	Values []float64 `cbor:"values,omitempty" json:"values,omitempty"`
	// Object names the object holding the bytes when they are too large
	// to travel inline. The reader deletes it once read.
	Object string `cbor:"object,omitempty" json:"object,omitempty"`
	// SHA256 is the hex digest of the bytes, set with Object once the
	// object is written.
	SHA256 string `cbor:"sha256,omitempty" json:"sha256,omitempty"`
	// NUID, with Object, is the token of the object's chunk subject when
	// the reply is sent before the object is complete: the reader copies
	// the chunks as the worker writes them and checks them against the
	// object's meta, which comes last.
	NUID string `cbor:"nuid,omitempty" json:"nuid,omitempty"`
	// Pieces, with Object and NUID, says the bytes come as that many
	// pieces, named and cut as an upload's (see Op.Pieces).
	Pieces int `cbor:"pieces,omitempty" json:"pieces,omitempty"`
	// Bucket, with Object, names the object bucket holding it when that is
	// not the session's transfer bucket: FABRIC_RESULTS, which the broker
	// keeps in memory.
	Bucket string `cbor:"bucket,omitempty" json:"bucket,omitempty"`
}

// Error codes.
const (
	CodeMalformed  = "malformed"   // the frame could not be decoded
	CodeVersion    = "version"     // unsupported protocol version
	CodeUnknownOp  = "unknown_op"  // not in the op set
	CodeArity      = "arity"       // wrong number of inputs or outputs
	CodeShape      = "shape"       // shapes do not fit the op
	CodeDType      = "dtype"       // dtype not accepted
	CodeAttr       = "attr"        // attribute missing or out of range
	CodeUnknownID  = "unknown_id"  // tensor id never created, or freed
	CodeFailedID   = "failed_id"   // input was produced by a failed op
	CodeDuplicate  = "duplicate"   // output id already in use
	CodeTooLarge   = "too_large"   // over a configured limit
	CodeLimit      = "limit"       // sessions, memory or ops over a limit
	CodeInternal   = "internal"    // a backend failure
	CodeUnavailabe = "unavailable" // object missing, timeout
	// CodeResourceExhausted: the device's memory budget (or the
	// device itself) has no room for the op's outputs; the op fails, the
	// session and every other one go on.
	CodeResourceExhausted = "resource_exhausted"
	// CodeSessionFreed: the session was freed (idle past the worker's
	// timeout); its tensors are gone and it takes no more frames.
	CodeSessionFreed = "session_freed"
	// CodeUnknownGraph: a replay names a graph that is not stored.
	CodeUnknownGraph = "unknown_graph"
	// CodeInvalidGraph: a stored graph definition fails validation.
	CodeInvalidGraph = "invalid_graph"
	// CodeNoDevice: no worker serves the frame's device (it was not
	// served for the fabric's grace period); the frame was removed from
	// the stream unrun.
	CodeNoDevice = "no_device"
	// CodeInvalidSubject: the frame's subject is not a valid op subject
	// (a device or session token with a forbidden character); the frame
	// was removed from the stream unrun.
	CodeInvalidSubject = "invalid_subject"
	// CodeFrameLost: a frame of the session numbered before this one
	// never reached the stream; the session went on without it.
	CodeFrameLost = "frame_lost"
	// CodePermission: a tenant's frame asked for something outside the
	// tenant's namespace (a Fabric-Reply outside its inbox, an op the
	// tenant may not use); nothing was published elsewhere.
	CodePermission = "permission"
	// CodeQuota: a tenant's quota (sessions, bytes held, frames per
	// second) would be passed; the message names the quota and its value.
	CodeQuota = "quota"
)

// Tenant is a tenant's record, the JSON value of key tenant.<name> in the
// control bucket: the quotas workers enforce across the fabric (each
// device counts the tenant's use on the others as their registry entries
// last reported it; see QuotaView). A zero quota is no limit.
type Tenant struct {
	Name string `json:"name"`
	// Sessions bounds the tenant's live sessions on all devices.
	Sessions int `json:"sessions,omitempty"`
	// Bytes bounds the tensor bytes the tenant's sessions hold on all
	// devices; it is also the size of the tenant's object bucket.
	Bytes int64 `json:"bytes,omitempty"`
	// FPS bounds the frames per second of all the tenant's sessions on
	// all devices (a burst of one second's worth is allowed).
	FPS float64 `json:"fps,omitempty"`
	// Expires is when the tenant's credentials expire (zero: never).
	Expires time.Time `json:"expires,omitzero"`
}

// Error is an op's failure. Seq and Index identify the op; Op names it.
type Error struct {
	Seq     uint64 `cbor:"seq,omitempty" json:"seq,omitempty"`
	Index   int    `cbor:"index" json:"index"`
	Op      string `cbor:"op,omitempty" json:"op,omitempty"`
	Code    string `cbor:"code" json:"code"`
	Message string `cbor:"message" json:"message"`
}

// Error formats as "op add (frame 12, op 3): shape: ...".
func (e *Error) Error() string {
	op := e.Op
	if op == "" {
		op = "frame"
	}
	return fmt.Sprintf("jetfabric: op %s (frame %d, op %d): %s: %s", op, e.Seq, e.Index, e.Code, e.Message)
}

// Device is a device's entry in the registry (FABRIC_CTRL key device.<name>).
type Device struct {
	Name     string            `cbor:"name" json:"name"`
	Kind     string            `cbor:"kind" json:"kind"` // "cpu" or "gpu"
	Backend  string            `cbor:"backend" json:"backend"`
	Worker   string            `cbor:"worker" json:"worker"`
	Host     string            `cbor:"host" json:"host"`
	Cores    int               `cbor:"cores,omitempty" json:"cores,omitempty"`
	Memory   int64             `cbor:"memory,omitempty" json:"memory,omitempty"`
	Props    map[string]string `cbor:"props,omitempty" json:"props,omitempty"`
	Started  time.Time         `cbor:"started" json:"started"`
	Beat     time.Time         `cbor:"beat" json:"beat"`
	Sessions int               `cbor:"sessions" json:"sessions"`
	Applied  uint64            `cbor:"applied" json:"applied"` // last stream sequence applied
	State    string            `cbor:"state" json:"state"`     // "serving", "stopped"
	// Ops and Frames count what the device executed since its worker
	// started; Lag is the device's frames queued in the stream behind the
	// last one handled. Rates come from successive reads (jetfabric top).
	Ops    uint64 `cbor:"ops,omitempty" json:"ops,omitempty"`
	Frames uint64 `cbor:"frames,omitempty" json:"frames,omitempty"`
	Lag    uint64 `cbor:"lag,omitempty" json:"lag,omitempty"`
	// Bytes is the tensor memory the device holds for its sessions;
	// Budget the most it may hold (0: no budget).
	Bytes  int64 `cbor:"bytes,omitempty" json:"bytes,omitempty"`
	Budget int64 `cbor:"budget,omitempty" json:"budget,omitempty"`
	// LastFrame is when the device last ran a frame (zero: none since
	// its worker took it). Stalled is set while frames wait in the stream
	// (Lag > 0) and none was delivered for a few seconds: the worker is
	// re-creating the device's consumer, or its cluster cannot serve it.
	LastFrame time.Time `cbor:"last_frame,omitempty" json:"last_frame,omitzero"`
	Stalled   bool      `cbor:"stalled,omitempty" json:"stalled,omitempty"`
	// Tenants is each tenant's use of the device, for the quotas (with
	// tenants only; tenants with nothing on the device left out).
	Tenants map[string]TenantUse `cbor:"tenants,omitempty" json:"tenants,omitempty"`
}

// TenantUse is a tenant's use of one device, or of several summed: its
// live sessions, the tensor bytes they hold, and the frames a second the
// device ran for it. Devices, in a QuotaView, counts the devices whose
// FPS was not zero.
type TenantUse struct {
	Sessions int     `cbor:"sessions,omitempty" json:"sessions,omitempty"`
	Bytes    int64   `cbor:"bytes,omitempty" json:"bytes,omitempty"`
	FPS      float64 `cbor:"fps,omitempty" json:"fps,omitempty"`
	Devices  int     `cbor:"devices,omitempty" json:"devices,omitempty"`
}

// QuotaView is what a device counts, for the quotas, of each tenant's use
// of the other devices: the sum of their registry entries' Tenants. Its
// worker publishes it as JSON into the device's own frames (subject
// subjects.Names.QuotaView) when it changes, so that the device takes it
// at a place in the stream, and a replay after a takeover decides every
// frame with the view the first run had.
type QuotaView struct {
	Tenants map[string]TenantUse `cbor:"tenants" json:"tenants"`
}

// Telemetry is a GPU's state as its worker samples it (NVML), published as
// JSON on fabric.telemetry.<device> every few seconds. Fields NVML cannot
// give are left zero.
type Telemetry struct {
	Device string    `cbor:"device" json:"device"`
	Time   time.Time `cbor:"time" json:"time"`
	// Util is the percent of the last sample period a kernel ran;
	// MemUtil the percent that device memory was read or written.
	Util    int `cbor:"util" json:"util"`
	MemUtil int `cbor:"mem_util" json:"mem_util"`
	// MemUsed and MemTotal are device memory in bytes.
	MemUsed  int64 `cbor:"mem_used" json:"mem_used"`
	MemTotal int64 `cbor:"mem_total" json:"mem_total"`
	// TempC is the GPU temperature in degrees Celsius, PowerW its draw in watts.
	TempC  int     `cbor:"temp_c" json:"temp_c"`
	PowerW float64 `cbor:"power_w" json:"power_w"`
}

// Job is a stateless op program for any worker of a device kind: it runs in
// a fresh session of its own, reads its inputs from uploads (inline or by
// object reference) and names the tensors to keep as Outputs. Jobs travel
// on the jobs stream, each taken by one worker; a worker that dies before
// finishing one leaves it to be redelivered to another.
type Job struct {
	V int `cbor:"v" json:"v"`
	// ID is chosen by the client, unique (jetfabric's client uses 128
	// random bits in hex); it names the result and the output objects.
	ID      string   `cbor:"id" json:"id"`
	Ops     []Op     `cbor:"ops" json:"ops"`
	Outputs []uint64 `cbor:"outputs" json:"outputs"`
}

// JobResult is a job's outcome, written once under job.<id> in the control
// bucket: the first worker to finish the job writes it, and a later finish
// of the same job (a redelivery) finds it there and writes nothing.
type JobResult struct {
	V      int    `cbor:"v" json:"v"`
	ID     string `cbor:"id" json:"id"`
	Worker string `cbor:"worker" json:"worker"`
	// Attempt is the delivery that completed the job (1 for the first).
	Attempt uint64 `cbor:"attempt" json:"attempt"`
	// Outputs are the output tensors, in the order of Job.Outputs, each
	// as an object in the transfer bucket.
	Outputs []Tensor `cbor:"outputs,omitempty" json:"outputs,omitempty"`
	// Errors lists the job's op errors; a non-empty list means it failed.
	Errors []Error   `cbor:"errors,omitempty" json:"errors,omitempty"`
	Done   time.Time `cbor:"done" json:"done"`
}
