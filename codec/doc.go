// Package codec is jetfabric's wire schema: op frames, ops, results, errors,
// tensor payloads and device registry entries, with their two encodings.
//
// CBOR is canonical. A frame sent with header Content-Type: application/json
// is read as JSON, and its replies are written as JSON, so any NATS client
// can drive the fabric. Both encodings use the same field names.
//
// Decoding is bounded: the CBOR decode mode is built once with limits on
// nesting, array and map sizes; DecodeFrame further checks the version and
// the op count. Decoding never panics on any input (see the fuzz tests).
//
// Frames and results are encoded and decoded on every round trip, so their
// CBOR goes through a table of their fields built once (frame_cbor.go)
// instead of the generic encoder and decoder: the same bytes out, the same
// values in, and the generic decoder for any input the table does not take.
package codec
