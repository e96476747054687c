package consume_test

import (
	"context"
	"encoding/json"
	"log"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/pkg/consume"
)

// Run handles the messages of a durable pull consumer, four at a time,
// until the program is told to stop; each handler only says what becomes
// of its message.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Drain()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	c, err := js.CreateOrUpdateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{
		Durable: "billing", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second,
	})
	if err != nil {
		log.Fatal(err)
	}
	err = consume.Run(ctx, c, func(ctx context.Context, m jetstream.Msg) consume.Verdict {
		var order struct{ ID string }
		if err := json.Unmarshal(m.Data(), &order); err != nil {
			return consume.Term("not an order") // never redelivered
		}
		if err := bill(ctx, order.ID); err != nil {
			return consume.Nak(5 * time.Second) // try again in 5s
		}
		return consume.Ack()
	}, consume.Options{Slots: 4, ShutdownTimeout: 20 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
}

func bill(context.Context, string) error { return nil }
