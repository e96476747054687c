// Package testkit holds the small helpers many test packages share: waiting
// for a condition, running a service for the length of a test, checking a
// validation error, comparing served routes with the API document, reading
// a counter of a metrics registry or a served /metrics page, running a
// service as the test binary's own program, stopping a child process, and
// a log buffer safe for concurrent writers.
package testkit

import (
	"bytes"
	"context"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Eventually waits until cond holds, checking every 20ms, and fails the
// test naming what it waited for when within passes first.
func Eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Go runs run (a service's Run) in a goroutine until the test ends: a
// cleanup cancels its context and waits for it to return. An error it
// returns fails the test, named by name.
func Go(t testing.TB, name string, run func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := run(ctx); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
}

// WaitReady waits until ready is closed (a service's Ready) and fails the
// test naming what when within passes first.
func WaitReady(t testing.TB, within time.Duration, what string, ready <-chan struct{}) {
	t.Helper()
	select {
	case <-ready:
	case <-time.After(within):
		t.Fatalf("%s not ready within %s", what, within)
	}
}

// Listen listens on network and address ("tcp", "127.0.0.1:0"; "unix",
// "@name") and accepts every connection only to close it, until the test
// ends: something a run under test may or may not reach. A cleanup closes
// the listener and waits for the accepting goroutine.
func Listen(t testing.TB, network, address string) net.Listener {
	t.Helper()
	ln, err := net.Listen(network, address)
	if err != nil {
		t.Fatalf("listen %s %s: %v", network, address, err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); <-done })
	return ln
}

// CheckErr checks the error of a validation, op: with no want it must be
// nil; otherwise it must be an error that mentions every string of want.
func CheckErr(t testing.TB, op string, err error, want ...string) {
	t.Helper()
	if len(want) == 0 {
		if err != nil {
			t.Fatalf("%s: %v", op, err)
		}
		return
	}
	if err == nil {
		t.Fatalf("%s: nil error, want %q", op, want)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not mention %q", err, w)
		}
	}
}

// SameRoutes fails the test for every route ("GET /v1/x") served but not
// in the API document and every route documented but not served.
func SameRoutes(t testing.TB, served, documented map[string]bool) {
	t.Helper()
	for r := range served {
		if !documented[r] {
			t.Errorf("%s is served but not in the OpenAPI document", r)
		}
	}
	for d := range documented {
		if !served[d] {
			t.Errorf("%s is documented but not served", d)
		}
	}
}

// Buffer is a bytes.Buffer that many goroutines may write while a test
// reads it: a logger's or a process's output.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns everything written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// StopProcess sends p sig and waits until exited is closed (by whoever
// waits for p); when grace passes first it kills p and waits on.
func StopProcess(p *os.Process, sig os.Signal, exited <-chan struct{}, grace time.Duration) {
	_ = p.Signal(sig)
	select {
	case <-exited:
	case <-time.After(grace):
		_ = p.Kill()
		<-exited
	}
}

// Counter sums the counter name of g over the series that carry every
// label of labels with its value (nil: every series), failing the test
// when g cannot be gathered.
func Counter(t testing.TB, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	var sum float64
	families, err := g.Gather()
	if err != nil {
		t.Fatalf("testkit: gather metrics: %v", err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			series := map[string]string{}
			for _, p := range m.GetLabel() {
				series[p.GetName()] = p.GetValue()
			}
			if carries(series, labels) {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// RegisteredCounter is Counter over every series of a counter g must
// already have (a plain counter is gathered from its creation): it fails
// the test when g has no metric of that name, so a renamed metric cannot
// read as a reassuring 0.
func RegisteredCounter(t testing.TB, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	families, err := g.Gather()
	if err != nil {
		t.Fatalf("testkit: gather metrics: %v", err)
	}
	for _, f := range families {
		if f.GetName() == name {
			return Counter(t, g, name, nil)
		}
	}
	t.Fatalf("testkit: no metric %s is registered", name)
	return 0
}

// carries reports whether series has every label of want with its value.
func carries(series, want map[string]string) bool {
	for k, v := range want {
		if got, ok := series[k]; !ok || got != v {
			return false
		}
	}
	return true
}
