package dispatcher

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// countingKV counts the reads of a real bucket.
type countingKV struct {
	jetstream.KeyValue
	gets atomic.Int64
}

func (k *countingKV) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	k.gets.Add(1)
	return k.KeyValue.Get(ctx, key)
}

// The projection applies an event to the record as this dispatcher last
// wrote it, without reading it (docs/design.md §2, "The dispatch record
// and the reconciler"), and reads it again when someone else wrote it
// since. Counting reads needs the bucket's handle, which the black-box
// tests cannot reach.
func TestProjectionWritesFromItsOwnCopy(t *testing.T) {
	var kv *countingKV
	s, b, raw := projectionService(t, "copy", func(raw jetstream.KeyValue) jetstream.KeyValue {
		kv = &countingKV{KeyValue: raw}
		return kv
	})

	// accepted writes the record as acceptance does: created here, so the
	// copy holds it.
	accepted := func(id string) lifecycle.Common {
		t.Helper()
		rec := acceptedRecord(id)
		data, _ := json.Marshal(rec)
		rev, err := kv.Create(t.Context(), id, data)
		if err != nil {
			t.Fatal(err)
		}
		b.store.cache.wrote(&rec, data, rev)
		return rec.Common()
	}
	apply := func(d lifecycle.Lifecycle) record {
		t.Helper()
		e, err := lifecycle.New("test", d)
		if err != nil {
			t.Fatal(err)
		}
		rec, _, err := s.apply(t.Context(), b, e, d)
		if err != nil {
			t.Fatal(err)
		}
		return rec
	}
	stored := func(id string) client.Record {
		t.Helper()
		e, err := raw.Get(t.Context(), id)
		if err != nil {
			t.Fatal(err)
		}
		var rec client.Record
		if err := json.Unmarshal(e.Value(), &rec); err != nil {
			t.Fatal(err)
		}
		return rec
	}

	t.Run("started and finished read nothing", func(t *testing.T) {
		c := accepted("own-1")
		before := kv.gets.Load()
		apply(&lifecycle.Started{Common: c, WorkerID: "w1", Attempt: 1})
		if got := stored("own-1"); got.Status != lifecycle.KindStarted || got.WorkerID != "w1" {
			t.Fatalf("after started: %+v", got)
		}
		apply(&lifecycle.Finished{Common: c, ExitCode: 0})
		got := stored("own-1")
		if got.Status != lifecycle.KindFinished || len(got.Events) != 3 || got.Events[0].Kind != lifecycle.KindAccepted {
			t.Fatalf("after finished: status %s, events %+v", got.Status, got.Events)
		}
		if n := kv.gets.Load() - before; n != 0 {
			t.Errorf("%d reads of the record, want 0", n)
		}
		if _, ok := b.store.cache.get("own-1"); ok {
			t.Error("an ended dispatch's record is still kept")
		}
	})

	t.Run("the accepted event it listed is skipped without a read", func(t *testing.T) {
		c := accepted("own-2")
		before := kv.gets.Load()
		d := &lifecycle.Accepted{Common: c}
		e, err := lifecycle.New("test", d) // its id is the one the record lists
		if err != nil || e.ID() != lifecycle.AcceptedID(c.DispatchID) {
			t.Fatalf("accepted event %q: %v", e.ID(), err)
		}
		if _, _, err := s.apply(t.Context(), b, e, d); err != nil {
			t.Fatal(err)
		}
		if n := kv.gets.Load() - before; n != 0 {
			t.Errorf("%d reads, want 0", n)
		}
		if got := stored("own-2"); len(got.Events) != 1 {
			t.Errorf("events %+v, want the one accepted", got.Events)
		}
	})

	t.Run("a record another writer changed is read again and nothing is lost", func(t *testing.T) {
		c := accepted("own-3")
		// Another dispatcher marks it (a cancel): this one's copy is stale.
		e, err := raw.Get(t.Context(), "own-3")
		if err != nil {
			t.Fatal(err)
		}
		var rec client.Record
		_ = json.Unmarshal(e.Value(), &rec)
		rec.CancelRequested = &client.CancelMark{CancelRequest: client.CancelRequest{DispatchID: "own-3", ThreadID: "own-3", By: "ops"}, At: time.Now().UTC()}
		data, _ := json.Marshal(rec)
		if _, err := raw.Update(t.Context(), "own-3", data, e.Revision()); err != nil {
			t.Fatal(err)
		}
		before := kv.gets.Load()
		apply(&lifecycle.Started{Common: c, WorkerID: "w2", Attempt: 1})
		got := stored("own-3")
		if got.Status != lifecycle.KindStarted || got.CancelRequested == nil || got.CancelRequested.By != "ops" {
			t.Errorf("after started: status %s, mark %+v; want started with the other writer's mark", got.Status, got.CancelRequested)
		}
		if n := kv.gets.Load() - before; n != 1 {
			t.Errorf("%d reads, want 1 (the compare-and-set failed once)", n)
		}
		// Its copy is current again: the next event reads nothing.
		before = kv.gets.Load()
		apply(&lifecycle.Finished{Common: c})
		if n := kv.gets.Load() - before; n != 0 {
			t.Errorf("%d reads after the copy was refreshed, want 0", n)
		}
	})

	t.Run("a record it never wrote is read", func(t *testing.T) {
		before := kv.gets.Load()
		c := lifecycle.Common{DispatchID: "foreign-1", ThreadID: "foreign-1", Subagent: "planner"}
		rec := apply(&lifecycle.Failed{Common: c, Reason: lifecycle.ReasonRejected, Detail: "refused"})
		if rec.Status != lifecycle.KindFailed {
			t.Errorf("record %+v", rec)
		}
		if n := kv.gets.Load() - before; n != 1 {
			t.Errorf("%d reads, want 1", n)
		}
	})
}

func TestRecordCacheBounds(t *testing.T) {
	rec := func(id string, status lifecycle.Kind) *record {
		return &record{Record: client.Record{DispatchID: id, Status: status}}
	}
	t.Run("an older revision does not replace a newer one", func(t *testing.T) {
		c := newRecordCache(10, 1<<20)
		c.wrote(rec("a", lifecycle.KindStarted), []byte("new"), 5)
		c.wrote(rec("a", lifecycle.KindAccepted), []byte("old"), 4)
		if e, _ := c.get("a"); string(e.data) != "new" || e.rev != 5 {
			t.Errorf("kept %q at %d, want new at 5", e.data, e.rev)
		}
	})
	t.Run("at most max entries", func(t *testing.T) {
		c := newRecordCache(4, 1<<20)
		for i := range 20 {
			c.wrote(rec(fmt.Sprint("d", i), lifecycle.KindStarted), []byte("x"), uint64(i+1))
		}
		if n := c.len(); n > 4 {
			t.Errorf("%d entries, want at most 4", n)
		}
		if _, ok := c.get("d19"); !ok {
			t.Error("the newest entry is gone")
		}
	})
	t.Run("at most maxBytes", func(t *testing.T) {
		c := newRecordCache(1000, 1000)
		for i := range 50 {
			c.wrote(rec(fmt.Sprint("d", i), lifecycle.KindStarted), []byte(strings.Repeat("x", 100)), uint64(i+1))
		}
		if n := c.len(); n > 10 {
			t.Errorf("%d entries of 100 bytes, want at most 10 in 1000 bytes", n)
		}
	})
	t.Run("an ended dispatch and a large record are not kept", func(t *testing.T) {
		c := newRecordCache(10, 1<<30)
		c.wrote(rec("a", lifecycle.KindStarted), []byte("x"), 1)
		c.wrote(rec("a", lifecycle.KindFinished), []byte("y"), 2)
		c.wrote(rec("b", lifecycle.KindStarted), make([]byte, maxCachedRecord+1), 3)
		if c.len() != 0 {
			t.Errorf("%d entries, want 0", c.len())
		}
	})
}

// projectionService is a dispatcher on a provisioned server with the
// bindings the projection uses, its store on agora_dispatches as wrap
// makes it (nil: the bucket itself). It returns the bucket too.
func projectionService(t *testing.T, id string, wrap func(jetstream.KeyValue) jetstream.KeyValue) (*Service, *bindings, jetstream.KeyValue) {
	t.Helper()
	srv := natstest.StartProvisioned(t, provision.Config{})
	js := srv.JetStream(t)
	raw := natstest.KeyValue(t, js, lifecycle.BucketDispatches)
	s, err := New(Config{ID: id}, Deps{Conn: srv.Conn(t), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	kv := raw
	if wrap != nil {
		kv = wrap(raw)
	}
	return s, &bindings{js: js, store: newStore(js, kv, nil)}, raw
}

// acceptedRecord is the record acceptance creates for a root dispatch:
// accepted, queued, listing its accepted event.
func acceptedRecord(id string) record {
	now := time.Now().UTC()
	return record{Record: client.Record{DispatchID: id, ThreadID: id, Subagent: "planner", Status: lifecycle.KindAccepted, CreatedAt: now, AcceptedAt: &now, UpdatedAt: now,
		Request: &lifecycle.Request{DispatchID: id, ThreadID: id, Subagent: "planner"},
		Events:  []client.EventRef{{ID: lifecycle.AcceptedID(id), Kind: lifecycle.KindAccepted, Time: now}}}, Queued: true}
}
