// Package docs_test checks that docs/PROTOCOL.md, the protocol written out
// for clients in other languages, leaves out no op that a worker runs.
package docs_test

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/jetfabric/jetfabric/kernels"
)

// workerOpConst finds the ops the worker handles itself (session ops,
// transfers, collectives, replays): its constants op<Name> = "<name>".
var workerOpConst = regexp.MustCompile(`(?m)^\s*(?:const\s+)?op[A-Z][A-Za-z0-9]*\s*=\s*"([a-z0-9_]+)"`)

// workerOps reads the worker's op constants from its sources.
func workerOps(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("../worker/*.go")
	if err != nil {
		t.Fatal(err)
	}
	var ops []string
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range workerOpConst.FindAllStringSubmatch(string(b), -1) {
			ops = append(ops, m[1])
		}
	}
	// The session ops every worker has had since the first version: if the
	// constants are renamed, the test must still see them.
	for _, op := range []string{"upload", "read", "sync", "free", "seed", "close", "expose", "import"} {
		if !slices.Contains(ops, op) {
			t.Fatalf("no constant op... = %q in worker/*.go: the test's pattern is out of date", op)
		}
	}
	return ops
}

var backticked = regexp.MustCompile("`([a-z0-9_]+)`")

// tableOps returns the names in backticks in the first cell of every row of
// the op tables: the tables whose header's first cell is "op".
func tableOps(t *testing.T, doc string) map[string]bool {
	t.Helper()
	ops := map[string]bool{}
	inOpTable := false
	for line := range strings.Lines(doc) {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "|") {
			inOpTable = false
			continue
		}
		cells := strings.Split(line, "|")
		if len(cells) < 3 {
			continue
		}
		first := strings.TrimSpace(cells[1])
		switch {
		case first == "op":
			inOpTable = true
		case !inOpTable || strings.HasPrefix(first, "---"):
		default:
			for _, m := range backticked.FindAllStringSubmatch(first, -1) {
				ops[m[1]] = true
			}
		}
	}
	return ops
}

func TestEveryOpDocumented(t *testing.T) {
	b, err := os.ReadFile("PROTOCOL.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := tableOps(t, string(b))
	worker := workerOps(t)
	if len(documented) == 0 {
		t.Fatal("PROTOCOL.md has no op tables (tables whose first column is headed op)")
	}
	for _, name := range slices.Concat(kernels.OpNames(), worker) {
		if !documented[name] {
			t.Errorf("op %q runs on the worker but is in no op table of PROTOCOL.md", name)
		}
	}
	for name := range documented {
		if !kernels.Known(name) && !slices.Contains(worker, name) {
			t.Errorf("PROTOCOL.md's op tables name %q, which no worker runs", name)
		}
	}
}
