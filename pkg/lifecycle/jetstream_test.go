package lifecycle_test

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// An encoded event travels through a real AGORA_LIFECYCLE stream and comes
// back equal; publishing it again is dropped as a duplicate.
func TestLifecycleOverJetStream(t *testing.T) {
	js := natstest.StartProvisioned(t, provision.Config{}).JetStream(t)
	ctx := t.Context()

	want := &lifecycle.Finished{Common: common(), DurationMS: 42, Output: json.RawMessage(`{"n":1e400}`), StdoutTail: "ok"}
	tp := lifecycle.NewTraceparent()
	e, m, err := lifecycle.Message(lifecycle.Source("worker", "w-1"), want, lifecycle.WithTime(testTime), lifecycle.WithTraceparent(tp))
	if err != nil {
		t.Fatalf("Message: %v", err)
	}

	ack, err := js.PublishMsg(ctx, m)
	if err != nil {
		t.Fatalf("publish: %v", err)
	}
	if ack.Stream != lifecycle.StreamLifecycle || ack.Duplicate {
		t.Fatalf("first PubAck = %+v, want a new message on %s", ack, lifecycle.StreamLifecycle)
	}

	// Same event again, as a retried publish would send it.
	_, again, err := lifecycle.Message(lifecycle.Source("worker", "w-2"), want)
	if err != nil {
		t.Fatal(err)
	}
	ack2, err := js.PublishMsg(ctx, again)
	if err != nil {
		t.Fatalf("second publish: %v", err)
	}
	if !ack2.Duplicate || ack2.Sequence != ack.Sequence {
		t.Errorf("second PubAck = %+v, want Duplicate of sequence %d", ack2, ack.Sequence)
	}

	c, err := js.OrderedConsumer(ctx, lifecycle.StreamLifecycle, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{lifecycle.LifecycleFilter(lifecycle.KindFinished, threadID, "")},
	})
	if err != nil {
		t.Fatalf("ordered consumer: %v", err)
	}
	msg, err := c.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		t.Fatalf("next: %v", err)
	}
	if msg.Subject() != m.Subject {
		t.Errorf("subject = %q, want %q", msg.Subject(), m.Subject)
	}
	if got := msg.Headers().Get(jetstream.MsgIDHeader); got != dispatchID+".terminal" {
		t.Errorf("Nats-Msg-Id = %q, want %s.terminal", got, dispatchID)
	}
	got, err := lifecycle.DecodeMsg(msg)
	if err != nil {
		t.Fatalf("DecodeMsg: %v", err)
	}
	checkSameEvent(t, got, e)
	if lifecycle.TraceID(lifecycle.Traceparent(got)) != lifecycle.TraceID(tp) {
		t.Errorf("trace id lost: %q from %q", lifecycle.Traceparent(got), tp)
	}
	d, err := lifecycle.Parse(got)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if !reflect.DeepEqual(d, lifecycle.Data(want)) {
		t.Errorf("Parse = %+v, want %+v", d, want)
	}

	info, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.NumPending != 0 {
		t.Errorf("%d more messages on the stream, want the duplicate dropped", info.NumPending)
	}
}
