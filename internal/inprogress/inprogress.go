// Package inprogress keeps a JetStream delivery from being redelivered
// while it is still being worked on (docs/design.md §2: AckWait bounds
// how long a delivery may go without news).
package inprogress

import (
	"sync"
	"time"
)

// Message is the part of a jetstream.Msg this package uses.
type Message interface{ InProgress() error }

// Period is how often to send news for a consumer with the given AckWait:
// a third of it, so two lost acks still leave time, and never faster than
// every 100ms.
func Period(ackWait time.Duration) time.Duration {
	return max(ackWait/3, 100*time.Millisecond)
}

// Start tells the server every period that m is still being worked on,
// until the returned stop is called; stop returns once the sender has
// exited. onErr, when not nil, hears each in-progress ack that failed.
func Start(m Message, period time.Duration, onErr func(error)) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if err := m.InProgress(); err != nil && onErr != nil {
					onErr(err)
				}
			}
		}
	})
	return func() { close(done); wg.Wait() }
}
