package prom

import (
	"strings"
	"testing"
)

func TestWriter(t *testing.T) {
	var b strings.Builder
	p := NewWriter(&b)
	p.Family("x_total", "counter", "Things.\nMore.")
	p.Sample("x_total", Labels("device", `cpu-0`, "note", "a\"b\\c\nd"), 3)
	p.Sample("x_total", "", 0.5)
	if err := p.Flush(); err != nil {
		t.Fatal(err)
	}
	want := "# HELP x_total Things.\\nMore.\n# TYPE x_total counter\n" +
		"x_total{device=\"cpu-0\",note=\"a\\\"b\\\\c\\nd\"} 3\nx_total 0.5\n"
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
}
