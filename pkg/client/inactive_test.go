package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// A watch waiting on a quiet thread for longer than its consumer's
// inactive threshold still gets the thread's next event; once the watch
// ends, its consumer goes within about that threshold
// (docs/storage.md, "Consuming a stream").
func TestWatchOutlivesItsInactiveThreshold(t *testing.T) {
	const threshold = time.Second
	old := client.SetOrderedInactive(threshold)
	t.Cleanup(func() { client.SetOrderedInactive(old) })
	e := newEnv(t)
	d := e.dispatch(t.Context(), t, lifecycle.Request{Subagent: planner.Name})

	consumers := func() []*jetstream.ConsumerInfo {
		s, err := e.js.Stream(t.Context(), lifecycle.StreamLifecycle)
		if err != nil {
			t.Fatal(err)
		}
		var out []*jetstream.ConsumerInfo
		for ci := range s.ListConsumers(t.Context()).Info() {
			if ci.Config.Durable == "" {
				out = append(out, ci)
			}
		}
		return out
	}
	before := len(consumers())

	ctx, stop := context.WithCancel(t.Context())
	items := make(chan client.Item, 8)
	done := make(chan error, 1)
	go func() {
		for it, err := range e.c.Watch(ctx, client.Filter{DispatchID: d.DispatchID}) {
			if err != nil {
				done <- err
				return
			}
			items <- it
		}
		done <- nil
	}()
	testkit.Eventually(t, 10*time.Second, "the watch's ordered consumer", func() bool { return len(consumers()) > before })
	for _, ci := range consumers() {
		if ci.Config.InactiveThreshold != threshold {
			t.Errorf("ordered consumer %s: inactive threshold %s, want %s", ci.Name, ci.Config.InactiveThreshold, threshold)
		}
	}

	// Quiet for three thresholds: the server would have removed a consumer
	// nobody pulled from.
	quiet := time.NewTimer(3 * threshold)
	select {
	case it := <-items:
		t.Fatalf("an event on a quiet thread: %s", it.Event.Type())
	case err := <-done:
		t.Fatalf("the watch ended while quiet: %v", err)
	case <-quiet.C:
	}
	e.publishAsWorker(t, &lifecycle.Started{Common: d.Record.Common(), WorkerID: "w-1", Attempt: 1})
	select {
	case it := <-items:
		if it.Event.Type() != lifecycle.KindStarted.Type() {
			t.Errorf("the watch got %s, want started", it.Event.Type())
		}
	case err := <-done:
		t.Fatalf("the watch ended: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the event after the quiet spell never came")
	}

	stop()
	<-done
	testkit.Eventually(t, 10*threshold, "the ended watch's consumer to go", func() bool { return len(consumers()) == before })
}
