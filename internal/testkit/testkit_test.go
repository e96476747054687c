package testkit_test

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/internal/testkit"
)

// recorder is a testing.TB that records a failure instead of stopping.
type recorder struct {
	testing.TB
	failed atomic.Value
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.failed.Store(fmt.Sprintf(format, args...))
	panic(r)
}

func TestEventually(t *testing.T) {
	n := 0
	testkit.Eventually(t, 5*time.Second, "the third check", func() bool { n++; return n == 3 })
	if n != 3 {
		t.Fatalf("checked %d times, want 3", n)
	}
	r := &recorder{TB: t}
	func() {
		defer func() { _ = recover() }()
		testkit.Eventually(r, 50*time.Millisecond, "a condition that never holds", func() bool { return false })
	}()
	msg, _ := r.failed.Load().(string)
	if !strings.Contains(msg, "a condition that never holds: not within 50ms") {
		t.Fatalf("failure = %q", msg)
	}
}

func TestBufferConcurrentWrites(t *testing.T) {
	var b testkit.Buffer
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				_, _ = b.Write([]byte("x"))
			}
		})
	}
	wg.Wait()
	if got := len(b.String()); got != 800 {
		t.Fatalf("len = %d, want 800", got)
	}
}
