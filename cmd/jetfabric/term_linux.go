//go:build linux && (amd64 || arm64)

package main

import (
	"bytes"
	"io"
	"os"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

// Terminal ioctls, the same on amd64 and arm64.
const (
	ioctlGetTermios = 0x5401 // TCGETS
	ioctlSetTermios = 0x5402 // TCSETS
)

func termios(f *os.File, req uintptr, t *syscall.Termios) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var errno syscall.Errno
	if err := rc.Control(func(fd uintptr) {
		_, _, errno = syscall.Syscall(syscall.SYS_IOCTL, fd, req, uintptr(unsafe.Pointer(t)))
	}); err != nil {
		return err
	}
	if errno != 0 {
		return errno
	}
	return nil
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	var t syscall.Termios
	return termios(f, ioctlGetTermios, &t) == nil
}

// watchKeys puts the controlling terminal in non-canonical, no-echo mode
// and returns a channel closed when q is pressed, and a function that
// restores the terminal and stops the reader. Ctrl-C still raises SIGINT.
// Without a controlling terminal, the channel never closes.
func watchKeys() (<-chan struct{}, func()) {
	quit := make(chan struct{})
	tty, err := os.OpenFile("/dev/tty", os.O_RDWR, 0)
	if err != nil {
		return quit, func() {}
	}
	var old syscall.Termios
	if err := termios(tty, ioctlGetTermios, &old); err != nil {
		tty.Close()
		return quit, func() {}
	}
	raw := old
	raw.Lflag &^= syscall.ICANON | syscall.ECHO
	raw.Cc[syscall.VMIN], raw.Cc[syscall.VTIME] = 1, 0
	if err := termios(tty, ioctlSetTermios, &raw); err != nil {
		tty.Close()
		return quit, func() {}
	}
	var once sync.Once
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 64)
		for {
			n, err := tty.Read(buf)
			if n > 0 && bytes.ContainsAny(buf[:n], "qQ") {
				once.Do(func() { close(quit) })
			}
			if err != nil {
				return
			}
		}
	}()
	return quit, func() {
		_ = termios(tty, ioctlSetTermios, &old)
		// A terminal opened by name is pollable, so the deadline ends the
		// blocked read; otherwise the reader ends with the process.
		if tty.SetReadDeadline(time.Now()) == nil {
			<-done
		}
		tty.Close()
	}
}
