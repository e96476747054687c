package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// The acceptance commit (docs/performance.md, "The acceptance's commit"):
// the dispatcher stores two messages per dispatch, its accepted event and
// the work message, on two streams, the work after accepted is
// acknowledged; JetStream's atomic batch (ADR-50) could commit both to one
// stream in one round trip. These rows measure the raw cost of
// each way on this run's server, with payloads of an accepted event's and a
// work message's size, so the choice rests on figures.

// Headers of JetStream's atomic batch publish (ADR-50) and per-subject
// compare-and-set.
const (
	hdrBatchID        = "Nats-Batch-Id"
	hdrBatchSeq       = "Nats-Batch-Sequence"
	hdrBatchCommit    = "Nats-Batch-Commit"
	hdrExpectLastSubj = "Nats-Expected-Last-Subject-Sequence"
)

// commitScenarios returns the ways of storing the pair, in the order
// printed: two streams pipelined (the acceptance before step 4), one
// stream pipelined, and one atomic batch on one stream; then the
// acceptance with a worker's first fence, before step 4 (the pair
// pipelined, then the fence read) and after it (`accepted` acknowledged,
// then the work); every stream file-backed with replicas copies.
func commitScenarios(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, replicas int, fenceReads, fenceMisses *atomic.Int64) ([]scenario, error) {
	var events jetstream.Stream // the accepted events', read as a worker reads its fence
	for _, sc := range []jetstream.StreamConfig{
		{Name: "BENCH_COMMIT_EVT", Subjects: []string{"bench.commit.evt.>"}, Storage: jetstream.FileStorage, AllowDirect: true},
		{Name: "BENCH_COMMIT_WORK", Subjects: []string{"bench.commit.work.>"}, Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage},
		{Name: "BENCH_COMMIT_ONE", Subjects: []string{"bench.commit.one.>"}, Storage: jetstream.FileStorage, AllowAtomicPublish: true},
	} {
		sc.Replicas = replicas
		st, err := js.CreateOrUpdateStream(ctx, sc)
		if err != nil {
			return nil, fmt.Errorf("bench: stream %s: %w", sc.Name, err)
		}
		if events == nil {
			events = st
		}
	}
	// Bodies about the size of a no-op dispatch's accepted event and work
	// message with their CloudEvents headers (which these carry in the
	// body: only Nats-Msg-Id is set as a header).
	evt := []byte(`{"dispatch_id":"` + strings.Repeat("x", 26) + `","thread_id":"` + strings.Repeat("x", 26) + `","round":0,"subagent":"bench","subagent_revision":1}` + strings.Repeat(" ", 200))
	work := []byte(`{"subagent":"bench","input":{},"dispatch_id":"` + strings.Repeat("x", 26) + `"}` + strings.Repeat(" ", 400))
	pair := func(id, evtSubj, workSubj string) (*nats.Msg, *nats.Msg) {
		a := nats.NewMsg(evtSubj + id)
		a.Header.Set(jetstream.MsgIDHeader, "accepted-"+id)
		a.Data = evt
		w := nats.NewMsg(workSubj + id)
		w.Header.Set(jetstream.MsgIDHeader, id)
		w.Data = work
		return a, w
	}
	pipelined := func(evtSubj, workSubj string) func(context.Context, string) error {
		return func(ctx context.Context, id string) error {
			a, w := pair(id, evtSubj, workSubj)
			fa, err := js.PublishMsgAsync(a)
			if err != nil {
				return err
			}
			if _, err := js.PublishMsg(ctx, w); err != nil {
				return err
			}
			select {
			case <-fa.Ok():
				return nil
			case err := <-fa.Err():
				return err
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	batch := func(ctx context.Context, id string) error {
		a, w := pair(id, "bench.commit.one.evt.", "bench.commit.one.work.")
		a.Header.Set(hdrBatchID, id)
		a.Header.Set(hdrBatchSeq, "1")
		// The work message is stored only if its subject has none yet,
		// as step 3 would guard it per dispatch.
		w.Header.Set(hdrBatchID, id)
		w.Header.Set(hdrBatchSeq, "2")
		w.Header.Set(hdrBatchCommit, "1")
		w.Header.Set(hdrExpectLastSubj, "0")
		if err := nc.PublishMsg(a); err != nil { // only the commit is acknowledged
			return err
		}
		// nats.go's PubAck has no batch fields: the reply is read here.
		reply, err := nc.RequestMsgWithContext(ctx, w)
		if err != nil {
			return err
		}
		var ack struct {
			Seq   uint64 `json:"seq"`
			Batch string `json:"batch"`
			Count int    `json:"count"`
			Error *struct {
				Description string `json:"description"`
			} `json:"error"`
		}
		if err := json.Unmarshal(reply.Data, &ack); err != nil {
			return fmt.Errorf("bench: batch %s: reply %q: %w", id, reply.Data, err)
		}
		if ack.Error != nil || ack.Batch != id || ack.Count != 2 {
			return fmt.Errorf("bench: batch %s not committed whole: %s", id, reply.Data)
		}
		return nil
	}
	// What a worker's first `started` waits on besides the work's
	// delivery, before step 4 and after it (docs/worker.md#fencing): the
	// pair pipelined and then the fence read by direct get, against
	// `accepted` acknowledged before the work is sent, whose sequence the
	// work carries.
	// A direct get may be answered by a replica that has not stored the
	// event yet: the worker then read again, from 1 ms backing off, as
	// here (its awaitAccepted before step 4).
	pipelinedThenRead := func(ctx context.Context, id string) error {
		if err := pipelined("bench.commit.evt.", "bench.commit.work.")(ctx, id); err != nil {
			return err
		}
		fenceReads.Add(1)
		start := time.Now()
		for wait := time.Millisecond; ; wait = min(2*wait, 200*time.Millisecond) {
			_, err := events.GetLastMsgForSubject(ctx, "bench.commit.evt."+id)
			if !errors.Is(err, jetstream.ErrMsgNotFound) {
				return err
			}
			fenceMisses.Add(1)
			if time.Since(start) > 2*time.Second { // the worker's bound
				return fmt.Errorf("bench: the accepted event %s not read within 2s of its acknowledgement", id)
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("bench: the accepted event %s not read: %w", id, ctx.Err())
			case <-time.After(wait):
			}
		}
	}
	sequential := func(ctx context.Context, id string) error {
		a, w := pair(id, "bench.commit.evt.", "bench.commit.work.")
		ack, err := js.PublishMsg(ctx, a)
		if err != nil {
			return err
		}
		w.Header.Set(lifecycle.AcceptedSeqHeader, strconv.FormatUint(ack.Sequence, 10))
		_, err = js.PublishMsg(ctx, w)
		return err
	}
	return []scenario{
		{name: "commit of two: pipelined publishes to two streams (the acceptance before step 4)", do: pipelined("bench.commit.evt.", "bench.commit.work.")},
		{name: "commit of two: pipelined publishes to one stream", do: pipelined("bench.commit.one.evt.", "bench.commit.one.work.")},
		{name: "commit of two: one atomic batch on one stream (work guarded by expected last subject sequence 0)", do: batch},
		{name: "acceptance and first fence: two streams pipelined, then the fence read by direct get (before step 4)", do: pipelinedThenRead},
		{name: "acceptance and first fence: accepted acknowledged, then the work naming its sequence (step 4)", do: sequential},
	}, nil
}
