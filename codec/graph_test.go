package codec_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/jetfabric/jetfabric/codec"
)

func TestGraphEncoding(t *testing.T) {
	g := &codec.Graph{
		V:       codec.Version,
		Inputs:  []codec.Placeholder{{DType: "f32", Shape: []int{2}}},
		Scalars: 1,
		Ops:     []codec.Op{{Op: "full", Out: []uint64{2}, Shape: []int{2}, Value: 1}, {Op: "add", Out: []uint64{3}, In: []uint64{1, 2}}},
		Outputs: []uint64{3},
		Binds:   []codec.Bind{{Op: 0, Attr: "value", Scalar: 0}},
	}
	data, name, err := codec.EncodeGraph(g)
	if err != nil {
		t.Fatal(err)
	}
	if name != codec.GraphName(data) || !codec.ValidGraphName(name) {
		t.Fatalf("name %q of %d bytes", name, len(data))
	}
	again, name2, _ := codec.EncodeGraph(g)
	if name2 != name || string(again) != string(data) {
		t.Fatal("the same graph encodes to other bytes")
	}
	back, err := codec.DecodeGraph(data)
	if err != nil {
		t.Fatal(err)
	}
	if _, n, _ := codec.EncodeGraph(back); n != name {
		t.Fatal("a decoded graph encodes to another name")
	}

	big := &codec.Graph{V: codec.Version, Ops: make([]codec.Op, codec.MaxGraphOps+1)}
	for i := range big.Ops {
		big.Ops[i].Op = "free"
	}
	bigData, err := codec.Marshal(codec.CBOR, big)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		data []byte
		want error
	}{
		{"garbage", []byte{0xff, 0x00}, codec.ErrMalformed},
		{"deep", bytes.Repeat([]byte{0x81}, 300), codec.ErrMalformed},
		{"version", func() []byte { v := *g; v.V = 2; b, _ := codec.Marshal(codec.CBOR, &v); return b }(), codec.ErrVersion},
		{"too many ops", bigData, codec.ErrTooLarge},
		{"too many bytes", make([]byte, codec.MaxGraphBytes+1), codec.ErrTooLarge},
	}
	for _, c := range cases {
		if _, err := codec.DecodeGraph(c.data); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	for _, bad := range []string{"", "xyz", name[:63], name + "0", "G" + name[1:]} {
		if codec.ValidGraphName(bad) {
			t.Errorf("%q passes as a graph name", bad)
		}
	}
}

func FuzzDecodeGraph(f *testing.F) {
	data, _, _ := codec.EncodeGraph(&codec.Graph{V: codec.Version, Ops: []codec.Op{{Op: "full", Out: []uint64{1}}}, Outputs: []uint64{1}})
	f.Add(data)
	f.Add([]byte{0xa0})
	f.Fuzz(func(t *testing.T, b []byte) {
		g, err := codec.DecodeGraph(b)
		if err == nil && (g.V != codec.Version || len(g.Ops) > codec.MaxGraphOps) {
			t.Fatalf("accepted %+v", g)
		}
	})
}
