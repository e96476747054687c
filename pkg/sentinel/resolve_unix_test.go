//go:build unix

package sentinel_test

import (
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/pkg/sentinel"
)

// resolveWithin runs Resolve and fails the test if it does not return
// within d, so that a blocking open fails the test instead of hanging it.
func resolveWithin(t *testing.T, ws string, d time.Duration) sentinel.Resolution {
	t.Helper()
	type result struct {
		res sentinel.Resolution
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := sentinel.Resolve(ws)
		done <- result{res, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			t.Fatalf("Resolve: unexpected error %v", r.err)
		}
		return r.res
	case <-time.After(d):
		// Unblock the goroutine: opening the FIFO for writing completes a
		// blocked open for reading.
		if f, err := os.OpenFile(sentinel.Path(ws), os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			_ = f.Close()
		}
		t.Fatalf("Resolve did not return within %v", d)
	}
	panic("unreachable")
}

func TestResolveFIFODoesNotBlock(t *testing.T) {
	ws := newWorkspace(t)
	mkAgora(t, ws)
	if err := syscall.Mkfifo(sentinel.Path(ws), 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	res := resolveWithin(t, ws, 10*time.Second)
	wantMalformed(t, res, "", "not a regular file (fifo)")
}

func TestResolveSocket(t *testing.T) {
	ws := newWorkspace(t)
	mkAgora(t, ws)
	// Bind the socket through a short relative path: socket paths are
	// limited to about 100 bytes and t.TempDir can be longer.
	t.Chdir(filepath.Dir(sentinel.Path(ws)))
	l, err := net.Listen("unix", filepath.Base(sentinel.Path(ws)))
	if err != nil {
		t.Skipf("listen on a unix socket: %v", err)
	}
	t.Cleanup(func() { _ = l.Close() })
	res := resolveWithin(t, ws, 10*time.Second)
	wantMalformed(t, res, "", "not a regular file (socket)")
}

func TestResolveDevice(t *testing.T) {
	ws := newWorkspace(t)
	mkAgora(t, ws)
	// A node for /dev/zero; creating one needs privileges, so this test
	// skips where they are missing.
	if err := syscall.Mknod(sentinel.Path(ws), syscall.S_IFCHR|0o600, int(devZero())); err != nil {
		t.Skipf("mknod: %v", err)
	}
	res := resolveWithin(t, ws, 10*time.Second)
	wantMalformed(t, res, "", "not a regular file (character device)")
}

// devZero returns the device number of /dev/zero.
func devZero() uint64 {
	var st syscall.Stat_t
	if err := syscall.Stat("/dev/zero", &st); err != nil {
		return 0
	}
	return uint64(st.Rdev)
}
