package testkit_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/agora-dispatch/agora/internal/testkit"
)

// recorder is a testing.TB that records a failure instead of stopping:
// Fatalf records and panics (recover it), Errorf records.
type recorder struct {
	testing.TB
	failed atomic.Value
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.failed.Store(fmt.Sprintf(format, args...))
	panic(r)
}
func (r *recorder) Errorf(format string, args ...any) { r.failed.Store(fmt.Sprintf(format, args...)) }

// failure runs f on a recorder and returns the failure it recorded.
func failure(t *testing.T, f func(tb testing.TB)) string {
	r := &recorder{TB: t}
	func() {
		defer func() { _ = recover() }()
		f(r)
	}()
	msg, _ := r.failed.Load().(string)
	return msg
}

func TestEventually(t *testing.T) {
	n := 0
	testkit.Eventually(t, 5*time.Second, "the third check", func() bool { n++; return n == 3 })
	if n != 3 {
		t.Fatalf("checked %d times, want 3", n)
	}
	msg := failure(t, func(tb testing.TB) {
		testkit.Eventually(tb, 50*time.Millisecond, "a condition that never holds", func() bool { return false })
	})
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

func TestGoStopsWhenTheTestEnds(t *testing.T) {
	var stopped atomic.Bool
	t.Run("service", func(t *testing.T) {
		testkit.Go(t, "svc", func(ctx context.Context) error {
			<-ctx.Done()
			stopped.Store(true)
			return nil
		})
	})
	if !stopped.Load() {
		t.Fatal("Run still running after the test ended")
	}
	var msg string
	t.Run("failing service", func(t *testing.T) {
		r := &recorder{TB: t}
		// Registered first, so it runs after Go's cleanup waited.
		t.Cleanup(func() { msg, _ = r.failed.Load().(string) })
		testkit.Go(r, "svc", func(context.Context) error { return errors.New("boom") })
	})
	if msg != "svc: boom" {
		t.Fatalf("failure = %q, want svc: boom", msg)
	}
}

func TestWaitReady(t *testing.T) {
	ready := make(chan struct{})
	close(ready)
	testkit.WaitReady(t, time.Second, "closed", ready)
	msg := failure(t, func(tb testing.TB) { testkit.WaitReady(tb, 50*time.Millisecond, "the service", make(chan struct{})) })
	if msg != "the service not ready within 50ms" {
		t.Fatalf("failure = %q", msg)
	}
}

func TestCheckErr(t *testing.T) {
	two := errors.New("a: first\na: second")
	for _, tc := range []struct {
		name string
		err  error
		want []string
		fail string
	}{
		{"valid", nil, nil, ""},
		{"every problem named", two, []string{"first", "second"}, ""},
		{"unexpected error", two, nil, "Validate: a: first\na: second"},
		{"no error", nil, []string{"first"}, `Validate: nil error, want ["first"]`},
		{"a problem not named", two, []string{"first", "third"}, `error "a: first\na: second" does not mention "third"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := failure(t, func(tb testing.TB) { testkit.CheckErr(tb, "Validate", tc.err, tc.want...) }); got != tc.fail {
				t.Errorf("failure = %q, want %q", got, tc.fail)
			}
		})
	}
}

func TestSameRoutes(t *testing.T) {
	testkit.SameRoutes(t, map[string]bool{"GET /a": true}, map[string]bool{"GET /a": true})
	var got []string
	r := &routeRecorder{TB: t, got: &got}
	testkit.SameRoutes(r, map[string]bool{"GET /a": true, "GET /b": true}, map[string]bool{"GET /a": true, "PUT /c": true})
	slices.Sort(got)
	want := []string{"GET /b is served but not in the OpenAPI document", "PUT /c is documented but not served"}
	if !slices.Equal(got, want) {
		t.Errorf("failures %q, want %q", got, want)
	}
}

// routeRecorder records every Errorf.
type routeRecorder struct {
	testing.TB
	got *[]string
}

func (r *routeRecorder) Helper() {}
func (r *routeRecorder) Errorf(format string, args ...any) {
	*r.got = append(*r.got, fmt.Sprintf(format, args...))
}

// Listen accepts a connection and closes it; once its test has ended,
// nothing listens there any more.
func TestListen(t *testing.T) {
	var addr string
	t.Run("listening", func(t *testing.T) {
		ln := testkit.Listen(t, "tcp", "127.0.0.1:0")
		addr = ln.Addr().String()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("dial the listener: %v", err)
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if n, err := c.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
			t.Errorf("read from an accepted connection = %d, %v; want it closed (EOF)", n, err)
		}
	})
	if c, err := net.Dial("tcp", addr); err == nil {
		c.Close()
		t.Errorf("%s still accepts after its test ended", addr)
	}
}

func TestCounter(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "calls_total", Help: "calls"}, []string{"method", "result"})
	reg.MustRegister(c)
	c.WithLabelValues("get", "ok").Add(2)
	c.WithLabelValues("get", "error").Inc()
	c.WithLabelValues("put", "ok").Add(4)
	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"calls_total", nil, 7},
		{"calls_total", map[string]string{"method": "get"}, 3},
		{"calls_total", map[string]string{"method": "get", "result": "ok"}, 2},
		{"calls_total", map[string]string{"route": "x"}, 0},
		{"other_total", nil, 0},
	} {
		if got := testkit.Counter(t, reg, tc.name, tc.labels); got != tc.want {
			t.Errorf("Counter(%s, %v) = %v, want %v", tc.name, tc.labels, got, tc.want)
		}
	}
}
