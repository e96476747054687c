package dispatcher_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/services/dispatcher"
)

// Queueing fails after the record was created (here the work stream is
// gone; in production a stream leader election): the 503 names the
// dispatch id, no work is queued, and a retry with that id
// completes the same dispatch — one record, one work message.
func TestQueueFailureAnswersTheDispatchID(t *testing.T) {
	h := newHarness(t, dispatcher.Config{})
	if err := h.js.DeleteStream(t.Context(), lifecycle.StreamDispatch); err != nil {
		t.Fatal(err)
	}
	resp, body := h.do(http.MethodPost, "/v1/dispatches", `{"subagent":"planner","input":{"task":"t"}}`, "")
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("status %d %s, want 503", resp.StatusCode, body)
	}
	var p client.Problem
	if err := json.Unmarshal(body, &p); err != nil || p.DispatchID == "" {
		t.Fatalf("problem %s does not name the dispatch id (%v)", body, err)
	}
	if err := provision.Ensure(t.Context(), h.js, provision.Config{}); err != nil {
		t.Fatal(err)
	}
	if rec, _ := h.record(p.DispatchID); rec.Status != lifecycle.KindAccepted || rec.Queued {
		t.Fatalf("record %s is %s, queued %v; want accepted, its work not queued", p.DispatchID, rec.Status, rec.Queued)
	}
	resp, body = h.do(http.MethodPost, "/v1/dispatches", `{"dispatch_id":"`+p.DispatchID+`","subagent":"planner","input":{"task":"t"}}`, "")
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusAccepted {
		t.Fatalf("retry with the id: status %d %s", resp.StatusCode, body)
	}
	if n := len(h.queued(p.DispatchID)); n != 1 {
		t.Fatalf("%d work messages for %s, want 1", n, p.DispatchID)
	}
}

// The Go client makes the id before its first attempt and names it when
// it gives up, so a retry is the same dispatch.
func TestClientDispatchNamesItsID(t *testing.T) {
	h := newHarness(t, dispatcher.Config{})
	h.stop()
	ctx, cancel := context.WithTimeout(t.Context(), waitFor)
	defer cancel()
	_, err := h.cl.Dispatch(ctx, lifecycle.Request{Subagent: "planner"})
	var de *client.DispatchError
	if !errors.As(err, &de) || de.DispatchID == "" || !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("err = %v, want a *DispatchError naming the id and matching ErrUnavailable", err)
	}
	h.start(dispatcher.Config{})
	d, err := h.cl.Dispatch(ctx, lifecycle.Request{DispatchID: de.DispatchID, Subagent: "planner"})
	if err != nil || d.DispatchID != de.DispatchID {
		t.Fatalf("retry with the id: %v %+v", err, d)
	}
}

// A dispatcher killed between the record's creation and the queue publish
// leaves a record nobody will retry: the reconciler of any replica queues
// it after the grace period, once, also with two replicas racing.
func TestReconcilerQueuesInterruptedAcceptance(t *testing.T) {
	h := newHarness(t, dispatcher.Config{ReconcileGrace: 200 * time.Millisecond})
	id := lifecycle.NewID()
	req := lifecycle.Request{DispatchID: id, ThreadID: id, Subagent: "planner", Input: json.RawMessage(`{}`), SubagentRevision: 1, Timeout: "5m", MaxRounds: 3}
	created := time.Now().Add(-time.Minute).UTC()
	rec := client.Record{DispatchID: id, ThreadID: id, Subagent: "planner", SubagentRevision: 1, Status: lifecycle.KindAccepted,
		Request: &req, CreatedAt: created, AcceptedAt: &created, UpdatedAt: created}
	kv := natstest.KeyValue(t, h.js, lifecycle.BucketDispatches)
	if _, err := kv.Create(t.Context(), id, []byte(mustJSON(t, rec))); err != nil {
		t.Fatal(err)
	}
	h.start(dispatcher.Config{ReconcileGrace: 200 * time.Millisecond, ID: "second"})
	h.eventually("the work is queued", func() bool { return len(h.queued(id)) > 0 })
	time.Sleep(time.Second) // more passes of both replicas
	if n := len(h.queued(id)); n != 1 {
		t.Fatalf("%d work messages for %s, want 1", n, id)
	}
	if _, d := h.waitEvent(lifecycle.LifecycleFilter(lifecycle.KindAccepted, id, id)); d == nil {
		t.Fatal("no accepted event")
	}
}

// A pass reads every record written since the last one, batch after
// batch: interrupted acceptances before and after 600 other writes are
// both completed.
func TestReconcilerReadsEveryBatch(t *testing.T) {
	h := newHarness(t, dispatcher.Config{ReconcileGrace: 200 * time.Millisecond})
	kv := natstest.KeyValue(t, h.js, lifecycle.BucketDispatches)
	created := time.Now().Add(-time.Minute).UTC()
	write := func(status lifecycle.Kind) string {
		t.Helper()
		id := lifecycle.NewID()
		req := lifecycle.Request{DispatchID: id, ThreadID: id, Subagent: "planner", Input: json.RawMessage(`{}`), SubagentRevision: 1, Timeout: "5m", MaxRounds: 3}
		rec := stored{Record: client.Record{DispatchID: id, ThreadID: id, Subagent: "planner", SubagentRevision: 1, Status: status,
			Request: &req, CreatedAt: created, AcceptedAt: &created, UpdatedAt: created}}
		if _, err := kv.Create(t.Context(), id, []byte(mustJSON(t, rec))); err != nil {
			t.Fatal(err)
		}
		return id
	}
	first := write(lifecycle.KindAccepted)
	for range 600 {
		write(lifecycle.KindFinished)
	}
	last := write(lifecycle.KindAccepted)
	h.start(dispatcher.Config{ReconcileGrace: 200 * time.Millisecond, ID: "batches"})
	for _, id := range []string{first, last} {
		h.eventually("the work of "+id+" is queued", func() bool { return len(h.queued(id)) > 0 })
		if n := len(h.queued(id)); n != 1 {
			t.Errorf("%d work messages for %s, want 1", n, id)
		}
	}
}

// Past the work stream's duplicate window, completing an acceptance again
// (a retry, the reconciler) looks for its work message on AGORA_DISPATCH
// first (docs/storage.md, "The dispatch record and the reconciler"): a
// dispatch still waiting in the queue is not queued twice, and one whose
// work is missing is queued.
func TestCompletingAnOldAcceptanceLooksForItsWork(t *testing.T) {
	h := newHarness(t, dispatcher.Config{})
	// A short duplicate window, so that only the look keeps a second copy
	// out.
	st, err := h.js.Stream(t.Context(), lifecycle.StreamDispatch)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	cfg.Duplicates = 300 * time.Millisecond
	if _, err := h.js.UpdateStream(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		queued bool
	}{{"still waiting in the queue", true}, {"its work never queued", false}} {
		t.Run(tc.name, func(t *testing.T) {
			id := lifecycle.NewID()
			created := time.Now().Add(-2 * time.Hour)
			h.interruptedRecordAt(id, created)
			rec, _ := h.storedRecord(id)
			// Its accepted event is stored, so completing it again only
			// queues the work.
			if _, msg, err := lifecycle.Message(lifecycle.Source("dispatcher", "test"), &lifecycle.Accepted{Common: rec.Common()}, lifecycle.WithTime(created)); err != nil {
				t.Fatal(err)
			} else if _, err := h.js.PublishMsg(t.Context(), msg); err != nil {
				t.Fatal(err)
			}
			if tc.queued {
				e, err := lifecycle.New(lifecycle.Source("dispatcher", "test"), rec.Request)
				if err != nil {
					t.Fatal(err)
				}
				msg, err := lifecycle.Encode("agora.dispatch.planner", e)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := h.js.PublishMsg(t.Context(), msg); err != nil {
					t.Fatal(err)
				}
				// The window is time: it has to pass.
				time.Sleep(2 * cfg.Duplicates)
			}
			h.dispatchMicro(lifecycle.Request{DispatchID: id, Subagent: "planner", Input: json.RawMessage(`{"from":"first"}`)})
			if n := len(h.queued(id)); n != 1 {
				t.Errorf("%d work messages for %s, want 1", n, id)
			}
		})
	}
}
