// Package datasets keeps a labelled data set on a fabric device for
// training: the examples are uploaded once, as bytes named by their SHA-256
// (so a second upload of the same set, by any session, stores nothing new),
// cast and normalised on the worker once, and every batch is cut on the
// worker by index_select with a slice of a per-epoch permutation. The
// permutation is drawn here from a seed and uploaded once an epoch; pixels
// are never sent again.
//
//	set, err := datasets.Upload(ctx, s, images, []int{n, 1, 28, 28}, labels, datasets.MNISTNorm)
//	ep, err := set.Epoch(ctx, datasets.Permutation(seed, epoch, n))
//	x, y := ep.Batch(0, 128) // f32 [128,1,28,28], i64 [128]
//
// A Set belongs to one session; a data-parallel run uploads it to each
// rank's session (the store holds the bytes once) and gives each rank its
// slice of every batch.
package datasets
