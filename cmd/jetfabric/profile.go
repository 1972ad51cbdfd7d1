package main

import (
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
)

// profileEnv names a file for a CPU profile of the whole process, for any
// command (a worker or a broker under a benchmark, say): "%p" in it is
// replaced by the process id, so that processes started alike write apart.
const profileEnv = "JETFABRIC_CPUPROFILE"

// startProfile starts the CPU profile that profileEnv asks for, if any, and
// returns the function that ends it (a no-op when none was asked for).
func startProfile(stderr io.Writer) (stop func(), err error) {
	path := os.Getenv(profileEnv)
	if path == "" {
		return func() {}, nil
	}
	path = strings.ReplaceAll(path, "%p", strconv.Itoa(os.Getpid()))
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", profileEnv, err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", profileEnv, err)
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			fmt.Fprintf(stderr, "jetfabric: %s: %v\n", profileEnv, err)
		}
	}, nil
}
