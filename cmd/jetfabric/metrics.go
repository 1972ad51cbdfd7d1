package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/jetfabric/jetfabric/internal/prom"
)

// metricsFlagHelp is the help of every command's -metrics flag.
const metricsFlagHelp = "serve Prometheus metrics on http://host:port/metrics (empty: off)"

// metricsSource writes metrics in the Prometheus text format: a worker, a broker.
type metricsSource interface {
	WriteMetrics(io.Writer) error
}

// serveMetrics serves /metrics on addr from every source in turn until the
// returned stop is called. An empty addr serves nothing.
func serveMetrics(addr string, logw io.Writer, sources ...metricsSource) (stop func(), err error) {
	if addr == "" {
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("-metrics %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", prom.ContentType)
		for _, s := range sources {
			if err := s.WriteMetrics(w); err != nil {
				fmt.Fprintf(logw, "metrics: %v\n", err)
				return
			}
		}
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintf(logw, "metrics: %v\n", err)
		}
	}()
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}, nil
}
