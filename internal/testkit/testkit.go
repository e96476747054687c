// Package testkit holds the small helpers many test packages share: waiting
// for a condition and a log buffer safe for concurrent writers.
package testkit

import (
	"bytes"
	"sync"
	"testing"
	"time"
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
