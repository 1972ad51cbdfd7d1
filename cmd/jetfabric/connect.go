package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/broker"
	"github.com/jetfabric/jetfabric/subjects"
)

// Backoff of a worker's connection attempts: from backoffMin, doubling to
// backoffMax, with up to a quarter of jitter, so that the workers of a
// restarted broker do not all come back in step.
const (
	backoffMin = 100 * time.Millisecond
	backoffMax = 5 * time.Second
)

// backoff is the wait before attempt n (from 1).
func backoff(n int) time.Duration {
	d := backoffMax
	if n < 16 {
		d = min(backoffMin<<(n-1), backoffMax)
	}
	return d + rand.N(d/4+1)
}

// connectRetrying connects to urls for a long-running process (a worker):
// a broker not up yet is retried with backoff until ctx ends, a lost one
// is reconnected to for ever with the same backoff, and both are logged.
// Refused credentials and a URL that is not a NATS server fail at once.
func connectRetrying(ctx context.Context, urls string, opts []nats.Option, logf func(string, ...any)) (*nats.Conn, error) {
	opts = append(opts,
		nats.MaxReconnects(-1),
		nats.CustomReconnectDelay(backoff),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if err != nil {
				logf("jetfabric: lost the broker (%v); reconnecting to %v with backoff", err, nc.Servers())
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			logf("jetfabric: connected to %s", nc.ConnectedUrlRedacted())
		}))
	for n := 1; ; n++ {
		nc, err := nats.Connect(urls, opts...)
		if err == nil {
			return nc, nil
		}
		if !errors.Is(err, nats.ErrNoServers) {
			return nil, fmt.Errorf("connect: %w", connectError(urls, err))
		}
		wait := backoff(n)
		if n == 1 || n%10 == 0 {
			logf("jetfabric: no broker at %s yet (%v); retrying with backoff (next in %v)", urls, err, wait.Round(time.Millisecond))
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("connect: %w", connectError(urls, err))
		case <-time.After(wait):
		}
	}
}

// waitFabric waits, until ctx ends, for the broker to have provisioned the
// fabric's stream and buckets (a cluster electing its leaders, a broker
// still starting), saying so every few seconds.
func waitFabric(ctx context.Context, nc *nats.Conn, urls string, logf func(string, ...any)) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	names := subjects.Default()
	start := time.Now()
	for n := 1; ; n++ {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := broker.WaitProvisioned(wctx, js, names)
		cancel()
		if err == nil {
			if n > 1 {
				logf("jetfabric: the fabric at %s is ready after %v", urls, time.Since(start).Round(time.Millisecond))
			}
			return nil
		}
		if ctx.Err() != nil {
			return err
		}
		if n == 1 || n%6 == 0 {
			logf("jetfabric: waiting for the fabric at %s (connection %s): %v", urls, nc.Status(), err)
		}
	}
}
