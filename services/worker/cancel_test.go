package worker_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/services/worker"
)

func TestCancelMidRun(t *testing.T) {
	h := newHarness(t, provision.Config{})
	h.startWorker(h.workerConfig(), worker.Deps{})
	marks := t.TempDir()
	// The agent records that it started, then sleeps; its child must die too.
	h.shell("sleeper", `sh -c 'sleep 60; :' "child-$AGORA_DISPATCH_ID" & touch "$MARKS/started"; wait`)
	id := h.dispatch(lifecycle.Request{Subagent: "sleeper", Env: map[string]string{"MARKS": marks}})
	waitFile(t, filepath.Join(marks, "started"))

	subj, _ := lifecycle.CancelSubject(id)
	body, _ := json.Marshal(map[string]string{"by": "alice", "reason": "wrong repo"})
	if err := h.nc.Publish(subj, body); err != nil {
		t.Fatal(err)
	}
	c := eventAs[*lifecycle.Cancelled](t, h.terminal(id))
	if c.By != "alice" || c.Reason != "wrong repo" {
		t.Errorf("cancelled = %+v, want by alice, reason 'wrong repo'", c)
	}
	h.assertOneTerminal(id)
	h.waitWorkEmpty()
	assertNoProcess(t, "child-"+id)
}

// A dispatch cancelled while still queued (the dispatcher publishes its
// terminal `cancelled`) is acked and never run.
func TestCancelledBeforeStartIsNotRun(t *testing.T) {
	h := newHarness(t, provision.Config{})
	marks := t.TempDir()
	h.shell("marker", `touch "$MARKS/ran"`)
	id := lifecycle.NewID()
	h.publishEvent(&lifecycle.Cancelled{Common: lifecycle.Common{DispatchID: id, ThreadID: id, Subagent: "marker"}, By: "bob"})
	h.dispatch(lifecycle.Request{DispatchID: id, Subagent: "marker", Env: map[string]string{"MARKS": marks}})
	svc := h.startWorker(h.workerConfig(), worker.Deps{})
	_ = svc
	h.waitWorkEmpty()
	if _, err := os.Stat(filepath.Join(marks, "ran")); err == nil {
		t.Fatal("the sub-agent ran although the dispatch was cancelled before it started")
	}
	if k := kinds(h.events(id)); len(k) != 1 || k[0] != lifecycle.KindCancelled {
		t.Fatalf("events = %v, want only the dispatcher's cancelled", k)
	}
}

// A redelivered dispatch that already has a terminal event is acked and
// skipped: no second run, no second terminal event.
func TestRedeliveryOfTerminalDispatchIsSkipped(t *testing.T) {
	for _, k := range []lifecycle.Kind{lifecycle.KindFinished, lifecycle.KindNeedsInput, lifecycle.KindFailed} {
		t.Run(string(k), func(t *testing.T) {
			h := newHarness(t, provision.Config{})
			marks := t.TempDir()
			h.shell("marker", `touch "$MARKS/ran"`)
			id := lifecycle.NewID()
			c := lifecycle.Common{DispatchID: id, ThreadID: id, Subagent: "marker"}
			switch k {
			case lifecycle.KindFinished:
				h.publishEvent(&lifecycle.Finished{Common: c})
			case lifecycle.KindNeedsInput:
				h.publishEvent(&lifecycle.NeedsInput{Common: c, QuestionID: lifecycle.QuestionID(id), Question: "q?"})
			case lifecycle.KindFailed:
				h.publishEvent(&lifecycle.Failed{Common: c, Reason: lifecycle.ReasonProviderFailed})
			}
			h.dispatch(lifecycle.Request{DispatchID: id, Subagent: "marker", Env: map[string]string{"MARKS": marks}})
			out := make(chan worker.Outcome, 1)
			svc, err := worker.New(h.workerConfig(), worker.Deps{Conn: h.srv.Conn(t), Logger: quietLogger()})
			if err != nil {
				t.Fatal(err)
			}
			go func() {
				o, err := svc.RunOnce(t.Context())
				if err != nil {
					t.Error(err)
				}
				out <- o
			}()
			select {
			case o := <-out:
				if !o.Skipped || o.Kind != k {
					t.Fatalf("outcome = %+v, want skipped with kind %s", o, k)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("RunOnce did not return")
			}
			h.waitWorkEmpty()
			if _, err := os.Stat(filepath.Join(marks, "ran")); err == nil {
				t.Fatal("an already-terminal dispatch ran again")
			}
			h.assertOneTerminal(id)
			if ks := kinds(h.events(id)); len(ks) != 1 {
				t.Fatalf("events = %v, want only the original terminal event", ks)
			}
		})
	}
}

func waitFile(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not appear within 30s", path)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A JetStream push consumer whose deliver subject is a live run's cancel
// subject (any user allowed to create consumers on AGORA_LIFECYCLE can
// make one) cannot cancel the run: each delivery keeps its stream subject,
// agora.lifecycle.…, which names no cancel, so the worker's cancel
// subscription receives it and drops it. The run finishes.
func TestPushConsumerAimedAtACancelSubjectCancelsNothing(t *testing.T) {
	h := newHarness(t, provision.Config{})
	h.startWorker(h.workerConfig(), worker.Deps{})
	marks := t.TempDir()
	h.shell("steady", `touch "$MARKS/started"; while [ ! -e "$MARKS/go" ]; do sleep 0.05; done; echo '{"ok":true}' > "$AGORA_OUTPUT_FILE"`)
	id := h.dispatch(lifecycle.Request{Subagent: "steady", Env: map[string]string{"MARKS": marks}})
	waitFile(t, filepath.Join(marks, "started"))

	subj, _ := lifecycle.CancelSubject(id)
	ctx := t.Context()
	if _, err := h.js.CreateOrUpdateConsumer(ctx, lifecycle.StreamLifecycle, jetstream.ConsumerConfig{
		Name: "aimed", DeliverSubject: subj, DeliverPolicy: jetstream.DeliverAllPolicy, AckPolicy: jetstream.AckNonePolicy,
	}); err != nil {
		t.Fatal(err)
	}
	// The consumer delivers every event of the stream (this run's accepted
	// and started among them) to the cancel subject; see them arrive there.
	seen := make(chan *nats.Msg, 64)
	sub, err := h.nc.ChanSubscribe(subj, seen)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	select {
	case m := <-seen:
		if m.Subject == subj {
			t.Fatalf("a delivery arrived with the cancel subject itself: %s", m.Subject)
		}
		t.Logf("a delivery on %s arrives with its stream subject %s", subj, m.Subject)
	case <-time.After(30 * time.Second):
		t.Fatal("the push consumer delivered nothing to the cancel subject")
	}
	if err := os.WriteFile(filepath.Join(marks, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	eventAs[*lifecycle.Finished](t, h.terminal(id))
	h.assertOneTerminal(id)
}
