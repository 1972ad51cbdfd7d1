//go:build !(linux && (amd64 || arm64))

package main

import (
	"io"
	"os"
)

// isTerminal reports whether w is a character device (a terminal, most
// likely: this platform's terminal ioctls are not used).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// watchKeys is not supported here: only Ctrl-C (or -count) ends top.
func watchKeys() (<-chan struct{}, func()) { return nil, func() {} }
