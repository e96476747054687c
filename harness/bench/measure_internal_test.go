package bench

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// A scenario whose every handler fails in the throughput phase ends the
// measurement with its error: the feed of ids does not wait for handlers
// that all stopped (a direct get answered by a replica that has no event
// yet once hung `agora bench --scale commit` so).
func TestMeasureReturnsAThroughputFailure(t *testing.T) {
	errBroken := errors.New("broken")
	throughput := false
	sc := scenario{
		name: "fails under load",
		do: func(context.Context, string) error {
			if throughput {
				return errBroken
			}
			return nil
		},
		phase: func(p string) { throughput = p == phaseThroughput },
	}
	done := make(chan error, 1)
	go func() {
		_, err := measure(t.Context(), sc, Config{Serial: 5, Throughput: 100, Concurrency: 4})
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, errBroken) || !strings.Contains(err.Error(), "fails under load") {
			t.Fatalf("measure: %v, want the scenario's error naming it", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("measure did not return within 30 s of every handler failing")
	}
}
