package chain_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/chain"
	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

func publish(t *testing.T, js jetstream.JetStream, d lifecycle.Lifecycle) lifecycle.Event {
	t.Helper()
	e, msg, err := lifecycle.Message("test", d)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.PublishMsg(t.Context(), msg); err != nil {
		t.Fatal(err)
	}
	return e
}

func TestLast(t *testing.T) {
	js := natstest.StartProvisioned(t, provision.Config{}).JetStream(t)
	r, err := chain.NewReader(js)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	c := lifecycle.Common{DispatchID: "d-1", ThreadID: "t-1", Subagent: "planner"}
	other := lifecycle.Common{DispatchID: "d-2", ThreadID: "t-1", Subagent: "planner"}

	if links, err := r.Last(t.Context(), c.ThreadID, c.DispatchID); err != nil || len(links) != 0 {
		t.Fatalf("empty chain: %d links, %v; want none", len(links), err)
	}

	publish(t, js, &lifecycle.Accepted{Common: c})
	publish(t, js, &lifecycle.Started{Common: c, WorkerID: "w1", Attempt: 1})
	publish(t, js, &lifecycle.Started{Common: other, WorkerID: "w9", Attempt: 1})
	publish(t, js, &lifecycle.Started{Common: c, WorkerID: "w2", Attempt: 2})
	fin := publish(t, js, &lifecycle.Finished{Common: c, DurationMS: 7, Output: json.RawMessage(`{"a":1}`)})

	links, err := r.Last(t.Context(), c.ThreadID, c.DispatchID)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []lifecycle.Kind
	for _, l := range links {
		kinds = append(kinds, l.Data.LifecycleKind())
	}
	want := []lifecycle.Kind{lifecycle.KindAccepted, lifecycle.KindStarted, lifecycle.KindFinished}
	if len(kinds) != len(want) || kinds[0] != want[0] || kinds[1] != want[1] || kinds[2] != want[2] {
		t.Fatalf("kinds %v, want %v (the last of each, in stream order)", kinds, want)
	}
	if s := links[1].Data.(*lifecycle.Started); s.WorkerID != "w2" {
		t.Errorf("started by %s, want the latest (w2)", s.WorkerID)
	}

	var rec client.Record
	chain.Apply(&rec, links...)
	if rec.Status != lifecycle.KindFinished || rec.Attempt != 2 || rec.WorkerID != "w2" || rec.Result == nil ||
		rec.Result.DurationMS != 7 || rec.EndedAt == nil || !rec.EndedAt.Equal(fin.Time().UTC()) || len(rec.Events) != 3 {
		t.Errorf("applied: %+v", rec)
	}

	t.Run("reads at once on one reader each get their own chain", func(t *testing.T) {
		var wg sync.WaitGroup
		errs := make(chan error, 64)
		for i := range 64 {
			id, worker, kinds := c.DispatchID, "w2", 3
			if i%2 == 1 {
				id, worker, kinds = other.DispatchID, "w9", 1
			}
			wg.Go(func() {
				links, err := r.Last(t.Context(), c.ThreadID, id)
				if err != nil {
					errs <- err
					return
				}
				// Another read's replies would be dropped (Last keeps
				// only its dispatch's events) and show as missing ones.
				var rec client.Record
				chain.Apply(&rec, links...)
				if len(links) != kinds || rec.WorkerID != worker {
					errs <- fmt.Errorf("%s: %d events, worker %q; want %d, %q", id, len(links), rec.WorkerID, kinds, worker)
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})

	t.Run("a read cut off by its deadline is an error, not a shorter chain", func(t *testing.T) {
		ctx, cancel := context.WithDeadline(t.Context(), time.Now().Add(-time.Second))
		defer cancel()
		if _, err := r.Last(ctx, c.ThreadID, c.DispatchID); err == nil {
			t.Fatal("a read past its deadline returned a chain")
		}
	})
}

func TestApply(t *testing.T) {
	c := lifecycle.Common{DispatchID: "d-1", ThreadID: "t-1", Subagent: "planner"}
	link := func(d lifecycle.Lifecycle) chain.Link {
		e, err := lifecycle.New("test", d)
		if err != nil {
			t.Fatal(err)
		}
		return chain.Link{Event: e, Data: d}
	}
	acc := link(&lifecycle.Accepted{Common: c, SubagentRevision: 4})
	st := link(&lifecycle.Started{Common: c, WorkerID: "w1", Attempt: 1})
	fin := link(&lifecycle.Finished{Common: c})
	can := link(&lifecycle.Cancelled{Common: c, By: "ops"})
	tests := []struct {
		name       string
		links      []chain.Link
		status     lifecycle.Kind
		resultKind lifecycle.Kind
		events     int
	}{
		{"accepted", []chain.Link{acc}, lifecycle.KindAccepted, "", 1},
		{"started", []chain.Link{acc, st}, lifecycle.KindStarted, "", 2},
		{"a started after the end does not reopen it", []chain.Link{acc, fin, st}, lifecycle.KindFinished, lifecycle.KindFinished, 3},
		{"the first terminal event wins (every one has the id <dispatch>.terminal)", []chain.Link{acc, st, can, fin}, lifecycle.KindCancelled, lifecycle.KindCancelled, 3},
		{"an event listed already is skipped", []chain.Link{acc, acc, st, st}, lifecycle.KindStarted, "", 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var rec client.Record
			chain.Apply(&rec, tt.links...)
			var rk lifecycle.Kind
			if rec.Result != nil {
				rk = rec.Result.Kind
			}
			if rec.Status != tt.status || rk != tt.resultKind || len(rec.Events) != tt.events || rec.SubagentRevision != 4 {
				t.Errorf("status %s, result %s, %d events, revision %d; want %s, %s, %d, 4", rec.Status, rk, len(rec.Events), rec.SubagentRevision, tt.status, tt.resultKind, tt.events)
			}
		})
	}
}
