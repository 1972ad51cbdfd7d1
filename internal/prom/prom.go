// Package prom writes the Prometheus text exposition format (version 0.0.4)
// by hand, for the worker's and the broker's /metrics endpoints.
//
//	p := prom.NewWriter(w)
//	p.Family("jetfabric_device_frames_total", "counter", "Frames executed.")
//	p.Sample("jetfabric_device_frames_total", prom.Labels("device", "cpu-0"), 12)
//	err := p.Flush()
package prom

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// ContentType is the content type of the text format.
const ContentType = "text/plain; version=0.0.4; charset=utf-8"

// Writer writes metric families and samples, keeping the first error.
type Writer struct {
	w   *bufio.Writer
	err error
}

// NewWriter buffers output to w; call Flush at the end.
func NewWriter(w io.Writer) *Writer { return &Writer{w: bufio.NewWriter(w)} }

// Family writes the HELP and TYPE lines of a metric (typ: counter, gauge).
func (p *Writer) Family(name, typ, help string) {
	if p.err == nil {
		_, p.err = fmt.Fprintf(p.w, "# HELP %s %s\n# TYPE %s %s\n", name, helpEscaper.Replace(help), name, typ)
	}
}

// Sample writes one sample; labels is "" or the output of Labels.
func (p *Writer) Sample(name, labels string, v float64) {
	if p.err == nil {
		_, p.err = fmt.Fprintf(p.w, "%s%s %s\n", name, labels, strconv.FormatFloat(v, 'g', -1, 64))
	}
}

// Flush writes what is buffered and returns the first error.
func (p *Writer) Flush() error {
	if p.err != nil {
		return p.err
	}
	return p.w.Flush()
}

// Labels formats name/value pairs as {a="x",b="y"}, values escaped.
func Labels(kv ...string) string {
	var b strings.Builder
	b.WriteByte('{')
	for i := 0; i+1 < len(kv); i += 2 {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(kv[i])
		b.WriteString(`="`)
		b.WriteString(labelEscaper.Replace(kv[i+1]))
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}

var (
	labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
	helpEscaper  = strings.NewReplacer(`\`, `\\`, "\n", `\n`)
)
