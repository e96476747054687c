package consume

import (
	"sync"
	"time"
)

// Progresser is the part of a jetstream.Msg that KeepAlive uses.
type Progresser interface{ InProgress() error }

// KeepAliveEvery is how often to tell the server that a message of a
// consumer with the given AckWait is still being worked on: a third of
// the AckWait, so two lost in-progress acks still leave time, and never
// more often than every 100ms.
func KeepAliveEvery(ackWait time.Duration) time.Duration {
	return max(ackWait/3, 100*time.Millisecond)
}

// KeepAlive tells the server every period that m is still being worked
// on (jetstream.Msg.InProgress), which restarts the consumer's AckWait, so
// a slow handler's message is not delivered again meanwhile. It runs
// until the returned stop is called; stop returns once the sender has
// exited and may be called once. onErr, when not nil, hears each
// in-progress ack that failed, on the sender's goroutine.
func KeepAlive(m Progresser, period time.Duration, onErr func(error)) (stop func()) {
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
