//go:build !(cgo && linux)

package worker_test

import (
	"testing"

	"github.com/jetfabric/jetfabric/worker"
)

func TestNVMLStub(t *testing.T) {
	n, err := worker.OpenNVML()
	if !errorsIs(err, worker.ErrNoGPU) || n != nil {
		t.Fatalf("OpenNVML: %v, %v; want nil, ErrNoGPU", n, err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
}
