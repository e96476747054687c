package dispatcher

import (
	"encoding/json"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// A projection shard takes the events of several dispatches together
// (projectBatch) and writes only what they do not carry: a run writes
// nothing, the end of a thread its record's expiry, once, and a
// redelivered event nothing. The status every door answers is derived
// from the chain (store.view). The batch is made here by fetching the
// stored events, so what waits together is not left to timing.
func TestProjectionWritesOnlyThreadEnds(t *testing.T) {
	s, b, _ := projectionService(t, "batch", nil)
	js := b.js
	writes := func() int {
		t.Helper()
		mfs, err := s.gatherer.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "agora_dispatcher_projection_writes_total" {
				return int(mf.GetMetric()[0].GetCounter().GetValue())
			}
		}
		return 0 // not written yet
	}
	accepted := func(id string) lifecycle.Common {
		t.Helper()
		rec := acceptedRecord(id)
		if _, err := b.store.create(t.Context(), &rec); err != nil {
			t.Fatal(err)
		}
		return rec.Common()
	}
	publish := func(d lifecycle.Lifecycle) {
		t.Helper()
		_, msg, err := lifecycle.Message("test", d)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.PublishMsg(t.Context(), msg); err != nil {
			t.Fatal(err)
		}
	}
	// batch fetches the n events stored on the dispatches' subjects, in
	// stream order, as one batch for one shard.
	batch := func(n int, ids ...string) []jetstream.Msg {
		t.Helper()
		var filters []string
		for _, id := range ids {
			filters = append(filters, lifecycle.LifecycleFilter("", id, id))
		}
		c, err := js.OrderedConsumer(t.Context(), lifecycle.StreamLifecycle, jetstream.OrderedConsumerConfig{FilterSubjects: filters})
		if err != nil {
			t.Fatal(err)
		}
		got, err := c.FetchNoWait(n)
		if err != nil {
			t.Fatal(err)
		}
		var msgs []jetstream.Msg
		for m := range got.Messages() {
			msgs = append(msgs, m)
		}
		if len(msgs) != n {
			t.Fatalf("fetched %d events, want %d", len(msgs), n)
		}
		return msgs
	}
	// stored is the record as a door answers it, and whether it is set
	// to expire.
	stored := func(id string) client.Record {
		t.Helper()
		rec, _, err := b.store.view(t.Context(), id)
		if err != nil {
			t.Fatal(err)
		}
		return rec.Record
	}

	t.Run("started and finished of one dispatch: one write, the expiry", func(t *testing.T) {
		c := accepted("b-1")
		publish(&lifecycle.Started{Common: c, WorkerID: "w", Attempt: 1})
		publish(&lifecycle.Finished{Common: c, Output: json.RawMessage(`{"n":1}`)})
		before := writes()
		s.projectBatch(t.Context(), b, batch(2, "b-1"))
		if n := writes() - before; n != 1 {
			t.Errorf("%d writes, want 1", n)
		}
		got := stored("b-1")
		if got.Status != lifecycle.KindFinished || got.WorkerID != "w" || got.StartedAt == nil || got.EndedAt == nil || len(got.Events) != 3 ||
			got.Events[1].Kind != lifecycle.KindStarted || got.Events[2].Kind != lifecycle.KindFinished || got.ExpiresAt == nil {
			t.Errorf("record: %+v", got)
		}
	})

	t.Run("two dispatches interleaved: the ended one's expiry alone", func(t *testing.T) {
		a, z := accepted("b-2a"), accepted("b-2z")
		publish(&lifecycle.Started{Common: a, WorkerID: "w", Attempt: 1})
		publish(&lifecycle.Started{Common: z, WorkerID: "w", Attempt: 1})
		publish(&lifecycle.Failed{Common: a, Reason: lifecycle.ReasonProviderFailed, Detail: "exit status 2"})
		before := writes()
		s.projectBatch(t.Context(), b, batch(3, "b-2a", "b-2z"))
		if n := writes() - before; n != 1 {
			t.Errorf("%d writes, want 1", n)
		}
		if got := stored("b-2a"); got.Status != lifecycle.KindFailed || len(got.Events) != 3 || got.Result == nil || got.Result.Reason != lifecycle.ReasonProviderFailed {
			t.Errorf("b-2a: %+v", got)
		}
		if got := stored("b-2z"); got.Status != lifecycle.KindStarted || len(got.Events) != 2 || got.ExpiresAt != nil {
			t.Errorf("b-2z: %+v", got)
		}
	})

	t.Run("a redelivery beside a new event: the new one alone is written", func(t *testing.T) {
		c := accepted("b-3")
		publish(&lifecycle.Started{Common: c, WorkerID: "w", Attempt: 1})
		before := writes()
		s.projectBatch(t.Context(), b, batch(1, "b-3"))
		if n := writes() - before; n != 0 {
			t.Errorf("%d writes for started, want 0", n)
		}
		publish(&lifecycle.Finished{Common: c, Output: json.RawMessage(`null`)})
		before = writes()
		s.projectBatch(t.Context(), b, batch(2, "b-3")) // started again, and finished
		if n := writes() - before; n != 1 {
			t.Errorf("%d writes, want 1", n)
		}
		if got := stored("b-3"); got.Status != lifecycle.KindFinished || len(got.Events) != 3 {
			t.Errorf("record: %+v", got)
		}
		before = writes()
		s.projectBatch(t.Context(), b, batch(2, "b-3")) // both again
		if n := writes() - before; n != 0 {
			t.Errorf("%d writes for two redeliveries, want 0", n)
		}
	})
}

// An idle projection shard holds none of the messages it applied: the
// batch array it reuses is cleared after each batch.
func TestShardHoldsNoAppliedMessages(t *testing.T) {
	type msg struct{ jetstream.Msg }
	ch := make(chan jetstream.Msg, 3*maxProjectBatch)
	for range cap(ch) {
		ch <- msg{}
	}
	close(ch)
	var batches [][]jetstream.Msg
	n := 0
	runShard(ch, func(batch []jetstream.Msg) {
		n += len(batch)
		batches = append(batches, batch)
	})
	if n != cap(ch) {
		t.Fatalf("applied %d messages, want %d", n, cap(ch))
	}
	for _, b := range batches {
		for i, m := range b[:cap(b)] {
			if m != nil {
				t.Fatalf("the shard still holds message %d of a batch it applied", i)
			}
		}
	}
}
