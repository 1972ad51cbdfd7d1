package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/kernels/cpu"
	"github.com/jetfabric/jetfabric/subjects"
	"github.com/jetfabric/jetfabric/worker"
)

func TestMicroService(t *testing.T) {
	b := brokertest.Run(t)
	w0 := startWorker(t, b, func(c *worker.Config) { c.ID = "w0" })
	startWorker(t, b, func(c *worker.Config) {
		c.ID = "w1"
		c.Devices = []worker.Device{{Name: "cpu-1", Kind: "cpu", Backend: cpu.New()}, {Name: "cpu-2", Kind: "cpu", Backend: cpu.New()}}
	})
	nc, err := nats.Connect(b.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	names := subjects.Default()

	// $SRV.INFO.<name> is answered by every instance: one per worker.
	infos := map[string]micro.Info{}
	inbox := nats.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	subject, _ := micro.ControlSubject(micro.InfoVerb, subjects.ServiceName, "")
	if err := nc.PublishRequest(subject, inbox, nil); err != nil {
		t.Fatal(err)
	}
	for len(infos) < 2 {
		m, err := sub.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("%s: %d answers, want 2: %v", subject, len(infos), err)
		}
		var info micro.Info
		if err := json.Unmarshal(m.Data, &info); err != nil {
			t.Fatal(err)
		}
		infos[info.Metadata["worker"]] = info
	}
	want := map[string][]string{"w0": {"cpu-0"}, "w1": {"cpu-1", "cpu-2"}}
	for id, devs := range want {
		info, ok := infos[id]
		if !ok {
			t.Fatalf("no service instance for worker %s: %+v", id, infos)
		}
		if info.Name != subjects.ServiceName || info.Type != micro.InfoResponseType || info.Version != worker.ServiceVersion {
			t.Errorf("%s: identity %+v", id, info.ServiceIdentity)
		}
		if info.Metadata["devices"] != strings.Join(devs, ",") || info.Metadata["prefix"] != "fabric" || info.Metadata["host"] == "" {
			t.Errorf("%s: metadata %v", id, info.Metadata)
		}
		var got []string
		for _, e := range info.Endpoints {
			got = append(got, e.Subject)
		}
		var wantSubj []string
		for _, d := range devs {
			wantSubj = append(wantSubj, names.ServiceInfo(d), names.ServiceHealth(d))
		}
		if !slices.Equal(got, wantSubj) {
			t.Errorf("%s: endpoints %v, want %v", id, got, wantSubj)
		}
	}

	// PING by name and id reaches one instance.
	ping, _ := micro.ControlSubject(micro.PingVerb, subjects.ServiceName, infos["w1"].ID)
	m, err := nc.Request(ping, nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var p micro.Ping
	if err := json.Unmarshal(m.Data, &p); err != nil || p.Metadata["worker"] != "w1" || p.Type != micro.PingResponseType {
		t.Errorf("ping: %+v %v", p, err)
	}

	// The endpoints answer for their device.
	for _, dev := range []string{"cpu-0", "cpu-2"} {
		m, err := nc.Request(names.ServiceInfo(dev), nil, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var d codec.Device
		if err := json.Unmarshal(m.Data, &d); err != nil || d.Name != dev || d.State != "serving" || d.Backend != "cpu" {
			t.Errorf("%s info: %+v %v", dev, d, err)
		}
		m, err = nc.Request(names.ServiceHealth(dev), nil, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var h worker.Health
		if err := json.Unmarshal(m.Data, &h); err != nil || h.Device != dev || h.Status != "ok" || m.Header.Get(micro.ErrorCodeHeader) != "" {
			t.Errorf("%s health: %+v %v %v", dev, h, err, m.Header)
		}
		if h.LoopAge < 0 || h.LoopAge > 5*time.Second {
			t.Errorf("%s health: loop age %v", dev, h.LoopAge)
		}
	}

	// A stopped worker leaves the service.
	if err := w0.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := nc.Request(names.ServiceInfo("cpu-0"), nil, 2*time.Second); !errors.Is(err, nats.ErrNoResponders) {
		t.Errorf("info of a stopped worker's device: %v, want no responders", err)
	}
}
