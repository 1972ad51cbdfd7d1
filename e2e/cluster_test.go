package e2e

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/subjects"
)

// TestComposeCluster: the three-node cluster profile with a worker. A
// client streams a chain of dependent ops, each frame published until the
// stream acknowledges it (retries carry the same Nats-Msg-Id, so the stream
// stores each frame once); the node leading the ops stream is killed
// mid-stream. The stream resumes once the other two elect a leader, and
// the result shows every acknowledged op applied exactly once, in order.
func TestComposeCluster(t *testing.T) {
	needE2E(t)
	p := newProject(t)
	start := time.Now()
	p.compose("--profile", "cluster", "up", "-d", "n1", "n2", "n3", "worker-cluster")
	nc, err := nats.Connect(p.clusterURL(), nats.IgnoreDiscoveredServers(), nats.MaxReconnects(-1),
		nats.ReconnectWait(100*time.Millisecond), nats.RetryOnFailedConnect(true))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	live := waitLive(t, c, 1, 2*time.Minute)
	device := live[0].Name
	t.Logf("cluster up and %s live in %v", device, time.Since(start).Round(time.Millisecond))

	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	names := subjects.Default()
	subject := names.Ops(device, "clusterchain")
	inbox, err := nc.SubscribeSync(nats.NewInbox())
	if err != nil {
		t.Fatal(err)
	}
	// Tensor ids: 1 is x0 = 0, 2 is the constant 1, x_k (k >= 1) is k+2.
	id := func(k int) uint64 {
		if k == 0 {
			return 1
		}
		return uint64(k + 2)
	}
	frame := func(k int) codec.Frame {
		if k == 0 {
			return codec.Frame{V: codec.Version, Ops: []codec.Op{
				{Op: "full", Out: []uint64{1}, Shape: []int{1}},
				{Op: "full", Out: []uint64{2}, Shape: []int{1}, Value: 1},
			}}
		}
		return codec.Frame{V: codec.Version, Ops: []codec.Op{
			{Op: "add", In: []uint64{id(k - 1), 2}, Out: []uint64{id(k)}},
			{Op: "free", In: []uint64{id(k - 1)}},
		}}
	}
	var retries int
	publish := func(k int, f codec.Frame) time.Duration {
		data, err := codec.Marshal(codec.CBOR, &f)
		if err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		for {
			m := &nats.Msg{Subject: subject, Data: data, Header: nats.Header{subjects.HeaderReply: []string{inbox.Subject}}}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, err := js.PublishMsg(ctx, m, jetstream.WithMsgID(fmt.Sprintf("%s-%d", p.name, k)))
			cancel()
			if err == nil {
				return time.Since(t0)
			}
			retries++
			if time.Since(t0) > 90*time.Second {
				t.Fatalf("frame %d not acknowledged for %v: %v", k, time.Since(t0).Round(time.Millisecond), err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	read := func(k int, within time.Duration) {
		t.Helper()
		tag := uint64(k + 1)
		publish(-k, codec.Frame{V: codec.Version, Ops: []codec.Op{{Op: "read", In: []uint64{id(k)}, Tag: tag}}})
		deadline := time.Now().Add(within)
		var r codec.Result
		for r.Tag != tag {
			m, err := inbox.NextMsg(time.Until(deadline))
			if err != nil {
				t.Fatalf("read after %d adds: no reply in %v: %v\nconsumers of %s:\n%s", k, within, err, names.OpsStream(), consumers(js, names.OpsStream()))
			}
			// A worker that takes the device over replays the frames after
			// its checkpoint, and answers their reads again: a client goes
			// by the tag.
			enc, _ := codec.EncodingOf(m.Header.Get(subjects.HeaderContentType))
			r = codec.Result{}
			if err := codec.Unmarshal(enc, m.Data, &r); err != nil {
				t.Fatal(err)
			}
		}
		if len(r.Errors) > 0 || r.Tensor == nil || r.Tensor.DType != "f32" || len(r.Tensor.Data) != 4 ||
			math.Float32frombits(binary.LittleEndian.Uint32(r.Tensor.Data)) != float32(k) {
			t.Fatalf("read after %d adds: %+v (errors %+v); every acknowledged op must be applied once", k, r, r.Errors)
		}
	}

	const total, killAt = 300, 100
	publish(0, frame(0))
	var gap time.Duration
	var leader string
	for k := 1; k <= total; k++ {
		if k == killAt {
			read(k-1, 30*time.Second) // the worker applies the stream
			leader = replicated(t, js, names.OpsStream())
			ids := p.containers(leader)
			if len(ids) != 1 {
				t.Fatalf("container of %s: %v", leader, ids)
			}
			if out, err := exec.Command("docker", "kill", ids[0]).CombinedOutput(); err != nil {
				t.Fatalf("docker kill %s: %v\n%s", leader, err, out)
			}
			t.Logf("killed %s, the ops stream's leader, after %d acknowledged frames", leader, k)
		}
		took := publish(k, frame(k))
		if k >= killAt {
			gap = max(gap, took)
		}
	}
	read(total, 90*time.Second)
	t.Logf("%d frames acknowledged, %d publish attempts retried; the longest wait for an acknowledgement after the kill: %v; the read after %d adds gives %d",
		total+1, retries, gap.Round(time.Millisecond), total, total)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if s, err := js.Stream(ctx, names.OpsStream()); err == nil {
		ci := s.CachedInfo().Cluster
		var replicas []string
		for _, r := range ci.Replicas {
			replicas = append(replicas, fmt.Sprintf("%s(current %v, offline %v)", r.Name, r.Current, r.Offline))
		}
		t.Logf("ops stream leader now %s, replicas %s", ci.Leader, strings.Join(replicas, " "))
		if ci.Leader == leader {
			t.Errorf("the killed node %s still leads the ops stream", leader)
		}
	}
}

// consumers describes a stream's consumers: where each runs and how far it
// delivered.
func consumers(js jetstream.JetStream, stream string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "stream: last sequence %d, leader %v\n", s.CachedInfo().State.LastSeq, s.CachedInfo().Cluster)
	l := s.ListConsumers(ctx)
	for ci := range l.Info() {
		leader := ""
		if ci.Cluster != nil {
			leader = ci.Cluster.Leader
		}
		fmt.Fprintf(&b, "%s: on %s, delivered stream seq %d, pending %d, waiting pulls %d, filter %q\n",
			ci.Name, leader, ci.Delivered.Stream, ci.NumPending, ci.NumWaiting, ci.Config.FilterSubject)
	}
	if err := l.Err(); err != nil {
		fmt.Fprintf(&b, "list: %v\n", err)
	}
	return b.String()
}

// replicated waits until the stream has a leader and two current replicas
// (a node may still be restarting after a slow start), and returns the
// leader's name.
func replicated(t *testing.T, js jetstream.JetStream, stream string) string {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		s, err := js.Stream(ctx, stream)
		cancel()
		var ci *jetstream.ClusterInfo
		if err == nil {
			ci = s.CachedInfo().Cluster
			if ci != nil && ci.Leader != "" && len(ci.Replicas) == 2 && ci.Replicas[0].Current && ci.Replicas[1].Current &&
				!ci.Replicas[0].Offline && !ci.Replicas[1].Offline {
				return ci.Leader
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("ops stream not on three current nodes after 90s: %v %+v", err, ci)
		}
		time.Sleep(500 * time.Millisecond)
	}
}
