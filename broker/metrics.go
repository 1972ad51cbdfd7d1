package broker

import (
	"bytes"
	"fmt"
	"io"
	"net/http"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetfabric/jetfabric/internal/prom"
)

// WriteMetrics writes the broker's figures in the Prometheus text format:
// the server's connections, messages and bytes (from Varz), JetStream's
// memory, storage and API counts, and per stream its messages, bytes,
// sequences and consumers (from Jsz). For FABRIC_OPS, the last sequence
// minus a device's jetfabric_device_applied_sequence is how far behind the
// stream that device is.
func (b *Broker) WriteMetrics(out io.Writer) error {
	v, err := b.srv.Varz(nil)
	if err != nil {
		return fmt.Errorf("broker: varz: %w", err)
	}
	js, err := b.srv.Jsz(&server.JSzOptions{Accounts: true, Streams: true})
	if err != nil {
		return fmt.Errorf("broker: jsz: %w", err)
	}
	p := prom.NewWriter(out)
	srv := prom.Labels("server", v.Name)
	for _, m := range []struct {
		name, typ, help string
		v               float64
	}{
		{"jetfabric_broker_connections", "gauge", "Client connections open.", float64(v.Connections)},
		{"jetfabric_broker_connections_total", "counter", "Client connections accepted since start.", float64(v.TotalConnections)},
		{"jetfabric_broker_subscriptions", "gauge", "Subscriptions.", float64(v.Subscriptions)},
		{"jetfabric_broker_slow_consumers_total", "counter", "Clients the server cut off as slow consumers.", float64(v.SlowConsumers)},
		{"jetfabric_broker_in_msgs_total", "counter", "Messages received.", float64(v.InMsgs)},
		{"jetfabric_broker_out_msgs_total", "counter", "Messages sent.", float64(v.OutMsgs)},
		{"jetfabric_broker_in_bytes_total", "counter", "Payload bytes received.", float64(v.InBytes)},
		{"jetfabric_broker_out_bytes_total", "counter", "Payload bytes sent.", float64(v.OutBytes)},
		{"jetfabric_broker_resident_memory_bytes", "gauge", "Resident memory of the process.", float64(v.Mem)},
		{"jetfabric_jetstream_memory_bytes", "gauge", "JetStream memory storage in use.", float64(js.Memory)},
		{"jetfabric_jetstream_storage_bytes", "gauge", "JetStream file storage in use.", float64(js.Store)},
		{"jetfabric_jetstream_streams", "gauge", "Streams (the fabric's ops stream, its KV and object buckets, any others).", float64(js.Streams)},
		{"jetfabric_jetstream_consumers", "gauge", "Consumers (one ordered consumer per served device, and clients').", float64(js.Consumers)},
		{"jetfabric_jetstream_messages", "gauge", "Messages stored in all streams.", float64(js.Messages)},
		{"jetfabric_jetstream_bytes", "gauge", "Bytes stored in all streams.", float64(js.Bytes)},
		{"jetfabric_jetstream_api_requests_total", "counter", "JetStream API requests.", float64(js.API.Total)},
		{"jetfabric_jetstream_api_errors_total", "counter", "JetStream API requests answered with an error.", float64(js.API.Errors)},
	} {
		p.Family(m.name, m.typ, m.help)
		p.Sample(m.name, srv, m.v)
	}
	if b.auth != nil {
		vi := b.Violations()
		p.Family("jetfabric_broker_permission_violations_total", "counter", "Publishes and subscriptions the server refused for the client's permissions (a tenant outside its namespace), as the server reports them.")
		p.Sample("jetfabric_broker_permission_violations_total", prom.Labels("server", v.Name, "kind", "publish"), float64(vi.Publish))
		p.Sample("jetfabric_broker_permission_violations_total", prom.Labels("server", v.Name, "kind", "subscribe"), float64(vi.Subscribe))
		p.Family("jetfabric_broker_auth_failures_total", "counter", "Connections refused for their credentials (unknown signer, expired, malformed).")
		p.Sample("jetfabric_broker_auth_failures_total", srv, float64(vi.Authentication))
	}
	var streams []server.StreamDetail
	for _, a := range js.AccountDetails {
		streams = append(streams, a.Streams...)
	}
	for _, m := range []struct {
		name, help string
		v          func(s *server.StreamState) float64
	}{
		{"jetfabric_stream_messages", "Messages in the stream.", func(s *server.StreamState) float64 { return float64(s.Msgs) }},
		{"jetfabric_stream_bytes", "Bytes in the stream.", func(s *server.StreamState) float64 { return float64(s.Bytes) }},
		{"jetfabric_stream_first_sequence", "First sequence still stored.", func(s *server.StreamState) float64 { return float64(s.FirstSeq) }},
		{"jetfabric_stream_last_sequence", "Last sequence stored.", func(s *server.StreamState) float64 { return float64(s.LastSeq) }},
		{"jetfabric_stream_consumers", "Consumers of the stream.", func(s *server.StreamState) float64 { return float64(s.Consumers) }},
	} {
		p.Family(m.name, "gauge", m.help)
		for i := range streams {
			p.Sample(m.name, prom.Labels("stream", streams[i].Name), m.v(&streams[i].State))
		}
	}
	return p.Flush()
}

// MetricsHandler serves WriteMetrics over HTTP, for /metrics.
func (b *Broker) MetricsHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		var buf bytes.Buffer
		if err := b.WriteMetrics(&buf); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", prom.ContentType)
		_, _ = buf.WriteTo(w)
	})
}
