package sandbox_test

import (
	"context"
	"net"
	"os"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agora-dispatch/agora/internal/sandbox"
)

// TestProxyListenerClosedOnce: the proxy's listener a run's launcher sends
// back is closed once. Closed twice (by its number, then by the finalizer
// of a file that still held that number), the second close hits whatever
// the worker opened next under the number — a spare launcher's socket, and
// the next run failed "start: bad file descriptor" (docs/sandbox.md,
// "Attack → layer → test").
func TestProxyListenerClosedOnce(t *testing.T) {
	l, err := sandbox.NewMode(sandbox.Options{}, sandbox.ModeNamespaces)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	defer l.Close()
	served := make(chan struct{}, 1)
	r := l.Run(context.Background(), sandbox.Spec{Path: "/bin/true", Args: []string{"true"}, Dir: "/", KillGrace: time.Second,
		Policy: sandbox.Policy{Loopback: true, ProxyPort: 3128},
		Proxy: func(ctx context.Context, ln net.Listener) {
			served <- struct{}{}
			<-ctx.Done()
		}})
	if r.Err != nil || r.ExitCode != 0 {
		t.Fatalf("run: %+v", r)
	}
	select {
	case <-served:
	default:
		t.Fatal("the run's proxy listener never reached the worker")
	}
	// Files opened now take the lowest free numbers, the listener's
	// among them.
	var files []*os.File
	for range 256 {
		f, err := os.Open(os.DevNull)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		files = append(files, f)
	}
	// Let every finalizer of what the run left run: a finalizer queued in
	// a later collection runs after those queued before it.
	for range 3 {
		done := make(chan struct{})
		x := new([64]byte)
		runtime.SetFinalizer(x, func(*[64]byte) { close(done) })
		x = nil
		runtime.GC()
		<-done
	}
	for _, f := range files {
		var st unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err != nil {
			t.Fatalf("descriptor %d, opened after the run, was closed under us: %v", f.Fd(), err)
		}
	}
}
