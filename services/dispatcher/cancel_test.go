package dispatcher_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/provision"

	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/services/dispatcher"
)

// subscribeCore records core messages on subject.
func (h *harness) subscribeCore(subject string) chan *nats.Msg {
	h.t.Helper()
	ch := make(chan *nats.Msg, 8)
	sub, err := h.nc.ChanSubscribe(subject, ch)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := h.nc.Flush(); err != nil {
		h.t.Fatal(err)
	}
	return ch
}

func receive(t *testing.T, ch chan *nats.Msg) *nats.Msg {
	t.Helper()
	select {
	case m := <-ch:
		return m
	case <-time.After(waitFor):
		t.Fatal("no message")
		return nil
	}
}

func TestCancelQueuedDispatch(t *testing.T) {
	h := newHarness(t, dispatcher.Config{})
	d := h.dispatchMicro(lifecycle.Request{DispatchID: "c-queued", Subagent: "planner"})
	signal := h.subscribeCore("agora.control.cancel.c-queued")

	rec, err := h.cl.Cancel(t.Context(), d.DispatchID, client.CancelBy("alice", "not needed"))
	if err != nil {
		t.Fatal(err)
	}
	if rec.Status != lifecycle.KindCancelled || rec.Result == nil || rec.Result.By != "alice" || rec.Result.Detail != "not needed" || rec.EndedAt == nil {
		t.Fatalf("record: %+v", rec)
	}
	e, data := h.waitEvent(lifecycle.LifecycleFilter(lifecycle.KindCancelled, d.ThreadID, d.DispatchID))
	if e.ID() != lifecycle.TerminalID(d.DispatchID) {
		t.Errorf("cancelled event id %q, want %q", e.ID(), lifecycle.TerminalID(d.DispatchID))
	}
	if c := data.(*lifecycle.Cancelled); c.By != "alice" || c.Reason != "not needed" {
		t.Errorf("cancelled: %+v", c)
	}
	if lifecycle.TraceID(lifecycle.Traceparent(e)) != lifecycle.TraceID(d.Record.Traceparent) {
		t.Errorf("cancelled event is not on the dispatch's trace")
	}
	var body lifecycle.CancelRequest
	if err := json.Unmarshal(receive(t, signal).Data, &body); err != nil || body.DispatchID != d.DispatchID || body.By != "alice" {
		t.Errorf("cancel signal: %+v %v", body, err)
	}
	// The work message stays for the worker that pulls it to skip.
	if q := h.queued(d.DispatchID); len(q) != 1 {
		t.Errorf("%d queued messages, want the one a worker will skip", len(q))
	}

	t.Run("idempotent", func(t *testing.T) {
		again, err := h.cl.Cancel(t.Context(), d.DispatchID, client.CancelBy("bob", ""))
		if err != nil {
			t.Fatal(err)
		}
		if again.Status != lifecycle.KindCancelled || again.Result.By != "alice" {
			t.Errorf("second cancel changed the record: %+v", again.Result)
		}
		resp, data := h.do(http.MethodPost, "/v1/dispatches/c-queued/cancel", "", "")
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(data), `"alice"`) {
			t.Errorf("http cancel: %d %s", resp.StatusCode, data)
		}
		h.projectionIdle()
		if n := h.count(lifecycle.StreamLifecycle, "agora.lifecycle.cancelled.c-queued.c-queued"); n != 1 {
			t.Errorf("%d cancelled events, want 1", n)
		}
		rec, _ := h.record(d.DispatchID)
		n := 0
		for _, r := range rec.Events {
			if r.Kind == lifecycle.KindCancelled {
				n++
			}
		}
		if n != 1 {
			t.Errorf("the cancelled event is applied %d times", n)
		}
	})
}

func TestCancelRunningDispatchSignalsTheWorker(t *testing.T) {
	h := newHarness(t, dispatcher.Config{})
	d := h.dispatchMicro(lifecycle.Request{Subagent: "planner"})
	st := h.publishAsWorker(&lifecycle.Started{Common: d.Record.Common(), WorkerID: "w1", Attempt: 1})
	h.projected(d.DispatchID, st.ID())
	signal := h.subscribeCore("agora.control.cancel." + d.DispatchID)
	resp, data := h.do(http.MethodPost, "/v1/dispatches/"+d.DispatchID+"/cancel", `{"by":"ops","reason":"stuck"}`, "")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, data)
	}
	var rec client.Record
	_ = json.Unmarshal(data, &rec)
	if rec.Status != lifecycle.KindCancelled || rec.Attempt != 1 || rec.WorkerID != "w1" || rec.Result.By != "ops" {
		t.Errorf("record: %+v", rec)
	}
	receive(t, signal)
}

func TestCancelEndedDispatchIsUnchanged(t *testing.T) {
	h := newHarness(t, dispatcher.Config{})
	d := h.dispatchMicro(lifecycle.Request{Subagent: "planner"})
	fin := h.publishAsWorker(&lifecycle.Finished{Common: d.Record.Common(), ExitCode: 0, Output: json.RawMessage(`{"ok":true}`)})
	h.projected(d.DispatchID, fin.ID())
	h.projectionIdle() // the thread's end wrote the record's expiry
	before, _ := h.record(d.DispatchID)
	signal := h.subscribeCore("agora.control.cancel." + d.DispatchID)
	rec, err := h.cl.Cancel(t.Context(), d.DispatchID)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Status != lifecycle.KindFinished || string(rec.Result.Output) != `{"ok":true}` || !rec.UpdatedAt.Equal(before.UpdatedAt) {
		t.Errorf("record changed: %+v", rec)
	}
	if n := h.count(lifecycle.StreamLifecycle, "agora.lifecycle.cancelled."+d.DispatchID+"."+d.DispatchID); n != 0 {
		t.Errorf("a cancelled event for a finished dispatch")
	}
	select {
	case <-signal:
		t.Error("a cancel signal for a finished dispatch")
	case <-time.After(100 * time.Millisecond):
	}
}

func TestCancelRacingATerminalEvent(t *testing.T) {
	h := newHarness(t, dispatcher.Config{})
	d := h.dispatchMicro(lifecycle.Request{Subagent: "planner"})
	// The worker's terminal event is on the stream, but the projection has
	// not recorded it yet: the cancel's event is a duplicate, and the
	// record must end with the worker's outcome.
	h.stop()
	h.publishAsWorker(&lifecycle.Failed{Common: d.Record.Common(), Reason: lifecycle.ReasonProviderFailed, Detail: "exit 2"})
	h.start(dispatcher.Config{})
	rec, err := h.cl.Cancel(t.Context(), d.DispatchID)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Status != lifecycle.KindFailed || rec.Result.Reason != lifecycle.ReasonProviderFailed {
		t.Errorf("record: %+v", rec)
	}
}

func TestCancelUnknown(t *testing.T) {
	h := newHarness(t, dispatcher.Config{})
	if _, err := h.cl.Cancel(t.Context(), "nope"); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("micro: %v, want ErrNotFound", err)
	}
	resp, data := h.do(http.MethodPost, "/v1/dispatches/nope/cancel", "", "")
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(data), client.ProblemNotFound) {
		t.Errorf("http: %d %s", resp.StatusCode, data)
	}
	if _, err := h.cl.CancelThread(t.Context(), "nope"); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("thread: %v, want ErrNotFound", err)
	}
	m := h.microCall(lifecycle.APICancel, []byte(`{}`), nil)
	if m.Header.Get("Nats-Service-Error-Code") != "422" {
		t.Errorf("cancel without an id: %s", m.Data)
	}
}

// twoRoundThread makes a thread whose root asked a question and whose
// round 1 is queued, with the events a worker and the router would cause.
func (h *harness) twoRoundThread(root string) (*client.Dispatch, *client.Dispatch) {
	h.t.Helper()
	d0 := h.dispatchMicro(lifecycle.Request{DispatchID: root, Subagent: "planner"})
	ni := h.publishAsWorker(&lifecycle.NeedsInput{Common: d0.Record.Common(), QuestionID: lifecycle.QuestionID(root), Question: "A or B?"})
	h.projected(root, ni.ID())
	d1 := h.dispatchMicro(lifecycle.Request{DispatchID: root + "-r1", Subagent: "planner", ThreadID: root, ParentID: root, Round: 1, QuestionID: lifecycle.QuestionID(root)})
	return d0, d1
}

func TestCancelThread(t *testing.T) {
	h := newHarness(t, dispatcher.Config{})
	d0, d1 := h.twoRoundThread("th-1")
	th, err := h.cl.CancelThread(t.Context(), "th-1", client.CancelBy("carol", "done"))
	if err != nil {
		t.Fatal(err)
	}
	if len(th.Rounds) != 2 || th.Status != lifecycle.KindCancelled {
		t.Fatalf("thread: %+v", th)
	}
	if th.Rounds[0].DispatchID != d0.DispatchID || th.Rounds[0].Status != lifecycle.KindNeedsInput {
		t.Errorf("round 0 changed: %+v", th.Rounds[0].Record)
	}
	if th.Rounds[1].DispatchID != d1.DispatchID || th.Rounds[1].Status != lifecycle.KindCancelled || th.Rounds[1].Result.By != "carol" {
		t.Errorf("round 1: %+v", th.Rounds[1].Record)
	}
	resp, data := h.do(http.MethodPost, "/v1/threads/th-1/cancel", "", "")
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(data), `"carol"`) {
		t.Errorf("again over http: %d %s", resp.StatusCode, data)
	}
}

func TestCancelThreadPausedOnAQuestion(t *testing.T) {
	h := newHarness(t, dispatcher.Config{})
	d := h.dispatchMicro(lifecycle.Request{DispatchID: "paused", Subagent: "planner"})
	ni := h.publishAsWorker(&lifecycle.NeedsInput{Common: d.Record.Common(), QuestionID: "q-paused", Question: "A or B?"})
	h.projected(d.DispatchID, ni.ID())
	hook := h.subscribeCore(lifecycle.CancelThreadPrefix + "paused")
	th, err := h.cl.CancelThread(t.Context(), "paused", client.CancelBy("dave", "no longer needed"))
	if err != nil {
		t.Fatal(err)
	}
	if th.Status != lifecycle.KindNeedsInput || th.Rounds[0].Result.QuestionID != "q-paused" {
		t.Errorf("the paused dispatch itself stays needs_input: %+v", th)
	}
	var body lifecycle.CancelRequest
	if err := json.Unmarshal(receive(t, hook).Data, &body); err != nil || body.ThreadID != "paused" || body.DispatchID != "paused" || body.By != "dave" {
		t.Errorf("router hook: %+v %v", body, err)
	}
	// The mark was on the record before the message went out.
	rec, _ := h.record("paused")
	m := rec.CancelRequested
	if m == nil || m.DispatchID != "paused" || m.ThreadID != "paused" || m.By != "dave" || m.Reason != "no longer needed" || m.At.IsZero() {
		t.Fatalf("cancel mark: %+v", m)
	}
	if r := th.Rounds[0].CancelRequested; r == nil || r.By != "dave" {
		t.Errorf("the returned thread does not show the mark: %+v", r)
	}
	// Cancelling the paused dispatch by its id asks the same; the first
	// mark stands.
	again, err := h.cl.Cancel(t.Context(), "paused", client.CancelBy("eve", ""))
	if err != nil {
		t.Fatal(err)
	}
	if again.CancelRequested == nil || again.CancelRequested.By != "dave" || !again.CancelRequested.At.Equal(m.At) {
		t.Errorf("second cancel changed the mark: %+v", again.CancelRequested)
	}
	if err := json.Unmarshal(receive(t, hook).Data, &body); err != nil || body.By != "dave" {
		t.Errorf("router hook again: %+v %v", body, err)
	}
}

// pauseProjection stops the projection's deliveries until the test
// resumes it, so the records lag the lifecycle stream.
func (h *harness) pauseProjection() (resume func()) {
	h.t.Helper()
	if _, err := h.js.PauseConsumer(h.t.Context(), lifecycle.StreamLifecycle, provision.ConsumerProjection, time.Now().Add(time.Hour)); err != nil {
		h.t.Fatal(err)
	}
	var once sync.Once
	resume = func() {
		once.Do(func() {
			if _, err := h.js.ResumeConsumer(context.Background(), lifecycle.StreamLifecycle, provision.ConsumerProjection); err != nil {
				h.t.Error(err)
			}
		})
	}
	h.t.Cleanup(resume)
	return resume
}

// TestCancelThreadWhileTheProjectionLags: the record of a dispatch that
// has asked its question still says started; cancelling the thread must
// find the needs_input on the stream, publish no second terminal event,
// and end the thread through the router (mark, then the core message).
func TestCancelThreadWhileTheProjectionLags(t *testing.T) {
	tests := []struct {
		name  string
		msgID string // of the needs_input; "" keeps its own, the terminal id
	}{
		// The cancel's publish is a duplicate of the needs_input.
		{"duplicate publish", ""},
		// The needs_input is not caught by the duplicate window (published
		// longer ago than the window, here under another message id).
		{"terminal already stored", "worker-msg-1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, dispatcher.Config{})
			d := h.dispatchMicro(lifecycle.Request{Subagent: "planner"})
			st := h.publishAsWorker(&lifecycle.Started{Common: d.Record.Common(), WorkerID: "w1", Attempt: 1})
			h.projected(d.DispatchID, st.ID())
			resume := h.pauseProjection()

			ni := &lifecycle.NeedsInput{Common: d.Record.Common(), QuestionID: lifecycle.QuestionID(d.DispatchID), Question: "A or B?"}
			e, msg, err := lifecycle.Message(lifecycle.Source("worker", "test"), ni)
			if err != nil {
				t.Fatal(err)
			}
			if tt.msgID != "" {
				msg.Header.Set(jetstream.MsgIDHeader, tt.msgID)
			}
			if _, err := h.js.PublishMsg(t.Context(), msg); err != nil {
				t.Fatal(err)
			}
			// The projection lags, but the status is the chain's.
			if rec, _ := h.record(d.DispatchID); rec.Status != lifecycle.KindNeedsInput {
				t.Fatalf("status %s while the projection is paused, want the chain's needs_input", rec.Status)
			}

			hook := h.subscribeCore(lifecycle.CancelThreadPrefix + d.ThreadID)
			th, err := h.cl.CancelThread(t.Context(), d.ThreadID, client.CancelBy("erin", "wrong task"))
			if err != nil {
				t.Fatal(err)
			}
			var body lifecycle.CancelRequest
			if err := json.Unmarshal(receive(t, hook).Data, &body); err != nil || body.DispatchID != d.DispatchID || body.ThreadID != d.ThreadID || body.By != "erin" || body.Reason != "wrong task" {
				t.Errorf("router hook: %+v %v", body, err)
			}
			if len(th.Rounds) != 1 || th.Rounds[0].Status != lifecycle.KindNeedsInput || th.Rounds[0].CancelRequested == nil || th.Rounds[0].CancelRequested.By != "erin" {
				t.Fatalf("thread: %+v", th)
			}
			if n := h.count(lifecycle.StreamLifecycle, "agora.lifecycle.cancelled."+d.ThreadID+"."+d.DispatchID); n != 0 {
				t.Errorf("%d cancelled events for a dispatch that ended needs_input", n)
			}

			resume()
			h.projectionIdle()
			rec := h.projected(d.DispatchID, e.ID())
			if rec.Status != lifecycle.KindNeedsInput || rec.CancelRequested == nil || rec.CancelRequested.By != "erin" {
				t.Errorf("record after the projection caught up: status %s, mark %+v", rec.Status, rec.CancelRequested)
			}
			terminal := 0
			for _, r := range rec.Events {
				if r.Kind.Terminal() {
					terminal++
				}
			}
			if terminal != 1 {
				t.Errorf("%d terminal events applied, want 1: %+v", terminal, rec.Events)
			}
		})
	}
}

// TestRedispatchOfACancelledThread: the router's re-dispatch of an answer
// that won the race with the thread's cancel ends cancelled on acceptance
// and is never queued.
func TestRedispatchOfACancelledThread(t *testing.T) {
	h := newHarness(t, dispatcher.Config{})
	d0 := h.dispatchMicro(lifecycle.Request{DispatchID: "raced", Subagent: "planner"})
	ni := h.publishAsWorker(&lifecycle.NeedsInput{Common: d0.Record.Common(), QuestionID: "q-raced", Question: "A or B?"})
	h.projected(d0.DispatchID, ni.ID())
	if _, err := h.cl.CancelThread(t.Context(), "raced", client.CancelBy("frank", "too late")); err != nil {
		t.Fatal(err)
	}
	h.publishRequest(lifecycle.Request{DispatchID: "raced-r1", Subagent: "planner", ThreadID: "raced", ParentID: "raced", Round: 1, QuestionID: "q-raced",
		Input: json.RawMessage(`{"answer":"A"}`)})
	_, data := h.waitEvent(lifecycle.LifecycleFilter(lifecycle.KindCancelled, "raced", "raced-r1"))
	if c := data.(*lifecycle.Cancelled); c.By != "frank" || c.Reason != "too late" || c.Round != 1 || c.ParentID != "raced" {
		t.Errorf("cancelled: %+v", c)
	}
	h.projectionIdle()
	rec, _ := h.record("raced-r1")
	if rec.Status != lifecycle.KindCancelled || rec.Queued || rec.Result == nil || rec.Result.By != "frank" {
		t.Errorf("record: %+v", rec)
	}
	if q := h.queued("raced-r1"); len(q) != 0 {
		t.Errorf("the re-dispatch of a cancelled thread was queued")
	}
	th, err := h.cl.Thread(t.Context(), "raced")
	if err != nil {
		t.Fatal(err)
	}
	if th.Status != lifecycle.KindCancelled || len(th.Rounds) != 2 {
		t.Errorf("thread: %+v", th)
	}
}
