//go:build !linux

package objectstore

// prefault does nothing here: see prefault_linux.go.
func prefault([]byte) {}
