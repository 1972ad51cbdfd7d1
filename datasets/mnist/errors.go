package mnist

import "errors"

var (
	// ErrFormat: a file is not a well-formed IDX file of the kind expected.
	ErrFormat = errors.New("mnist: bad IDX file")
	// ErrNotFound: the data files are not where they were looked for.
	ErrNotFound = errors.New("mnist: data files not found")
)
