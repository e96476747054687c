package consume_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/pkg/consume"
)

// A delivery worked on for several AckWaits is not redelivered while
// KeepAlive holds it, and is redelivered once stop ends the news.
func TestKeepAliveHoldsTheDelivery(t *testing.T) {
	_, c := setup(t, "x")
	m, err := c.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var failed int
	stop := consume.KeepAlive(m, consume.KeepAliveEvery(ackWait), func(error) { failed++ })
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
