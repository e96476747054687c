package containertest_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/testcontainers/testcontainers-go"

	"github.com/agora-dispatch/agora/internal/testkit"
	agora "github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// TestFirstDeliveryFenceOnR3: on the three-node cluster, with
// AGORA_LIFECYCLE at three replicas, a first delivery fences its `started`
// on the accepted event's sequence its work message names, without reading
// the chain, and every dispatch runs once; a finished dispatch's work
// delivered again as attempt 1 is skipped, although the replicated stream
// acknowledges its repeated `started` as a duplicate; a dispatch cancelled
// while its work waits (both worker containers paused) has its `started`
// refused by the stream leader and is skipped, never run
// (docs/worker.md#fencing).
func TestFirstDeliveryFenceOnR3(t *testing.T) {
	e := newEnv(t)
	e.register(sleeper("quick", 10*time.Millisecond))
	c := e.client()
	ctx := t.Context()

	const n = 6
	for i := range n {
		d := retry(ctx, t, "dispatch", time.Minute, func(ctx context.Context) (*agora.Dispatch, error) {
			return c.Dispatch(ctx, lifecycle.Request{DispatchID: fmt.Sprintf("fence-%d", i), Subagent: "quick"})
		})
		wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		end, err := c.Follow(wctx, d.ThreadID, nil)
		cancel()
		if err != nil {
			t.Fatalf("wait %s: %v", d.DispatchID, err)
		}
		if _, ok := end.Data.(*lifecycle.Finished); !ok {
			t.Fatalf("%s ended %s %+v, want finished", d.DispatchID, end.Kind(), end.Data)
		}
		e.assertChain(d.DispatchID, lifecycle.KindAccepted, lifecycle.KindStarted, lifecycle.KindFinished)
	}

	// The first dispatch's work message delivered again as attempt 1 (a
	// copy published by hand under another message id, as a consumer
	// created anew would deliver it): its `started` is a repeat of the
	// one stored, which a replicated stream drops as a duplicate before
	// it checks the fence. The worker asks the leader whose it is and
	// skips the finished dispatch; nothing runs or is stored.
	again := lifecycle.Request{DispatchID: "fence-0", ThreadID: "fence-0", Subagent: "quick"}
	ev, err := lifecycle.New(lifecycle.Source("containertest", "t"), &again)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := lifecycle.Encode("agora.dispatch.quick", ev)
	if err != nil {
		t.Fatal(err)
	}
	msg.Header.Set(jetstream.MsgIDHeader, "fence-0-again")
	msg.Header.Set(lifecycle.AcceptedSeqHeader, strconv.FormatUint(e.eventSeq(lifecycle.KindAccepted, "fence-0"), 10))
	retry(ctx, t, "publish the work again", time.Minute, func(ctx context.Context) (*jetstream.PubAck, error) {
		return e.js.PublishMsg(ctx, msg)
	})
	e.waitWorkEmpty()
	e.assertChain("fence-0", lifecycle.KindAccepted, lifecycle.KindStarted, lifecycle.KindFinished)

	// Cancelled while queued: no worker takes the work until the
	// dispatch's `cancelled` is stored.
	for _, w := range workerIDs {
		e.pause(e.svc[w], true)
	}
	d := retry(ctx, t, "dispatch", time.Minute, func(ctx context.Context) (*agora.Dispatch, error) {
		return c.Dispatch(ctx, lifecycle.Request{DispatchID: "fence-cancelled", Subagent: "quick"})
	})
	rec := retry(ctx, t, "cancel", time.Minute, func(ctx context.Context) (*agora.Record, error) {
		return c.Cancel(ctx, d.DispatchID, agora.CancelBy("container-test", "cancelled while queued"))
	})
	if rec.Status != lifecycle.KindCancelled {
		t.Fatalf("cancel answered status %s, want cancelled", rec.Status)
	}
	for _, w := range workerIDs {
		e.pause(e.svc[w], false)
	}
	e.waitWorkEmpty()
	e.assertChain(d.DispatchID, lifecycle.KindAccepted, lifecycle.KindCancelled)

	fromHeader, reads := 0.0, 0.0
	skipped := 0.0
	for _, w := range workerIDs {
		m := e.metrics(e.svc[w])
		fromHeader += m[`agora_worker_fences_total{from="work_message"}`]
		reads += m[`agora_worker_fences_total{from="read"}`]
		skipped += m[`agora_worker_dispatches_total{kind="",reason="skipped"}`]
	}
	t.Logf("fences from the work message %v, from a read %v; skipped %v", fromHeader, reads, skipped)
	if fromHeader != n+2 || reads != 0 {
		t.Errorf("fences from the work message %v and from a read %v, want %d and 0", fromHeader, reads, n+2)
	}
	if skipped != 2 {
		t.Errorf("%v deliveries skipped, want 2 (the finished dispatch's work again, the dispatch cancelled while queued)", skipped)
	}
}

// eventSeq returns the stream sequence of a root dispatch's event of kind k.
func (e *env) eventSeq(k lifecycle.Kind, dispatchID string) uint64 {
	e.t.Helper()
	subj, err := lifecycle.LifecycleSubject(k, dispatchID, dispatchID)
	if err != nil {
		e.t.Fatal(err)
	}
	raw := retry(e.t.Context(), e.t, "read "+subj, time.Minute, func(ctx context.Context) (*jetstream.RawStreamMsg, error) {
		return e.stream(lifecycle.StreamLifecycle).GetLastMsgForSubject(ctx, subj)
	})
	return raw.Sequence
}

// assertChain checks a dispatch's events on AGORA_LIFECYCLE, in order. A
// read that fails (a node still catching up answers no responders) is
// tried again.
func (e *env) assertChain(dispatchID string, want ...lifecycle.Kind) {
	e.t.Helper()
	got := retry(e.t.Context(), e.t, dispatchID+"'s chain", time.Minute, func(ctx context.Context) ([]lifecycle.Kind, error) {
		cons, err := e.js.OrderedConsumer(ctx, lifecycle.StreamLifecycle, jetstream.OrderedConsumerConfig{FilterSubjects: []string{lifecycle.LifecycleFilter("", "", dispatchID)}})
		if err != nil {
			return nil, err
		}
		info, err := cons.Info(ctx)
		if err != nil {
			return nil, err
		}
		var got []lifecycle.Kind
		for range info.NumPending {
			m, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
			if err != nil {
				return nil, err
			}
			a, err := lifecycle.ParseLifecycleSubject(m.Subject())
			if err != nil {
				return nil, err
			}
			got = append(got, a.Kind)
		}
		return got, nil
	})
	if !slices.Equal(got, want) {
		e.t.Errorf("%s's chain %v, want %v", dispatchID, got, want)
	}
}

// pause freezes (or thaws) a container's processes.
func (e *env) pause(c *testcontainers.DockerContainer, freeze bool) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.t.Context(), 30*time.Second)
	defer cancel()
	cli, err := testcontainers.NewDockerClientWithOpts(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	defer cli.Close()
	if freeze {
		_, err = cli.ContainerPause(ctx, c.GetContainerID(), client.ContainerPauseOptions{})
	} else {
		_, err = cli.ContainerUnpause(ctx, c.GetContainerID(), client.ContainerUnpauseOptions{})
	}
	if err != nil {
		e.t.Fatalf("pause %v: %v", freeze, err)
	}
}

// metrics reads a service's Prometheus samples from its /metrics on port
// 9090, keyed by name and labels as exposed.
func (e *env) metrics(c *testcontainers.DockerContainer) map[string]float64 {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.t.Context(), 30*time.Second)
	defer cancel()
	host, err := c.Host(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	p, err := c.MappedPort(ctx, "9090/tcp")
	if err != nil {
		e.t.Fatal(err)
	}
	return testkit.Scrape(e.t, ctx, "http://"+host+":"+p.Port()+"/metrics")
}
