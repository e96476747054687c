package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// attempts records the dispatch id of every request on the dispatch
// subject, through a subscription that never answers.
type attempts struct {
	mu  sync.Mutex
	ids []string
}

func watchAttempts(t *testing.T, nc *nats.Conn) *attempts {
	t.Helper()
	a := &attempts{}
	sub, err := nc.Subscribe(lifecycle.APIDispatch, func(m *nats.Msg) {
		var r lifecycle.Request
		_ = json.Unmarshal(m.Data, &r)
		a.mu.Lock()
		a.ids = append(a.ids, r.DispatchID)
		a.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return a
}

func (a *attempts) seen() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.ids...)
}

// A dispatcher that takes the request and dies before answering does not
// hold the caller until its (long) deadline: the attempt ends after the
// client's request timeout and the request goes again, under the same
// dispatch id, to the dispatcher that is up.
func TestDispatchLostReply(t *testing.T) {
	srv := natstest.StartProvisioned(t, provision.Config{})
	e := &env{srv: srv, nc: srv.Conn(t), js: srv.JetStream(t)}
	const timeout = 2 * time.Second
	var err error
	if e.c, err = client.New(e.nc, client.WithTimeout(timeout)); err != nil {
		t.Fatal(err)
	}
	e.define(t, planner)
	seen := watchAttempts(t, e.nc)
	// The dispatcher that dies: it takes the first request and never
	// answers. No other dispatcher runs yet.
	taken := make(chan *nats.Msg, 1)
	dead, err := srv.Conn(t).Subscribe(lifecycle.APIDispatch, func(m *nats.Msg) { taken <- m })
	if err != nil {
		t.Fatal(err)
	}
	if err := dead.AutoUnsubscribe(1); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute) // the caller's long deadline
	defer cancel()
	type result struct {
		d   *client.Dispatch
		err error
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		d, err := e.c.Dispatch(ctx, lifecycle.Request{Subagent: "planner"})
		done <- result{d, err}
	}()
	select {
	case <-taken:
	case r := <-done:
		t.Fatalf("Dispatch returned before any dispatcher took its request: %+v %v", r.d, r.err)
	case <-time.After(30 * time.Second):
		t.Fatal("no request reached the dispatch subject")
	}
	e.startDispatcher(t) // the one that answers the retry
	var r result
	select {
	case r = <-done:
	case <-time.After(4 * (timeout + time.Second)):
		t.Fatalf("Dispatch still waits %s after it sent its request, with a request timeout of %s", time.Since(start).Round(time.Second), timeout)
	}
	if r.err != nil {
		t.Fatalf("Dispatch after a lost reply: %v", r.err)
	}
	if r.d.Record.Status != lifecycle.KindAccepted {
		t.Errorf("the handle's record is %s, want accepted", r.d.Record.Status)
	}
	ids := seen.seen()
	if len(ids) < 2 {
		t.Fatalf("%d attempts seen, want the lost one and a retry", len(ids))
	}
	for i, id := range ids {
		if id != r.d.DispatchID {
			t.Errorf("attempt %d sent dispatch id %q, want %q on every attempt (all: %q)", i+1, id, r.d.DispatchID, ids)
		}
	}
	rec, err := e.c.Status(t.Context(), r.d.DispatchID)
	if err != nil || rec.DispatchID != r.d.DispatchID || !rec.CreatedAt.Equal(r.d.Record.CreatedAt) {
		t.Errorf("status of %s: %+v %v", r.d.DispatchID, rec, err)
	}
}

// When no attempt is answered, Dispatch gives up after its attempts (not at
// the caller's deadline), and its error names the dispatch id, says the
// dispatch may have been accepted and how to check.
func TestDispatchUnanswered(t *testing.T) {
	srv := natstest.StartProvisioned(t, provision.Config{})
	nc := srv.Conn(t)
	const timeout = 300 * time.Millisecond
	c, err := client.New(nc, client.WithTimeout(timeout))
	if err != nil {
		t.Fatal(err)
	}
	seen := watchAttempts(t, nc) // takes every request, answers none
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := c.Dispatch(ctx, lifecycle.Request{DispatchID: "lost-1", Subagent: "planner"})
		done <- err
	}()
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		t.Fatal("Dispatch still waits a minute after it sent its request, with a request timeout of 300ms")
	}
	var de *client.DispatchError
	if !errors.As(err, &de) || !de.Unanswered || de.DispatchID != "lost-1" || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %#v, want an unanswered *DispatchError for lost-1", err)
	}
	if ids := seen.seen(); len(ids) != de.Attempts || len(ids) < 2 {
		t.Errorf("%d requests seen, error reports %d attempts: want the same, more than one", len(ids), de.Attempts)
	}
	for _, want := range []string{"lost-1", "may have been accepted", "agora status lost-1", "Status"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q: %v", want, err)
		}
	}
}

// The dispatcher answers a repeated dispatch id with the dispatch already
// accepted under it, whatever became of it since: the retry of a request
// whose answer was lost gets the record, never an error or a second
// dispatch.
func TestDispatchRepeatedID(t *testing.T) {
	e := newEnv(t)
	req := lifecycle.Request{DispatchID: "again-1", Subagent: "planner", Input: json.RawMessage(`{"task":"x"}`)}
	first := e.dispatch(t.Context(), t, req)
	// The same request as the dispatch subject sees it from a retry.
	raw := func() client.Record {
		t.Helper()
		data, _ := json.Marshal(req)
		m, err := e.nc.Request(lifecycle.APIDispatch, data, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var rec client.Record
		if err := json.Unmarshal(m.Data, &rec); err != nil || rec.DispatchID == "" {
			t.Fatalf("the repeat was answered %s (%v), not with the record", m.Data, err)
		}
		return rec
	}
	same := func(what string, rec client.Record, status lifecycle.Kind) {
		t.Helper()
		if rec.DispatchID != first.DispatchID || !rec.CreatedAt.Equal(first.Record.CreatedAt) || rec.Status != status {
			t.Errorf("%s: %s created %s, status %s; want the record of %s created %s, status %s",
				what, rec.DispatchID, rec.CreatedAt, rec.Status, first.DispatchID, first.Record.CreatedAt, status)
		}
	}
	same("repeated while queued", raw(), lifecycle.KindAccepted)
	again, err := e.c.Dispatch(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	same("repeated through the client", again.Record, lifecycle.KindAccepted)
	// A worker took it meanwhile: the repeat still answers the record.
	e.publishAsWorker(t, &lifecycle.Started{Common: first.Record.Common(), WorkerID: "w-1", Attempt: 1})
	testkit.Eventually(t, 10*time.Second, "the record to show started", func() bool {
		rec, err := e.c.Status(t.Context(), first.DispatchID)
		return err == nil && rec.Status == lifecycle.KindStarted
	})
	same("repeated after it started", raw(), lifecycle.KindStarted)
	work := natstest.StreamInfo(t, e.js, lifecycle.StreamDispatch)
	if n := work.State.Msgs; n != 1 {
		t.Errorf("%d work messages queued for one dispatch repeated three times, want 1", n)
	}
}
