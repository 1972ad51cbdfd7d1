package mnist

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Rows and Cols are the size of an MNIST image; Classes the number of labels.
const (
	Rows    = 28
	Cols    = 28
	Classes = 10
)

// The file names of the four parts, as the module ships them.
const (
	TrainImages = "train-images-idx3-ubyte.gz"
	TrainLabels = "train-labels-idx1-ubyte.gz"
	TestImages  = "t10k-images-idx3-ubyte.gz"
	TestLabels  = "t10k-labels-idx1-ubyte.gz"
)

// Set is one part of MNIST: N images of Rows x Cols bytes (0 background,
// 255 ink), row-major one after another, and their labels.
type Set struct {
	N      int
	Images []byte // N*Rows*Cols
	Labels []byte // N, each below Classes
}

// Image is image i's Rows*Cols bytes.
func (s *Set) Image(i int) []byte { return s.Images[i*Rows*Cols : (i+1)*Rows*Cols] }

// Head is the first n examples of s (all of them if n <= 0 or n >= N),
// sharing s's memory.
func (s *Set) Head(n int) *Set {
	if n <= 0 || n >= s.N {
		return s
	}
	return &Set{N: n, Images: s.Images[:n*Rows*Cols], Labels: s.Labels[:n]}
}

// LabelsI64 is the labels as int64s, the dtype of a class target.
func (s *Set) LabelsI64() []int64 {
	out := make([]int64, s.N)
	for i, l := range s.Labels {
		out[i] = int64(l)
	}
	return out
}

// Load reads the training and test sets from dir (see DefaultDir). It
// fails with an error wrapping ErrNotFound, which says how to get the
// files, when one is missing, and wrapping ErrFormat when one is malformed.
func Load(dir string) (train, test *Set, err error) {
	if train, err = ReadSet(filepath.Join(dir, TrainImages), filepath.Join(dir, TrainLabels)); err != nil {
		return nil, nil, err
	}
	if test, err = ReadSet(filepath.Join(dir, TestImages), filepath.Join(dir, TestLabels)); err != nil {
		return nil, nil, err
	}
	return train, test, nil
}

// ReadSet reads an image file and its label file (gzipped or not) and
// checks that they agree: the images are Rows x Cols, there are as many
// labels as images, and every label is below Classes.
func ReadSet(imagesPath, labelsPath string) (*Set, error) {
	img, err := readFile(imagesPath, 3)
	if err != nil {
		return nil, err
	}
	if img.Dims[1] != Rows || img.Dims[2] != Cols {
		return nil, fmt.Errorf("%w: %s: images of %dx%d: want %dx%d", ErrFormat, imagesPath, img.Dims[1], img.Dims[2], Rows, Cols)
	}
	lab, err := readFile(labelsPath, 1)
	if err != nil {
		return nil, err
	}
	if lab.Dims[0] != img.Dims[0] {
		return nil, fmt.Errorf("%w: %s holds %d labels, %s %d images", ErrFormat, labelsPath, lab.Dims[0], imagesPath, img.Dims[0])
	}
	for i, l := range lab.Data {
		if l >= Classes {
			return nil, fmt.Errorf("%w: %s: label %d of example %d: want 0 to %d", ErrFormat, labelsPath, l, i, Classes-1)
		}
	}
	return &Set{N: img.Dims[0], Images: img.Data, Labels: lab.Data}, nil
}

func readFile(path string, ndims int) (*IDX, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s does not exist (%s)", ErrNotFound, path, Hint)
	}
	if err != nil {
		return nil, fmt.Errorf("mnist: %w", err)
	}
	defer f.Close()
	x, err := ReadIDX(f, ndims)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return x, nil
}
