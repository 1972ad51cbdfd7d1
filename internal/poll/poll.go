// Package poll is the tests' one way to wait for a condition: call a
// function every step until it returns nil, and fail the test with its
// last error once the time allowed has passed. Tests wait on conditions
// this way, never on fixed sleeps, so a loaded machine only makes them
// slower.
package poll

import (
	"testing"
	"time"
)

// Until calls fn every step until it returns nil, failing t with fn's last
// error after total.
func Until(t testing.TB, total, step time.Duration, fn func() error) {
	t.Helper()
	deadline := time.Now().Add(total)
	for {
		err := fn()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %v", total, err)
		}
		time.Sleep(step)
	}
}
