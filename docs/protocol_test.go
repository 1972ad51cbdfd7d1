// Package docs_test checks that docs/PROTOCOL.md, the protocol written out
// for clients in other languages, leaves out no op that a worker runs.
package docs_test

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/jetfabric/jetfabric/kernels"
)

// workerOps are the ops the worker handles itself, beside the kernels'
// op set: the session ops, transfers and collectives.
var workerOps = []string{
	"upload", "read", "sync", "free", "seed", "close", "checkpoint",
	"expose", "import", "all_reduce", "all_gather", "reduce_scatter", "broadcast",
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
	if len(documented) == 0 {
		t.Fatal("PROTOCOL.md has no op tables (tables whose first column is headed op)")
	}
	for _, name := range slices.Concat(kernels.OpNames(), workerOps) {
		if !documented[name] {
			t.Errorf("op %q runs on the worker but is in no op table of PROTOCOL.md", name)
		}
	}
	for name := range documented {
		if !kernels.Known(name) && !slices.Contains(workerOps, name) {
			t.Errorf("PROTOCOL.md's op tables name %q, which no worker runs", name)
		}
	}
}
