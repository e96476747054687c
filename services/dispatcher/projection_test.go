package dispatcher_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	cloudevent "github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/services/dispatcher"
)

func TestProjection(t *testing.T) {
	h := newHarness(t, dispatcher.Config{})
	d := h.dispatchMicro(lifecycle.Request{Subagent: "planner"})
	c := d.Record.Common()
	acc := h.projected(d.DispatchID, d.DispatchID+".accepted")
	if acc.Status != lifecycle.KindAccepted || acc.AcceptedAt == nil {
		t.Fatalf("accepted record: %+v", acc)
	}

	h.publishAsWorker(&lifecycle.Started{Common: c, WorkerID: "w1", Attempt: 1})
	late := h.publishAsWorker(&lifecycle.Started{Common: c, WorkerID: "w2", Attempt: 2}) // a redelivery took over
	rec := h.projected(d.DispatchID, late.ID())
	if rec.Status != lifecycle.KindStarted || rec.Attempt != 2 || rec.WorkerID != "w2" || rec.StartedAt == nil {
		t.Errorf("started record: status %s attempt %d worker %s", rec.Status, rec.Attempt, rec.WorkerID)
	}

	fin := h.publishAsWorker(&lifecycle.Finished{Common: c, ExitCode: 0, DurationMS: 42, Output: json.RawMessage(`{"plan":"B"}`), StdoutTail: "ok"})
	rec = h.projected(d.DispatchID, fin.ID())
	if rec.Status != lifecycle.KindFinished || rec.EndedAt == nil || rec.Result == nil ||
		*rec.Result.ExitCode != 0 || rec.Result.DurationMS != 42 || string(rec.Result.Output) != `{"plan":"B"}` {
		t.Errorf("finished record: %+v %+v", rec, rec.Result)
	}
	// A started event applied after the terminal one does not reopen it.
	st3 := h.publishAsWorker(&lifecycle.Started{Common: c, WorkerID: "w3", Attempt: 3})
	rec = h.projected(d.DispatchID, st3.ID())
	if rec.Status != lifecycle.KindFinished || rec.Attempt != 3 {
		t.Errorf("after a late started: status %s attempt %d", rec.Status, rec.Attempt)
	}

	t.Run("needs_input and failed summaries", func(t *testing.T) {
		d := h.dispatchMicro(lifecycle.Request{Subagent: "planner"})
		ni := h.publishAsWorker(&lifecycle.NeedsInput{Common: d.Record.Common(), QuestionID: lifecycle.QuestionID(d.DispatchID), Question: "A or B?", Options: []string{"A", "B"}, ExitCode: 3})
		rec := h.projected(d.DispatchID, ni.ID())
		if rec.Status != lifecycle.KindNeedsInput || rec.Result.QuestionID != lifecycle.QuestionID(d.DispatchID) || rec.Result.Question != "A or B?" || *rec.Result.ExitCode != 3 {
			t.Errorf("needs_input record: %+v", rec.Result)
		}
		d = h.dispatchMicro(lifecycle.Request{Subagent: "planner"})
		code := 2
		f := h.publishAsWorker(&lifecycle.Failed{Common: d.Record.Common(), Reason: lifecycle.ReasonProviderFailed, Detail: "exit status 2", ExitCode: &code})
		rec = h.projected(d.DispatchID, f.ID())
		if rec.Status != lifecycle.KindFailed || rec.Result.Reason != lifecycle.ReasonProviderFailed || rec.Result.Detail != "exit status 2" || *rec.Result.ExitCode != 2 {
			t.Errorf("failed record: %+v", rec.Result)
		}
	})

	t.Run("a refused stream request gets a record and a thread", func(t *testing.T) {
		f := h.publishAsWorker(&lifecycle.Failed{Common: lifecycle.Common{DispatchID: "refused-1", ThreadID: "refused-1", Subagent: "planner"}, Reason: lifecycle.ReasonRejected, Detail: "input: must be a JSON object"})
		rec := h.projected("refused-1", f.ID())
		if rec.Status != lifecycle.KindFailed || rec.Result.Reason != lifecycle.ReasonRejected || rec.Request != nil || rec.Queued {
			t.Errorf("record: %+v", rec)
		}
		// The projection indexes the thread after it wrote the record.
		var th *client.Thread
		var err error
		h.eventually("thread refused-1 to be indexed", func() bool {
			th, err = h.cl.Thread(t.Context(), "refused-1")
			return !errors.Is(err, client.ErrNotFound)
		})
		if err != nil || len(th.Rounds) != 1 || len(th.Rounds[0].Events) != 1 {
			t.Errorf("thread: %+v %v", th, err)
		}
		// The same id through a synchronous door answers that record.
		again := h.dispatchMicro(lifecycle.Request{DispatchID: "refused-1", Subagent: "planner"})
		if again.Record.Status != lifecycle.KindFailed || len(h.queued("refused-1")) != 0 {
			t.Errorf("a refused id was dispatched later: %+v", again.Record)
		}
	})

	t.Run("unknown event types are skipped", func(t *testing.T) {
		e := cloudevent.New()
		e.SetID("odd-1")
		e.SetSource("/test")
		e.SetType("dev.agora.dispatch.exploded")
		_ = e.SetData(lifecycle.ContentTypeJSON, map[string]string{"dispatch_id": "odd"})
		msg, err := lifecycle.Encode("agora.lifecycle.started.odd.odd", e)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := h.js.PublishMsg(t.Context(), msg); err != nil {
			t.Fatal(err)
		}
		h.projectionIdle()
		if h.hasRecord("odd") {
			t.Error("an unknown event made a record")
		}
	})
}

// snapshot returns the KV revision of every key in agora_dispatches.
func (h *harness) snapshot() map[string]uint64 {
	h.t.Helper()
	kv := natstest.KeyValue(h.t, h.js, lifecycle.BucketDispatches)
	keys, err := kv.ListKeys(h.t.Context())
	if err != nil {
		h.t.Fatal(err)
	}
	out := map[string]uint64{}
	for k := range keys.Keys() {
		e, err := kv.Get(h.t.Context(), k)
		if err != nil {
			h.t.Fatal(err)
		}
		out[k] = e.Revision()
	}
	return out
}

func TestProjectionAfterRestart(t *testing.T) {
	h := newHarness(t, dispatcher.Config{})
	var ids []string
	for i := range 3 {
		d := h.dispatchMicro(lifecycle.Request{Subagent: "planner"})
		ids = append(ids, d.DispatchID)
		c := d.Record.Common()
		h.publishAsWorker(&lifecycle.Started{Common: c, WorkerID: "w", Attempt: 1})
		h.publishAsWorker(&lifecycle.Started{Common: c, WorkerID: "w", Attempt: 2})
		if i < 2 {
			h.publishAsWorker(&lifecycle.Finished{Common: c, Output: json.RawMessage(`null`)})
		}
	}
	h.projectionIdle()
	before := h.snapshot()
	if len(before) != 3 { // three records; a thread of one round has no index (docs/dispatcher.md)
		t.Fatalf("keys: %v", before)
	}

	t.Run("restart", func(t *testing.T) {
		h.stop()
		h.start(dispatcher.Config{})
		h.projectionIdle()
		if after := h.snapshot(); !equalMaps(before, after) {
			t.Errorf("records changed across a restart:\n%v\n%v", before, after)
		}
	})

	t.Run("full redelivery", func(t *testing.T) {
		// Rebuild the projection consumer from the start of the stream:
		// every event is delivered again.
		h.stop()
		if err := h.js.DeleteConsumer(t.Context(), lifecycle.StreamLifecycle, provision.ConsumerProjection); err != nil {
			t.Fatal(err)
		}
		if err := provision.Ensure(t.Context(), h.js, provision.Config{}); err != nil {
			t.Fatal(err)
		}
		c, err := h.js.Consumer(t.Context(), lifecycle.StreamLifecycle, provision.ConsumerProjection)
		if err != nil {
			t.Fatal(err)
		}
		if info, _ := c.Info(t.Context()); info.NumPending == 0 {
			t.Fatal("the new consumer has nothing to redeliver")
		}
		h.start(dispatcher.Config{})
		h.projectionIdle()
		if after := h.snapshot(); !equalMaps(before, after) {
			t.Errorf("a redelivery rewrote records:\n%v\n%v", before, after)
		}
		for i, id := range ids {
			rec, _ := h.record(id)
			// The record lists the last event of each kind (chain.go).
			if rec.Attempt != 2 || len(rec.Events) != 2+boolInt(i < 2) {
				t.Errorf("%s: attempt %d, %d events", id, rec.Attempt, len(rec.Events))
			}
		}
		// A consumer rebuilt from the stream's start delivers each event
		// once more, for the first time: the two finished are counted
		// once each (a redelivery, NumDelivered > 1, is not counted).
		_, data := h.do(http.MethodGet, "/metrics", "", "")
		if got := grepLines(string(data), "agora_dispatcher_dispatches_total{"); !strings.Contains(got, `kind="finished",reason=""} 2`) {
			t.Errorf("terminal events counted after the rebuild:\n%s\nwant the two finished once each", got)
		}
	})
}

func equalMaps(a, b map[string]uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func TestStatusAndThreadViews(t *testing.T) {
	h := newHarness(t, dispatcher.Config{})
	d0, d1 := h.twoRoundThread("view")
	h.projected(d1.DispatchID, d1.DispatchID+".accepted")

	resp, data := h.do(http.MethodGet, "/v1/dispatches/"+d0.DispatchID, "", "")
	var rec client.Record
	if resp.StatusCode != http.StatusOK || json.Unmarshal(data, &rec) != nil || rec.Status != lifecycle.KindNeedsInput {
		t.Errorf("GET dispatch: %d %s", resp.StatusCode, data)
	}
	resp, data = h.do(http.MethodGet, "/v1/threads/view", "", "")
	var th client.Thread
	if resp.StatusCode != http.StatusOK || json.Unmarshal(data, &th) != nil {
		t.Fatalf("GET thread: %d %s", resp.StatusCode, data)
	}
	if th.Status != lifecycle.KindAccepted || len(th.Rounds) != 2 || th.Rounds[0].Round != 0 || th.Rounds[1].Round != 1 {
		t.Fatalf("thread: %+v", th)
	}
	kinds := func(evs []lifecycle.Event) string {
		var k []string
		for _, e := range evs {
			k = append(k, strings.TrimPrefix(e.Type(), "dev.agora.dispatch."))
		}
		return strings.Join(k, ",")
	}
	if got := kinds(th.Rounds[0].Events); got != "accepted,needs_input" {
		t.Errorf("round 0 events: %s", got)
	}
	if got := kinds(th.Rounds[1].Events); got != "accepted" {
		t.Errorf("round 1 events: %s", got)
	}
	viaMicro, err := h.cl.Thread(t.Context(), "view")
	if err != nil || len(viaMicro.Rounds) != 2 || viaMicro.Latest().DispatchID != d1.DispatchID {
		t.Errorf("micro thread: %+v %v", viaMicro, err)
	}
	st, err := h.cl.Status(t.Context(), d1.DispatchID)
	if err != nil || st.Round != 1 || st.ParentID != d0.DispatchID || st.Request.QuestionID != lifecycle.QuestionID(d0.DispatchID) {
		t.Errorf("micro status: %+v %v", st, err)
	}
	for _, path := range []string{"/v1/dispatches/nope", "/v1/threads/nope"} {
		if resp, _ := h.do(http.MethodGet, path, "", ""); resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s: %d", path, resp.StatusCode)
		}
	}
	if resp, _ := h.do(http.MethodGet, "/v1/dispatches/bad.id", "", ""); resp.StatusCode != http.StatusUnprocessableEntity {
		t.Errorf("GET an invalid id: %d", resp.StatusCode)
	}
}

// A thread of one round has no index: its root, the record under the
// thread's id, answers the thread view and a thread cancel. The index is
// written with the second round and lists the root first. An id that is a
// later round of another thread is no thread.
func TestOneRoundThreadHasNoIndex(t *testing.T) {
	h := newHarness(t, dispatcher.Config{})
	kv := natstest.KeyValue(t, h.js, lifecycle.BucketDispatches)
	indexed := func(thread string) bool {
		_, err := kv.Get(t.Context(), "thread."+thread)
		if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Fatal(err)
		}
		return err == nil
	}
	d := h.dispatchMicro(lifecycle.Request{DispatchID: "solo", Subagent: "planner"})
	h.publishAsWorker(&lifecycle.Started{Common: d.Record.Common(), WorkerID: "w", Attempt: 1})
	fin := h.publishAsWorker(&lifecycle.Finished{Common: d.Record.Common(), Output: json.RawMessage(`null`)})
	h.projected("solo", fin.ID())
	if indexed("solo") {
		t.Error("a thread of one round has an index")
	}
	th, err := h.cl.Thread(t.Context(), "solo")
	if err != nil || len(th.Rounds) != 1 || th.Rounds[0].DispatchID != "solo" || th.Status != lifecycle.KindFinished {
		t.Fatalf("thread of one round: %+v %v", th, err)
	}
	if got := len(th.Rounds[0].Events); got != 3 {
		t.Errorf("the round lists %d events, want accepted, started, finished", got)
	}

	running := h.dispatchMicro(lifecycle.Request{DispatchID: "solo-running", Subagent: "planner"})
	th, err = h.cl.CancelThread(t.Context(), "solo-running", client.CancelBy("carol", "done"))
	if err != nil || len(th.Rounds) != 1 || th.Status != lifecycle.KindCancelled {
		t.Fatalf("cancel a thread of one round: %+v %v", th, err)
	}
	if rec, _ := h.record(running.DispatchID); rec.Status != lifecycle.KindCancelled {
		t.Errorf("the root is %s after its thread was cancelled", rec.Status)
	}

	d0, d1 := h.twoRoundThread("duo")
	if !indexed("duo") {
		t.Fatal("a thread with a second round has no index")
	}
	th, err = h.cl.Thread(t.Context(), "duo")
	if err != nil || len(th.Rounds) != 2 || th.Rounds[0].DispatchID != d0.DispatchID || th.Rounds[1].DispatchID != d1.DispatchID {
		t.Fatalf("thread of two rounds: %+v %v", th, err)
	}
	if resp, data := h.do(http.MethodGet, "/v1/threads/"+d1.DispatchID, "", ""); resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET /v1/threads/<a later round's id>: %d %s, want 404", resp.StatusCode, data)
	}
}
