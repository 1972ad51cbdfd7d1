package objectstore

import "errors"

// Errors returned by Store. Every error wraps one of these (or a context
// error) with the object and the step that failed; match with errors.Is.
var (
	// ErrNotFound: the object does not exist or was deleted.
	ErrNotFound = errors.New("objectstore: object not found")
	// ErrBucketNotFound: New was given a bucket that does not exist.
	ErrBucketNotFound = errors.New("objectstore: bucket not found")
	// ErrDigest: the data read does not match the object's meta: its
	// SHA-256 digest, its size or its number of chunks differ.
	ErrDigest = errors.New("objectstore: object data does not match its digest")
	// ErrSize: the destination given to GetInto is not the object's size.
	ErrSize = errors.New("objectstore: destination size does not match object size")
	// ErrInvalidOption: an Option or New's arguments are out of range.
	ErrInvalidOption = errors.New("objectstore: invalid option")
	// ErrRefused: the broker refused or did not acknowledge chunks
	// more often than WithRetries allows, or refused them for good
	// (bucket full, message too large). The write was rolled back.
	ErrRefused = errors.New("objectstore: broker refused the write")
	// ErrStalled: Follow saw nothing new for the store's timeout; the
	// writer stopped (its process died) or never started.
	ErrStalled = errors.New("objectstore: the writer stopped")
)
