package dispatcher_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/services/dispatcher"
)

// The dispatcher keeps a watched copy of the sub-agent definitions
// (docs/dispatcher.md, "Definitions"): what is applied, changed or deleted
// in the bucket reaches acceptance without a restart, and a definition
// registered a moment ago is never refused.
func TestDefinitionChangesReachAcceptance(t *testing.T) {
	h := newHarness(t, dispatcher.Config{})
	dispatch := func(req lifecycle.Request) (*client.Dispatch, error) {
		return h.cl.Dispatch(h.t.Context(), req)
	}

	t.Run("registered just now", func(t *testing.T) {
		for i := range 20 {
			name := fmt.Sprintf("fresh-%d", i)
			rev := h.putSubagent(subagent.Definition{Name: name, Runtime: subagent.RuntimeExec, Command: []string{"true"}})
			d, err := dispatch(lifecycle.Request{Subagent: name})
			if err != nil {
				t.Fatalf("dispatch to %s right after it was registered: %v", name, err)
			}
			if d.Record.SubagentRevision != rev {
				t.Errorf("%s: revision %d, want %d", name, d.Record.SubagentRevision, rev)
			}
		}
	})

	t.Run("a new revision is used", func(t *testing.T) {
		def := subagent.Definition{Name: "changing", Runtime: subagent.RuntimeExec, Command: []string{"true"}, Timeout: "1m"}
		h.putSubagent(def)
		if _, err := dispatch(lifecycle.Request{Subagent: "changing"}); err != nil {
			t.Fatal(err) // the copy now holds the first revision
		}
		def.Timeout = "7m"
		rev := h.putSubagent(def)
		h.eventually("a dispatch to run the new revision", func() bool {
			d, err := dispatch(lifecycle.Request{Subagent: "changing"})
			if err != nil {
				t.Fatal(err)
			}
			return d.Record.SubagentRevision == rev && d.Record.Request.Timeout == "7m"
		})
	})

	t.Run("an env refusal reads the stored revision", func(t *testing.T) {
		def := subagent.Definition{Name: "envy", Runtime: subagent.RuntimeExec, Command: []string{"true"}}
		h.putSubagent(def)
		_, err := dispatch(lifecycle.Request{Subagent: "envy", Env: map[string]string{"BAR": "1"}})
		var p *client.Problem
		if !errors.As(err, &p) || p.Status != http.StatusUnprocessableEntity {
			t.Fatalf("BAR before env_allow has it: %v, want 422", err)
		}
		def.EnvAllow = []string{"BAR"}
		rev := h.putSubagent(def)
		d, err := dispatch(lifecycle.Request{Subagent: "envy", Env: map[string]string{"BAR": "1"}})
		if err != nil {
			t.Fatalf("BAR right after env_allow has it: %v", err)
		}
		if d.Record.SubagentRevision != rev {
			t.Errorf("revision %d, want %d", d.Record.SubagentRevision, rev)
		}
	})

	t.Run("a deleted sub-agent is refused", func(t *testing.T) {
		h.putSubagent(subagent.Definition{Name: "leaving", Runtime: subagent.RuntimeExec, Command: []string{"true"}})
		if _, err := dispatch(lifecycle.Request{Subagent: "leaving"}); err != nil {
			t.Fatal(err)
		}
		kv := natstest.KeyValue(t, h.js, lifecycle.BucketSubagents)
		if err := kv.Delete(t.Context(), "leaving"); err != nil {
			t.Fatal(err)
		}
		h.eventually("a dispatch to the deleted sub-agent to be refused", func() bool {
			_, err := dispatch(lifecycle.Request{Subagent: "leaving"})
			var p *client.Problem
			return errors.As(err, &p) && p.Status == http.StatusUnprocessableEntity
		})
		// Registered again, it is accepted at once.
		rev := h.putSubagent(subagent.Definition{Name: "leaving", Runtime: subagent.RuntimeExec, Command: []string{"true"}})
		d, err := dispatch(lifecycle.Request{Subagent: "leaving"})
		if err != nil {
			t.Fatalf("dispatch right after registering again: %v", err)
		}
		if d.Record.SubagentRevision != rev {
			t.Errorf("revision %d, want %d", d.Record.SubagentRevision, rev)
		}
	})
}

// The copy follows the bucket across a restart of the server: the watch is
// started again on the reconnect, so a revision applied after the restart
// reaches acceptance at once (the watch's own recovery took about 20 s).
func TestDefinitionsAfterServerRestart(t *testing.T) {
	h := newHarness(t, dispatcher.Config{})
	def := subagent.Definition{Name: "survivor", Runtime: subagent.RuntimeExec, Command: []string{"true"}, Timeout: "1m"}
	h.putSubagent(def)
	if _, err := h.cl.Dispatch(t.Context(), lifecycle.Request{Subagent: "survivor"}); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	h.srv.Restart(t)
	def.Timeout = "9m"
	var rev uint64
	h.eventually("the bucket to take a write after the restart", func() bool {
		kv, err := h.js.KeyValue(t.Context(), lifecycle.BucketSubagents)
		if err != nil {
			return false
		}
		data, _ := json.Marshal(def)
		rev, err = kv.Put(t.Context(), def.Name, data)
		return err == nil
	})
	t.Logf("restarted and written in %v", time.Since(t0).Round(time.Millisecond))
	deadline := time.Now().Add(5 * time.Second)
	for {
		d, err := h.cl.Dispatch(t.Context(), lifecycle.Request{Subagent: "survivor"})
		if err == nil && d.Record.SubagentRevision == rev {
			t.Logf("the new revision is used %v after it was applied", time.Since(deadline.Add(-5*time.Second)).Round(time.Millisecond))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("5 s after the restart a dispatch still runs another revision than %d (last: %+v, %v)", rev, d, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A record is created listing its accepted event, and nothing writes it
// again — no queued mark, nothing by the projection — until its thread
// ends.
func TestAcceptedEventNeedsNoProjectionWrite(t *testing.T) {
	h := newHarness(t, dispatcher.Config{})
	kv := natstest.KeyValue(t, h.js, lifecycle.BucketDispatches)
	id := lifecycle.NewID()
	w, err := kv.Watch(t.Context(), id, jetstream.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop() }()
	d := h.dispatchMicro(lifecycle.Request{DispatchID: id, Subagent: "planner"})
	ev, _ := h.waitEvent(lifecycle.LifecycleFilter(lifecycle.KindAccepted, d.ThreadID, d.DispatchID))
	h.projectionIdle()
	rec, _ := h.record(d.DispatchID)
	if !rec.Queued || rec.Status != lifecycle.KindAccepted {
		t.Fatalf("record: queued %v status %s", rec.Queued, rec.Status)
	}
	if len(rec.Events) != 1 || rec.Events[0].ID != lifecycle.AcceptedID(d.DispatchID) || !rec.Events[0].Time.Equal(*rec.AcceptedAt) {
		t.Fatalf("events %+v, want the accepted event at %v once", rec.Events, rec.AcceptedAt)
	}
	if !ev.Time().Equal(*rec.AcceptedAt) {
		t.Errorf("accepted event time %v, record %v", ev.Time(), rec.AcceptedAt)
	}
	// Created: one write.
	writes := 0
	for {
		select {
		case e := <-w.Updates():
			if e != nil {
				writes++
			}
			continue
		case <-time.After(300 * time.Millisecond):
		}
		break
	}
	if writes != 1 {
		t.Errorf("%d writes of the record, want 1 (its creation)", writes)
	}
}
