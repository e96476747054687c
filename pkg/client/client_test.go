package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

const trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

func TestDispatch(t *testing.T) {
	e := newEnv(t)
	d := e.dispatch(t.Context(), t, lifecycle.Request{Subagent: "planner", Input: json.RawMessage(`{"task":"x"}`)}, client.WithTraceparent(trace))
	if d.DispatchID == "" || d.ThreadID != d.DispatchID || d.Record.Status != lifecycle.KindAccepted {
		t.Fatalf("handle: %+v", d)
	}
	// The dispatcher answers once the work is queued: it is on
	// AGORA_DISPATCH.
	work, err := e.js.Stream(t.Context(), lifecycle.StreamDispatch)
	if err != nil {
		t.Fatal(err)
	}
	if m, err := work.GetLastMsgForSubject(t.Context(), "agora.dispatch.planner"); err != nil || m.Header.Get(jetstream.MsgIDHeader) != d.DispatchID {
		t.Fatalf("the work of %s is not queued (%v)", d.DispatchID, err)
	}
	if lifecycle.TraceID(d.Record.Traceparent) != lifecycle.TraceID(trace) {
		t.Errorf("traceparent %q does not continue %q", d.Record.Traceparent, trace)
	}
	again, err := e.c.Dispatch(t.Context(), lifecycle.Request{DispatchID: d.DispatchID, Subagent: "planner", Input: json.RawMessage(`{"task":"x"}`)})
	if err != nil || again.DispatchID != d.DispatchID || !again.Record.CreatedAt.Equal(d.Record.CreatedAt) {
		t.Errorf("the same id again: %+v %v", again, err)
	}
	rec, err := e.c.Status(t.Context(), d.DispatchID)
	if err != nil || rec.DispatchID != d.DispatchID || string(rec.Request.Input) != `{"task":"x"}` {
		t.Errorf("status: %+v %v", rec, err)
	}
	if _, err := e.c.Status(t.Context(), "nope"); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("status of an unknown id: %v", err)
	}
}

func TestDispatchRefused(t *testing.T) {
	e := newEnv(t)
	_, err := e.c.Dispatch(t.Context(), lifecycle.Request{Subagent: "ghost", Timeout: "soon", Env: map[string]string{"NATS_CREDS": "x"}})
	if !errors.Is(err, client.ErrInvalidRequest) {
		t.Fatalf("err = %v, want ErrInvalidRequest", err)
	}
	var p *client.Problem
	if !errors.As(err, &p) || p.Status != 422 {
		t.Fatalf("not a problem: %v", err)
	}
	for _, f := range []string{"subagent", "timeout", "env"} {
		if p.Field(f) == "" {
			t.Errorf("the problem does not name %s: %+v", f, p.Errors)
		}
	}
	if !strings.Contains(err.Error(), "subagent") {
		t.Errorf("error text: %v", err)
	}
}

func TestNoDispatcher(t *testing.T) {
	srv := natstest.StartProvisioned(t, provision.Config{})
	c, err := client.Connect(srv.URL, client.WithTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Dispatch(t.Context(), lifecycle.Request{Subagent: "planner"}); !errors.Is(err, client.ErrUnavailable) {
		t.Errorf("dispatch with no dispatcher: %v", err)
	}
	if _, err := client.New(nil); err == nil {
		t.Error("New(nil) succeeded")
	}
}

// itemErr is what a Wait or Follow run in a goroutine sends back.
type itemErr struct {
	it  client.Item
	err error
}

func TestWaitAndCancel(t *testing.T) {
	e := newEnv(t)
	d := e.dispatch(t.Context(), t, lifecycle.Request{Subagent: "planner"})
	waited := make(chan itemErr, 1)
	go func() {
		it, err := d.Wait(t.Context())
		waited <- itemErr{it, err}
	}()
	rec, err := e.c.Cancel(t.Context(), d.DispatchID, client.CancelBy("ops", "test"))
	if err != nil || rec.Status != lifecycle.KindCancelled {
		t.Fatalf("cancel: %+v %v", rec, err)
	}
	select {
	case r := <-waited:
		if r.err != nil || r.it.Kind() != lifecycle.KindCancelled || r.it.Data.(*lifecycle.Cancelled).By != "ops" || r.it.Seq == 0 {
			t.Errorf("wait: %+v %v", r.it, r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return")
	}
	// Waiting after the end returns at once.
	it, err := d.Wait(t.Context())
	if err != nil || it.Event.ID() != lifecycle.TerminalID(d.DispatchID) {
		t.Errorf("wait after the end: %v %v", it.Event.ID(), err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	d2 := e.dispatch(t.Context(), t, lifecycle.Request{Subagent: "planner"})
	if _, err := d2.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("wait on a dispatch nothing ends: %v", err)
	}
	if _, err := e.c.Cancel(t.Context(), "nope"); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("cancel of an unknown id: %v", err)
	}
}

// TestFollowFollowsRounds checks Follow's following logic with the
// dispatcher and events the test publishes in place of a worker (the
// needs_input) and of the router (the round-1 dispatch). It is not a round
// trip: that test waits for services/worker and services/router.
func TestFollowFollowsRounds(t *testing.T) {
	e := newEnv(t)
	root := e.dispatch(t.Context(), t, lifecycle.Request{Subagent: "planner"})
	seen := make(chan client.Item, 16)
	done := make(chan itemErr, 1)
	go func() {
		it, err := e.c.Follow(t.Context(), root.ThreadID, func(it client.Item) { seen <- it })
		done <- itemErr{it, err}
	}()
	e.publishAsWorker(t, &lifecycle.NeedsInput{Common: root.Record.Common(), QuestionID: lifecycle.QuestionID(root.DispatchID), Question: "A or B?"})
	r1 := e.dispatch(t.Context(), t, lifecycle.Request{Subagent: "planner", ThreadID: root.ThreadID, ParentID: root.DispatchID, Round: 1, QuestionID: lifecycle.QuestionID(root.DispatchID)})
	var kinds []string
	next := func() client.Item {
		t.Helper()
		select {
		case it := <-seen:
			kinds = append(kinds, string(it.Kind()))
			return it
		case r := <-done:
			t.Fatalf("Follow returned %s %v after %v, before the thread ended", r.it.Kind(), r.err, kinds)
		case <-time.After(10 * time.Second):
			t.Fatalf("Follow saw only %v", kinds)
		}
		return client.Item{}
	}
	// Follow has handed over the needs_input and the round-1 accepted that
	// comes after it, and has not returned: a needs_input only pauses a
	// thread.
	for it := next(); it.Kind() != lifecycle.KindAccepted || it.Data.Base().Round != 1; it = next() {
	}
	if _, err := e.c.Cancel(t.Context(), r1.DispatchID); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.err != nil || r.it.Kind() != lifecycle.KindCancelled || r.it.Data.Base().DispatchID != r1.DispatchID {
			t.Errorf("final: %+v %v", r.it, r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Follow did not return")
	}
	for len(seen) > 0 {
		kinds = append(kinds, string((<-seen).Kind()))
	}
	if got := strings.Join(kinds, ","); got != "accepted,needs_input,accepted,cancelled" {
		t.Errorf("events seen: %s", got)
	}
	th, err := e.c.Thread(t.Context(), root.ThreadID)
	if err != nil || len(th.Rounds) != 2 || th.Status != lifecycle.KindCancelled {
		t.Errorf("thread: %+v %v", th, err)
	}
	th, err = e.c.CancelThread(t.Context(), root.ThreadID)
	if err != nil || th.Status != lifecycle.KindCancelled {
		t.Errorf("cancel an ended thread: %+v %v", th, err)
	}
	if _, err := e.c.Follow(t.Context(), "bad.id", nil); err == nil {
		t.Error("Follow accepted an invalid id")
	}
}

func TestWatch(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	// Live: the watch runs while the dispatches happen.
	live := make(chan client.Item, 8)
	liveCtx, stopLive := context.WithCancel(ctx)
	liveErr := make(chan error, 1)
	go func() {
		for it, err := range e.c.Watch(liveCtx, client.Filter{Kind: lifecycle.KindCancelled, FromStart: true}) {
			if err != nil {
				liveErr <- err
				return
			}
			live <- it
		}
	}()

	var ids []string
	for range 3 {
		d := e.dispatch(ctx, t, lifecycle.Request{Subagent: "planner"})
		ids = append(ids, d.DispatchID)
		if _, err := e.c.Cancel(ctx, d.DispatchID); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		select {
		case it := <-live:
			if it.Kind() != lifecycle.KindCancelled || it.Data.Base().DispatchID != ids[i] {
				t.Errorf("live event %d: %s %s", i, it.Kind(), it.Data.Base().DispatchID)
			}
		case <-ctx.Done():
			t.Fatal("no live event")
		}
	}
	stopLive()
	if err := <-liveErr; !errors.Is(err, context.Canceled) {
		t.Errorf("a stopped watch ends with %v", err)
	}

	// Replay one dispatch from the start, then resume after its first event.
	var seqs []uint64
	for it, err := range e.c.Watch(ctx, client.Filter{DispatchID: ids[1], FromStart: true}) {
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, it.Seq)
		if it.Kind().Terminal() {
			break
		}
	}
	if len(seqs) != 2 {
		t.Fatalf("replay: %v", seqs)
	}
	for it, err := range e.c.Watch(ctx, client.Filter{DispatchID: ids[1], AfterSeq: seqs[0]}) {
		if err != nil {
			t.Fatal(err)
		}
		if it.Seq != seqs[1] {
			t.Errorf("resumed at %d, want %d", it.Seq, seqs[1])
		}
		break
	}
	for _, err := range e.c.Watch(ctx, client.Filter{Kind: "exploded"}) {
		if err == nil {
			t.Error("an invalid filter yields no error")
		}
		break
	}
}

func TestQuestions(t *testing.T) {
	e := newEnv(t)
	kv, err := e.js.KeyValue(t.Context(), lifecycle.BucketQuestions)
	if err != nil {
		t.Fatal(err)
	}
	if qs, err := e.c.Questions(t.Context(), client.QuestionFilter{}); err != nil || len(qs) != 0 {
		t.Fatalf("empty bucket: %v %v", qs, err)
	}
	// The test writes question records as the router will.
	now := time.Now().UTC()
	put := func(q lifecycle.Question) {
		data, _ := json.Marshal(q)
		if _, err := kv.Put(t.Context(), q.QuestionID, data); err != nil {
			t.Fatal(err)
		}
	}
	put(lifecycle.Question{Common: lifecycle.Common{DispatchID: "d2", ThreadID: "t2", Subagent: "planner"}, QuestionID: "q-d2", Status: "asked", Route: "human", Question: "B?", AskedAt: now.Add(time.Second)})
	put(lifecycle.Question{Common: lifecycle.Common{DispatchID: "d1", ThreadID: "t1", Subagent: "planner"}, QuestionID: "q-d1", Status: "asked", Route: "data", Question: "A?", AskedAt: now})
	put(lifecycle.Question{Common: lifecycle.Common{DispatchID: "d3", ThreadID: "t3", Subagent: "other"}, QuestionID: "q-d3", Status: "answered", Route: "human", Question: "C?", AskedAt: now})
	if _, err := kv.Put(t.Context(), "not-a-question", []byte("garbage")); err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(t.Context(), "q-d3"); err != nil {
		t.Fatal(err)
	}
	qs, err := e.c.Questions(t.Context(), client.QuestionFilter{Status: "asked"})
	if err != nil {
		t.Fatal(err)
	}
	if len(qs) != 2 || qs[0].QuestionID != "q-d1" || qs[1].QuestionID != "q-d2" {
		t.Errorf("pending, oldest first: %+v", qs)
	}
	qs, _ = e.c.Questions(t.Context(), client.QuestionFilter{Route: "human"})
	if len(qs) != 1 || qs[0].QuestionID != "q-d2" {
		t.Errorf("by route, deleted skipped: %+v", qs)
	}
	if q, err := e.c.Question(t.Context(), "q-d1"); err != nil || q.ThreadID != "t1" || q.Question != "A?" {
		t.Errorf("Question(q-d1) = %+v, %v", q, err)
	}
	for _, id := range []string{"q-d3", "q-none"} { // deleted, never written
		if _, err := e.c.Question(t.Context(), id); !errors.Is(err, client.ErrNotFound) {
			t.Errorf("Question(%s): %v, want ErrNotFound", id, err)
		}
	}
	if _, err := e.c.Question(t.Context(), "not-a-question"); err == nil || errors.Is(err, client.ErrNotFound) {
		t.Errorf("Question of a value that is not a question record: %v", err)
	}
	if _, err := e.c.Question(t.Context(), "q.*"); err == nil {
		t.Error("Question accepted a wildcard id")
	}
}

func TestConnect(t *testing.T) {
	e := newEnv(t)
	c, err := client.Connect(e.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Dispatch(t.Context(), lifecycle.Request{Subagent: "planner"}); err != nil {
		t.Error(err)
	}
	if err := c.Close(); err != nil {
		t.Error(err)
	}
	if _, err := client.Connect("nats://127.0.0.1:1"); err == nil {
		t.Error("connected to nothing")
	}
}
