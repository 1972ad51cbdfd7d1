package deploy_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/deploy"
	"github.com/jetfabric/jetfabric/kernels/cpu"
	"github.com/jetfabric/jetfabric/worker"
	"github.com/jetfabric/jetfabric/worker/workertest"
)

// exported returns every series a broker and a worker with a device and a
// job loop export, by name, with the label names of its samples.
func exported(t *testing.T) map[string]map[string]bool {
	t.Helper()
	b := brokertest.Run(t)
	w := workertest.Run(t, b, workertest.CPUs(1), func(c *worker.Config) {
		c.Jobs = []worker.Jobs{{Kind: "cpu", Backend: cpu.New()}}
	})
	var buf bytes.Buffer
	if err := b.WriteMetrics(&buf); err != nil {
		t.Fatal(err)
	}
	if err := w.WriteMetrics(&buf); err != nil {
		t.Fatal(err)
	}
	series := map[string]map[string]bool{}
	sc := bufio.NewScanner(&buf)
	for sc.Scan() {
		line := sc.Text()
		if f := strings.Fields(line); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			if series[f[2]] == nil {
				series[f[2]] = map[string]bool{}
			}
			continue
		}
		if line == "" || line[0] == '#' {
			continue
		}
		name, rest, _ := strings.Cut(line, "{")
		if series[name] == nil {
			t.Fatalf("sample before its family: %q", line)
		}
		for _, m := range labelRe.FindAllStringSubmatch(rest, -1) {
			series[name][m[1]] = true
		}
	}
	return series
}

var (
	labelRe    = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="`)
	selectorRe = regexp.MustCompile(`\b(jetfabric_[a-zA-Z0-9_]+)(\{[^}]*\})?`)
	matcherRe  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)`)
	groupingRe = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
	labelValRe = regexp.MustCompile(`label_values\(\s*(jetfabric_[a-zA-Z0-9_]+)\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)`)
)

// queries returns every PromQL expression of the dashboard, and the
// template variables' queries, by where they are.
func queries(v any, path string, out map[string]string) {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			if s, ok := e.(string); ok && (k == "expr" || k == "definition") {
				out[path+"."+k] = s
				continue
			}
			queries(e, path+"."+k, out)
		}
	case []any:
		for i, e := range v {
			queries(e, path+"["+strconv.Itoa(i)+"]", out)
		}
	}
}

// TestDashboardQueriesNameExportedSeries: every query of the Grafana
// dashboard names at least one series, every series it names is one the
// broker or a worker exports, and every label it matches or groups by is
// one those series carry.
func TestDashboardQueriesNameExportedSeries(t *testing.T) {
	var dash map[string]any
	if err := json.Unmarshal(deploy.GrafanaDashboard, &dash); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	if dash["title"] == nil || dash["uid"] == nil {
		t.Fatal("dashboard without title or uid")
	}
	qs := map[string]string{}
	queries(dash, "", qs)
	if len(qs) < 10 {
		t.Fatalf("%d queries in the dashboard", len(qs))
	}
	series := exported(t)
	used := map[string]bool{}
	for where, q := range qs {
		sels := selectorRe.FindAllStringSubmatch(q, -1)
		if len(sels) == 0 {
			t.Errorf("%s: %q names no jetfabric series", where, q)
			continue
		}
		labels := map[string]bool{} // of every series the query names
		for _, m := range sels {
			name := m[1]
			ls, ok := series[name]
			if !ok {
				t.Errorf("%s: %q names %s, which the fabric does not export", where, q, name)
				continue
			}
			used[name] = true
			for l := range ls {
				labels[l] = true
			}
			for _, mm := range matcherRe.FindAllStringSubmatch(m[2], -1) {
				if !ls[mm[1]] {
					t.Errorf("%s: %q matches label %s, which %s does not carry", where, q, mm[1], name)
				}
			}
		}
		for _, g := range groupingRe.FindAllStringSubmatch(q, -1) {
			for l := range strings.SplitSeq(g[1], ",") {
				if l = strings.TrimSpace(l); l != "" && !labels[l] {
					t.Errorf("%s: %q groups by %s, which none of its series carries", where, q, l)
				}
			}
		}
		for _, lv := range labelValRe.FindAllStringSubmatch(q, -1) {
			if !series[lv[1]][lv[2]] {
				t.Errorf("%s: %q: %s has no label %s", where, q, lv[1], lv[2])
			}
		}
	}
	// The job queue and the checkpoints have panels of their own.
	for _, want := range []string{"jetfabric_jobs_total", "jetfabric_jobs_pending", "jetfabric_jobs_running",
		"jetfabric_device_checkpoint_last_seconds", "jetfabric_device_checkpoint_failures_total", "jetfabric_device_ops_total"} {
		if !used[want] {
			t.Errorf("no query of the dashboard shows %s", want)
		}
	}
	var unused []string
	for name := range series {
		if !used[name] {
			unused = append(unused, name)
		}
	}
	slices.Sort(unused)
	t.Logf("%d queries over %d of the %d exported series; not shown: %v", len(qs), len(used), len(series), unused)
}
