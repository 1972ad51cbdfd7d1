//go:build linux && (amd64 || arm64)

package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/jetfabric/jetfabric/broker/brokertest"
)

// openPTY returns the controller and the terminal side of a new
// pseudo-terminal (Linux /dev/ptmx).
func openPTY(t *testing.T) (ptm, pts *os.File) {
	t.Helper()
	ptm, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals: %v", err)
	}
	var n, unlock uint32
	ioctl := func(req uintptr, arg *uint32) error {
		rc, err := ptm.SyscallConn()
		if err != nil {
			return err
		}
		var errno syscall.Errno
		if err := rc.Control(func(fd uintptr) {
			_, _, errno = syscall.Syscall(syscall.SYS_IOCTL, fd, req, uintptr(unsafe.Pointer(arg)))
		}); err != nil {
			return err
		}
		if errno != 0 {
			return errno
		}
		return nil
	}
	if err := ioctl(syscall.TIOCSPTLCK, &unlock); err != nil {
		t.Fatal(err)
	}
	if err := ioctl(syscall.TIOCGPTN, &n); err != nil {
		t.Fatal(err)
	}
	pts, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	return ptm, pts
}

// TestTopTerminal runs top on a pseudo-terminal: it draws in place with
// ANSI sequences and quits on q, restoring the cursor.
func TestTopTerminal(t *testing.T) {
	b := brokertest.Run(t)
	startWorker(t, b.ClientURL())
	ptm, pts := openPTY(t)
	defer ptm.Close()

	cmd := exec.Command(os.Args[0], "top", "--url", b.ClientURL(), "--interval", "100ms")
	cmd.Env = append(os.Environ(), "JETFABRIC_TEST_MAIN=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = pts, pts, pts
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pts.Close()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	var screen output // what the terminal shows
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		_, _ = io.Copy(&screen, ptm) // ends with EIO once the program exits
	}()

	deadline := time.Now().Add(time.Minute)
	for strings.Count(screen.String(), ansiHome) < 3 || !strings.Contains(screen.String(), "cpu-0") {
		if time.Now().After(deadline) {
			t.Fatalf("no refreshes on the terminal:\n%q", screen.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := ptm.Write([]byte("q")); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		exited <- err
		if err != nil {
			t.Fatalf("top: %v\n%q", err, screen.String())
		}
	case <-time.After(time.Minute):
		t.Fatalf("top did not quit on q:\n%q", screen.String())
	}
	select { // the rest of the screen, up to EIO once the terminal side is closed
	case <-copied:
	case <-time.After(5 * time.Second):
	}
	out := screen.String()
	for _, want := range []string{ansiHide, ansiClear, ansiClearEOL, "q quits", "serving", ansiShow} {
		if !strings.Contains(out, want) {
			t.Errorf("screen lacks %q", want)
		}
	}
	if strings.Contains(out, "\nq") || strings.HasSuffix(strings.TrimSuffix(out, ansiShow), "q") {
		t.Errorf("the q was echoed: %q", out)
	}
}
