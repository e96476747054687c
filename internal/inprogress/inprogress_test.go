package inprogress_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/inprogress"
	"github.com/agora-dispatch/agora/internal/natstest"
)

// A delivery worked on for several AckWaits is not redelivered while Start
// keeps it alive, and is redelivered once stop ends the news.
func TestStartHoldsTheDelivery(t *testing.T) {
	js := natstest.Start(t).JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t"}}); err != nil {
		t.Fatal(err)
	}
	const ackWait = 300 * time.Millisecond
	c, err := js.CreateConsumer(ctx, "T", jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "t", []byte("x")); err != nil {
		t.Fatal(err)
	}
	m, err := c.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var failed int
	stop := inprogress.Start(m, inprogress.Period(ackWait), func(error) { failed++ })
	// Four AckWaits without an ack: without the news, a redelivery comes.
	if again, err := c.Next(jetstream.FetchMaxWait(4 * ackWait)); err == nil {
		t.Fatalf("redelivered (delivery %s) while kept alive", again.Reply())
	}
	stop()
	if failed != 0 {
		t.Fatalf("%d in-progress acks failed", failed)
	}
	again, err := c.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		t.Fatalf("no redelivery once stopped: %v", err)
	}
	if md, _ := again.Metadata(); md == nil || md.NumDelivered != 2 {
		t.Fatalf("redelivery metadata %+v, want delivery 2", md)
	}
}

func TestPeriod(t *testing.T) {
	for _, tc := range []struct{ ackWait, want time.Duration }{
		{30 * time.Second, 10 * time.Second},
		{300 * time.Millisecond, 100 * time.Millisecond},
		{60 * time.Millisecond, 100 * time.Millisecond},
	} {
		if got := inprogress.Period(tc.ackWait); got != tc.want {
			t.Errorf("Period(%s) = %s, want %s", tc.ackWait, got, tc.want)
		}
	}
}
