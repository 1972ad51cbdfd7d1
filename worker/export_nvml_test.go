//go:build cgo && linux

package worker

// OpenNVMLLib opens a session on lib, a fake NVML in tests.
var OpenNVMLLib = openNVML
