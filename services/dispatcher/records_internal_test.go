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
	"go.opentelemetry.io/otel/trace"

	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// countingKV counts the reads of dispatch records (not thread indexes) in
// a real bucket.
type countingKV struct {
	jetstream.KeyValue
	gets atomic.Int64
}

func (k *countingKV) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	if !strings.HasPrefix(key, "thread.") {
		k.gets.Add(1)
	}
	return k.KeyValue.Get(ctx, key)
}

// The projection writes no status (every door derives it from the
// chain: docs/storage.md, "The dispatch record and the reconciler"): a
// dispatch this dispatcher accepted costs it no read and no write until
// its thread ends, and then one write, its expiry, from its own copy.
// Counting reads needs the bucket's handle, which the black-box tests
// cannot reach; writes are counted on the bucket's stream.
func TestProjectionWritesOnlyWhatEventsDoNotCarry(t *testing.T) {
	var kv *countingKV
	s, b, raw := projectionService(t, "copy", func(raw jetstream.KeyValue) jetstream.KeyValue {
		kv = &countingKV{KeyValue: raw}
		return kv
	})
	writes := func() uint64 {
		t.Helper()
		st, err := b.js.Stream(t.Context(), "KV_"+lifecycle.BucketDispatches)
		if err != nil {
			t.Fatal(err)
		}
		info, err := st.Info(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return info.State.LastSeq
	}
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
	project := func(ds ...lifecycle.Lifecycle) {
		t.Helper()
		its := make([]*projected, len(ds))
		for i, d := range ds {
			e, err := lifecycle.New("test", d)
			if err != nil {
				t.Fatal(err)
			}
			its[i] = &projected{event: event{Event: e, Data: d}, log: slog.New(slog.DiscardHandler), ctx: t.Context(), span: trace.SpanFromContext(t.Context()), v: ack}
		}
		s.projectDispatch(b, its)
		for _, it := range its {
			if it.v != ack {
				t.Fatalf("event %s: verdict %+v, want ack", it.Event.ID(), it.v)
			}
		}
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

	t.Run("a run reads and writes nothing until its thread ends", func(t *testing.T) {
		c := accepted("own-1")
		reads, w := kv.gets.Load(), writes()
		project(&lifecycle.Accepted{Common: c})
		project(&lifecycle.Started{Common: c, WorkerID: "w1", Attempt: 1})
		if n := kv.gets.Load() - reads; n != 0 {
			t.Errorf("%d reads of the record, want 0", n)
		}
		if n := writes() - w; n != 0 {
			t.Errorf("%d writes for accepted and started, want 0", n)
		}
		project(&lifecycle.Finished{Common: c, ExitCode: 0})
		if n := kv.gets.Load() - reads; n != 0 {
			t.Errorf("%d reads of the record, want 0", n)
		}
		if n := writes() - w; n != 1 {
			t.Errorf("%d writes when the thread ended, want 1 (the expiry)", n)
		}
		got := stored("own-1")
		if got.ExpiresAt == nil || got.Status != lifecycle.KindAccepted || len(got.Events) != 1 {
			t.Errorf("stored: expires %v, status %s, events %+v; want an expiry and the record as accepted", got.ExpiresAt, got.Status, got.Events)
		}
		if _, ok := b.store.cache.get("own-1"); ok {
			t.Error("an ended thread's record is still kept")
		}
		// A redelivery of the end writes nothing more.
		w = writes()
		project(&lifecycle.Finished{Common: c, ExitCode: 0})
		if n := writes() - w; n != 0 {
			t.Errorf("%d writes for a redelivered end, want 0", n)
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
		rec.CancelRequested = &client.CancelMark{CancelRequest: lifecycle.CancelRequest{DispatchID: "own-3", ThreadID: "own-3", By: "ops"}, At: time.Now().UTC()}
		data, _ := json.Marshal(rec)
		if _, err := raw.Update(t.Context(), "own-3", data, e.Revision()); err != nil {
			t.Fatal(err)
		}
		before := kv.gets.Load()
		project(&lifecycle.Cancelled{Common: c, By: "ops"})
		got := stored("own-3")
		if got.ExpiresAt == nil || got.CancelRequested == nil || got.CancelRequested.By != "ops" {
			t.Errorf("after the end: expires %v, mark %+v; want an expiry with the other writer's mark", got.ExpiresAt, got.CancelRequested)
		}
		if n := kv.gets.Load() - before; n != 1 {
			t.Errorf("%d reads, want 1 (the compare-and-set failed once)", n)
		}
	})

	t.Run("a request refused on the stream gets its record", func(t *testing.T) {
		before := kv.gets.Load()
		c := lifecycle.Common{DispatchID: "foreign-1", ThreadID: "foreign-1", Subagent: "planner"}
		project(&lifecycle.Failed{Common: c, Reason: lifecycle.ReasonRejected, Detail: "refused"})
		if n := kv.gets.Load() - before; n != 1 {
			t.Errorf("%d reads, want 1", n)
		}
		got := stored("foreign-1")
		if got.Status != lifecycle.KindFailed || got.Result == nil || got.Result.Reason != lifecycle.ReasonRejected || got.ExpiresAt == nil {
			t.Errorf("record %+v", got)
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
	t.Run("an ended dispatch, an expiring one and a large record are not kept", func(t *testing.T) {
		c := newRecordCache(10, 1<<30)
		c.wrote(rec("a", lifecycle.KindStarted), []byte("x"), 1)
		c.wrote(rec("a", lifecycle.KindFinished), []byte("y"), 2)
		c.wrote(rec("b", lifecycle.KindStarted), make([]byte, maxCachedRecord+1), 3)
		exp := rec("c", lifecycle.KindAccepted)
		exp.ExpiresAt = new(time.Now())
		c.wrote(rec("c", lifecycle.KindAccepted), []byte("z"), 4)
		c.wrote(exp, []byte("z2"), 5)
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
	st, err := newStore(js, kv, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s, &bindings{js: js, store: st}, raw
}

// acceptedRecord is the record acceptance creates for a root dispatch:
// accepted, listing its accepted event.
func acceptedRecord(id string) record {
	now := time.Now().UTC()
	return record{Record: client.Record{DispatchID: id, ThreadID: id, Subagent: "planner", Status: lifecycle.KindAccepted, CreatedAt: now, AcceptedAt: &now, UpdatedAt: now,
		Request: &lifecycle.Request{DispatchID: id, ThreadID: id, Subagent: "planner"},
		Events:  []client.EventRef{{ID: lifecycle.AcceptedID(id), Kind: lifecycle.KindAccepted, Time: now}}}}
}
