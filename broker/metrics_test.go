package broker_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/internal/prom"
)

func TestMetrics(t *testing.T) {
	b := brokertest.Run(t)
	nc, err := b.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	for range 3 {
		if _, err := js.Publish(context.Background(), b.Names().Ops("cpu-0", "s1"), []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	srv := httptest.NewServer(b.MetricsHandler())
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != prom.ContentType {
		t.Fatalf("%s %q: %s", resp.Status, resp.Header.Get("Content-Type"), body)
	}
	text := string(body)
	for _, want := range []string{
		"# TYPE jetfabric_broker_connections gauge\n",
		"# TYPE jetfabric_jetstream_api_requests_total counter\n",
		`jetfabric_stream_last_sequence{stream="FABRIC_OPS"} 3` + "\n",
		`jetfabric_stream_messages{stream="FABRIC_OPS"} 3` + "\n",
		`jetfabric_stream_messages{stream="KV_FABRIC_CTRL"} `,
		`jetfabric_stream_bytes{stream="OBJ_FABRIC_XFER"} `,
		`jetfabric_broker_connections{server="`,
		`jetfabric_jetstream_streams{server="`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if t.Failed() {
		t.Log(text)
	}
}
