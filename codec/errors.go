package codec

import "errors"

// Errors returned by decoding.
var (
	// ErrMalformed: the bytes are not a valid message in the chosen encoding.
	ErrMalformed = errors.New("codec: malformed message")
	// ErrVersion: the message's version is not one this build speaks.
	ErrVersion = errors.New("codec: unsupported version")
	// ErrTooManyOps: a frame holds more ops than allowed.
	ErrTooManyOps = errors.New("codec: too many ops in frame")
)

// ErrTooLarge: a message is over a size limit (a graph definition).
var ErrTooLarge = errors.New("codec: too large")
