package dispatcher

import (
	"encoding/json"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// newTestStores returns two stores over one provisioned agora_dispatches,
// as two dispatchers have, each with its own copy of what it wrote, and
// the JetStream to look behind them.
func newTestStores(t *testing.T) (store, store, jetstream.JetStream) {
	t.Helper()
	srv := natstest.StartProvisioned(t, provision.Config{})
	js := srv.JetStream(t)
	kv := natstest.KeyValue(t, js, lifecycle.BucketDispatches)
	questions := natstest.KeyValue(t, js, lifecycle.BucketQuestions)
	a, err := newStore(js, kv, questions)
	if err != nil {
		t.Fatal(err)
	}
	b, err := newStore(js, kv, questions)
	if err != nil {
		t.Fatal(err)
	}
	return a, b, js
}

// lastWrite returns the headers of the last write of key in bucket,
// failing the test when it cannot be read.
func lastWrite(t *testing.T, js jetstream.JetStream, bucket, key string) nats.Header {
	t.Helper()
	stream, err := js.Stream(t.Context(), "KV_"+bucket)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := stream.GetLastMsgForSubject(t.Context(), "$KV."+bucket+"."+key)
	if err != nil {
		t.Fatal(err)
	}
	return raw.Header
}

// The store is the records' one home (docs/storage.md, "The dispatch
// record and the reconciler"): these check what it promises against a
// real JetStream, two stores standing for two dispatchers.
func TestStore(t *testing.T) {
	a, b, js := newTestStores(t)
	ctx := t.Context()
	newRecord := func(id string) *record {
		now := time.Now().UTC()
		return &record{Record: client.Record{DispatchID: id, ThreadID: id, Subagent: "planner", Status: lifecycle.KindAccepted, CreatedAt: now, UpdatedAt: now}}
	}

	t.Run("get, create and a taken id", func(t *testing.T) {
		if _, _, err := a.get(ctx, "nobody"); !errors.Is(err, errNoRecord) {
			t.Errorf("get of a missing record = %v, want errNoRecord", err)
		}
		if _, _, err := a.get(ctx, "bad.id*"); !errors.Is(err, errNoRecord) {
			t.Errorf("get of an invalid key = %v, want errNoRecord", err)
		}
		rev, err := a.create(ctx, newRecord("s-1"))
		if err != nil || rev == 0 {
			t.Fatalf("create = %d, %v", rev, err)
		}
		if _, err := b.create(ctx, newRecord("s-1")); !errors.Is(err, errConflict) {
			t.Errorf("a second create of s-1 = %v, want errConflict", err)
		}
		got, grev, err := b.get(ctx, "s-1")
		if err != nil || got.DispatchID != "s-1" || got.Subagent != "planner" || grev != rev {
			t.Errorf("get = %+v at %d, %v; want s-1 at %d", got, grev, err, rev)
		}
	})

	t.Run("concurrent updates through two stores converge by compare-and-set", func(t *testing.T) {
		if _, err := a.create(ctx, newRecord("s-cas")); err != nil {
			t.Fatal(err)
		}
		// 8 writers × 5 increments: 40 writes in all, so no writer can
		// lose the compare-and-set maxCAS times.
		const writers, each = 8, 5
		var wg sync.WaitGroup
		errs := make(chan error, writers*each)
		for w := range writers {
			st := a
			if w%2 == 1 {
				st = b
			}
			wg.Go(func() {
				for range each {
					if _, err := st.update(ctx, "s-cas", func(r *record) bool { r.Attempt++; return true }); err != nil {
						errs <- err
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		got, _, err := b.get(ctx, "s-cas")
		if err != nil || got.Attempt != writers*each {
			t.Errorf("attempt = %d, %v; want %d (every increment kept, none lost)", got.Attempt, err, writers*each)
		}
		// A mutation that changes nothing writes nothing.
		_, before, _ := a.get(ctx, "s-cas")
		if _, err := a.update(ctx, "s-cas", func(*record) bool { return false }); err != nil {
			t.Fatal(err)
		}
		if _, after, _ := a.get(ctx, "s-cas"); after != before {
			t.Errorf("revision %d → %d after an update that changed nothing", before, after)
		}
	})

	t.Run("a stale copy loses the compare-and-set and is forgotten", func(t *testing.T) {
		if _, err := a.create(ctx, newRecord("s-copy")); err != nil {
			t.Fatal(err)
		}
		stale, rev, err := a.cached(ctx, "s-copy")
		if err != nil || rev == 0 {
			t.Fatalf("cached = %d, %v", rev, err)
		}
		if _, err := b.update(ctx, "s-copy", func(r *record) bool { r.WorkerID = "w-b"; return true }); err != nil {
			t.Fatal(err)
		}
		stale.Attempt = 1
		if _, err := a.put(ctx, &stale, rev); !errors.Is(err, errConflict) {
			t.Fatalf("put over a stale revision = %v, want errConflict", err)
		}
		if _, ok := a.cache.get("s-copy"); ok {
			t.Error("the stale copy is still kept after a lost compare-and-set")
		}
		// updateFrom with the stale copy reads again and keeps the other
		// writer's change.
		got, err := a.updateFrom(ctx, stale, rev, func(r *record) bool { r.Attempt = 2; return true })
		if err != nil || got.Attempt != 2 || got.WorkerID != "w-b" {
			t.Errorf("updateFrom = attempt %d worker %q, %v; want 2 and w-b", got.Attempt, got.WorkerID, err)
		}
	})

	t.Run("the index lists the thread's dispatches in round order, once each", func(t *testing.T) {
		if _, err := a.thread(ctx, "th-none"); !errors.Is(err, errNoRecord) {
			t.Errorf("thread of an unindexed thread = %v, want errNoRecord", err)
		}
		if err := a.index(ctx, "th-1", 0, "th-1"); err != nil {
			t.Fatal(err)
		}
		// Later rounds indexed out of order, concurrently, through both
		// stores, some twice.
		entries := []threadEntry{{3, "d-3"}, {1, "d-1b"}, {2, "d-2"}, {1, "d-1a"}, {3, "d-3"}, {0, "th-1"}}
		var wg sync.WaitGroup
		errs := make(chan error, len(entries))
		for i, e := range entries {
			st := a
			if i%2 == 1 {
				st = b
			}
			wg.Go(func() { errs <- st.index(ctx, "th-1", e.Round, e.DispatchID) })
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Error(err)
			}
		}
		// indexFrom with a read made before another writer's entry still
		// keeps that entry.
		pre := a.readIndex(ctx, "th-1")
		if err := b.index(ctx, "th-1", 4, "d-4b"); err != nil {
			t.Fatal(err)
		}
		if err := a.indexFrom(ctx, "th-1", 4, "d-4a", pre); err != nil {
			t.Fatal(err)
		}
		idx, err := b.thread(ctx, "th-1")
		if err != nil {
			t.Fatal(err)
		}
		want := []threadEntry{{0, "th-1"}, {1, "d-1a"}, {1, "d-1b"}, {2, "d-2"}, {3, "d-3"}, {4, "d-4a"}, {4, "d-4b"}}
		if idx.ThreadID != "th-1" || !slices.Equal(idx.Dispatches, want) {
			t.Errorf("index %s = %v, want %v", idx.ThreadID, idx.Dispatches, want)
		}
	})

	t.Run("an ended thread's index expires until a new round is indexed", func(t *testing.T) {
		if _, err := a.expireIndex(ctx, "th-none", time.Now().Add(time.Hour)); !errors.Is(err, errNoRecord) {
			t.Errorf("expireIndex of an unindexed thread = %v, want errNoRecord", err)
		}
		if err := a.index(ctx, "th-exp", 0, "th-exp"); err != nil {
			t.Fatal(err)
		}
		expires := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
		if _, err := a.expireIndex(ctx, "th-exp", expires); err != nil {
			t.Fatal(err)
		}
		idx, err := b.thread(ctx, "th-exp")
		if err != nil || idx.ExpiresAt == nil || !idx.ExpiresAt.Equal(expires) {
			t.Fatalf("index after expireIndex: expires %v, %v; want %v", idx.ExpiresAt, err, expires)
		}
		if h := lastWrite(t, js, lifecycle.BucketDispatches, threadKey("th-exp")); h.Get("Nats-TTL") == "" {
			t.Errorf("the expiring index was written without a TTL (headers %v)", h)
		}
		if err := b.index(ctx, "th-exp", 1, "th-exp-1"); err != nil {
			t.Fatal(err)
		}
		if idx, err := a.thread(ctx, "th-exp"); err != nil || idx.ExpiresAt != nil || len(idx.Dispatches) != 2 {
			t.Errorf("index after a new round = %+v, %v; want two rounds and no expiry", idx, err)
		}
	})

	t.Run("unstarted lists the acceptances written since", func(t *testing.T) {
		since := time.Now()
		for _, r := range []struct {
			id            string
			failed, noReq bool
		}{{"u-2", false, false}, {"u-1", false, false}, {"u-ended", true, false}, {"u-refused", true, true}} {
			rec := newRecord(r.id)
			if r.failed {
				rec.Status = lifecycle.KindFailed
			}
			if !r.noReq {
				rec.Request = &lifecycle.Request{DispatchID: r.id, ThreadID: r.id, Subagent: "planner"}
			}
			if _, err := a.create(ctx, rec); err != nil {
				t.Fatal(err)
			}
		}
		if err := a.index(ctx, "u-1", 0, "u-1"); err != nil {
			t.Fatal(err)
		}
		// u-2's thread ended: its last write, the expiry, decides.
		if _, err := b.update(ctx, "u-2", func(r *record) bool { r.ExpiresAt = new(time.Now().Add(time.Hour)); return true }); err != nil {
			t.Fatal(err)
		}
		ids, err := a.unstarted(ctx, since, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{"u-1"}; !slices.Equal(ids, want) {
			t.Errorf("unstarted = %v, want %v", ids, want)
		}
		// Created after createdBefore: too young to be a candidate.
		if ids, err := a.unstarted(ctx, since, since.Add(-time.Second)); err != nil || len(ids) != 0 {
			t.Errorf("unstarted of acceptances younger than asked = %v, %v; want none", ids, err)
		}
	})
}

// Put keeps a record that is set to expire expiring: it is written with
// its TTL (docs/storage.md, "Retention").
func TestStorePutKeepsTheTTL(t *testing.T) {
	a, _, js := newTestStores(t)
	ctx := t.Context()
	now := time.Now().UTC()
	rec := record{Record: client.Record{DispatchID: "ttl-1", ThreadID: "ttl-1", Subagent: "planner", Status: lifecycle.KindFinished, CreatedAt: now, UpdatedAt: now}}
	rev, err := a.create(ctx, &rec)
	if err != nil {
		t.Fatal(err)
	}
	exp := now.Add(time.Hour).Truncate(time.Second)
	rec.ExpiresAt = &exp
	if _, err := a.put(ctx, &rec, rev); err != nil {
		t.Fatal(err)
	}
	if h := lastWrite(t, js, lifecycle.BucketDispatches, "ttl-1"); h.Get("Nats-TTL") == "" {
		t.Errorf("headers %v: the expiring record was written without a TTL", h)
	}
	got, _, err := a.get(ctx, "ttl-1")
	if err != nil || got.ExpiresAt == nil || !got.ExpiresAt.Equal(exp) {
		t.Errorf("record expires %v, %v; want %v", got.ExpiresAt, err, exp)
	}
}

// A closed question is written again with its TTL and expires_at; a
// question still asked or joined to one asked, one already expiring, a missing one and a value
// the router did not write are left alone (docs/storage.md, "Retention").
func TestStoreExpireQuestion(t *testing.T) {
	a, _, js := newTestStores(t)
	ctx := t.Context()
	questions := natstest.KeyValue(t, js, lifecycle.BucketQuestions)
	put := func(qid, value string) uint64 {
		t.Helper()
		rev, err := questions.Put(ctx, qid, []byte(value))
		if err != nil {
			t.Fatal(err)
		}
		return rev
	}
	expires := time.Now().Add(time.Hour).UTC().Truncate(time.Second)

	put("q-answered", `{"question_id":"q-answered","status":"answered"}`)
	if err := a.expireQuestion(ctx, "q-answered", expires); err != nil {
		t.Fatal(err)
	}
	e, err := questions.Get(ctx, "q-answered")
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Status    string     `json:"status"`
		ExpiresAt *time.Time `json:"expires_at"`
	}
	if err := json.Unmarshal(e.Value(), &got); err != nil || got.Status != "answered" || got.ExpiresAt == nil || !got.ExpiresAt.Equal(expires) {
		t.Errorf("closed question after expireQuestion: %s (%v); want status answered, expires %v", e.Value(), err, expires)
	}
	if h := lastWrite(t, js, lifecycle.BucketQuestions, "q-answered"); h.Get("Nats-TTL") == "" {
		t.Errorf("the closed question was written without a TTL (headers %v)", h)
	}

	for qid, value := range map[string]string{
		"q-asked":    `{"question_id":"q-asked","status":"asked"}`,
		"q-joined":   `{"question_id":"q-joined","status":"joined","joined_to":"q-asked"}`,
		"q-expiring": `{"question_id":"q-expiring","status":"answered","expires_at":"2030-01-01T00:00:00Z"}`,
		"q-foreign":  `not json`,
	} {
		rev := put(qid, value)
		if err := a.expireQuestion(ctx, qid, expires); err != nil {
			t.Errorf("expireQuestion %s: %v", qid, err)
		}
		e, err := questions.Get(ctx, qid)
		if err != nil {
			t.Fatal(err)
		}
		if e.Revision() != rev {
			t.Errorf("%s was written again (revision %d → %d); want it left alone", qid, rev, e.Revision())
		}
	}
	if err := a.expireQuestion(ctx, "q-none", expires); err != nil {
		t.Errorf("expireQuestion of a missing question = %v, want nil", err)
	}
}
