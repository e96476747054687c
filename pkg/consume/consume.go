// Package consume pulls messages from a JetStream consumer, hands each to
// a handler, and settles it by the verdict the handler returns: ack, nak
// with a delay, or term (docs/storage.md, "Consuming a stream").
//
// [Run] is the loop: each of its slots pulls one message at a time
// (nats.go buffers hundreds of messages otherwise, and their AckWait runs
// while they wait), calls the [Handler], keeps the message from being
// delivered again while the handler works on it ([KeepAlive]), and
// applies the handler's [Verdict] ([Settle]). A pull that fails is retried
// with backoff. When the context given to Run ends, Run stops pulling,
// lets the handlers in flight finish for up to a shutdown timeout, then
// cancels their context and waits for them to return.
//
// Agora's services and answerers settle every message through this
// package, and its worker and answerers pull through Run. It imports
// nothing of Agora and may be used on any JetStream consumer with explicit
// acks.
package consume

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Handler handles one message and returns its verdict, which Run applies
// after Handler returns. ctx outlives the context given to Run by the
// shutdown timeout (see Options.ShutdownTimeout). With Options.Slots above
// one, Handler is called concurrently.
type Handler func(ctx context.Context, m jetstream.Msg) Verdict

// Options configure Run. The zero value of each field means its default.
type Options struct {
	// Slots is how many messages are handled at once; each slot pulls one
	// message at a time. Default 1.
	Slots int
	// PullExpiry is how long one pull request waits for a message before
	// it is made again. Default 5s.
	PullExpiry time.Duration
	// FinishPulls makes a stop wait for the pulls in progress to end (at
	// most PullExpiry) and hand back at once what they bring, instead of
	// cutting them short. A message the server sent to a pull that was
	// cut short is delivered again only when the consumer's AckWait has
	// passed, so set it where that wait matters more than a quick stop.
	FinishPulls bool
	// KeepAlive is how often a message is reported in progress while its
	// handler runs. Zero: KeepAliveEvery of the consumer's AckWait (from
	// its cached info); negative: never (the handler keeps its message
	// alive itself).
	KeepAlive time.Duration
	// ShutdownTimeout is how long handlers in flight when the context of
	// Run ends may go on before their context is cancelled. Zero: 30s;
	// negative: they are cancelled at once.
	ShutdownTimeout time.Duration
	// Logger hears failed pulls and settles and a passed shutdown timeout.
	// Default slog.Default().
	Logger *slog.Logger
}

// settleTimeout bounds the wait for a DoubleAck's confirmation.
const settleTimeout = 10 * time.Second

// Run consumes c with h until ctx ends; it blocks until every handler has
// returned and its message has been settled. When ctx ends, Run stops
// pulling (a message pulled at that moment is handed back at once with a
// Nak), lets the handlers in flight finish for up to
// Options.ShutdownTimeout, then cancels their context and waits for them.
// Run returns nil after such a stop, or an error when c or h is nil. The
// consumer stays the caller's: Run neither creates nor deletes it.
func Run(ctx context.Context, c jetstream.Consumer, h Handler, o Options) error {
	if c == nil || h == nil {
		return errors.New("consume: nil consumer or handler")
	}
	o.Slots = max(o.Slots, 1)
	if o.PullExpiry <= 0 {
		o.PullExpiry = 5 * time.Second
	}
	if o.KeepAlive == 0 {
		if info := c.CachedInfo(); info != nil && info.Config.AckWait > 0 {
			o.KeepAlive = KeepAliveEvery(info.Config.AckWait)
		} else {
			o.KeepAlive = KeepAliveEvery(30 * time.Second) // the server's default AckWait
		}
	}
	if o.ShutdownTimeout == 0 {
		o.ShutdownTimeout = 30 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	r := &runner{c: c, h: h, o: o}

	// work outlives ctx by the shutdown timeout so handlers can finish.
	work, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	var wg sync.WaitGroup
	for n := range o.Slots {
		wg.Go(func() { r.slot(ctx, work, n) })
	}
	<-ctx.Done()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	if o.ShutdownTimeout < 0 {
		cancel()
		<-done
		return nil
	}
	t := time.NewTimer(o.ShutdownTimeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		o.Logger.Warn("shutdown timeout passed: cancelling in-flight handlers", "shutdown_timeout", o.ShutdownTimeout.String())
		cancel()
		<-done
	}
	return nil
}

type runner struct {
	c jetstream.Consumer
	h Handler
	o Options
}

// slot pulls and handles one message at a time until ctx ends.
func (r *runner) slot(ctx, work context.Context, n int) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		m, err := r.next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if errors.Is(err, nats.ErrTimeout) || errors.Is(err, jetstream.ErrNoHeartbeat) || errors.Is(err, context.DeadlineExceeded) {
				continue // nothing to pull: pull again
			}
			r.o.Logger.Warn("pull failed; retrying", "slot", n, "err", err, "retry_in", backoff)
			t := time.NewTimer(backoff)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			backoff = min(2*backoff, 5*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
		if ctx.Err() != nil {
			_ = m.Nak() // pulled while stopping: hand it straight back
			return
		}
		r.handle(work, m)
	}
}

// next pulls one message, cut short when ctx ends unless FinishPulls.
func (r *runner) next(ctx context.Context) (jetstream.Msg, error) {
	if r.o.FinishPulls {
		return r.c.Next(jetstream.FetchMaxWait(r.o.PullExpiry))
	}
	pctx, cancel := context.WithTimeout(ctx, r.o.PullExpiry)
	defer cancel()
	return r.c.Next(jetstream.FetchContext(pctx))
}

// handle calls the handler with the message kept alive, then settles it.
func (r *runner) handle(ctx context.Context, m jetstream.Msg) {
	stop := func() {}
	if r.o.KeepAlive > 0 {
		stop = KeepAlive(m, r.o.KeepAlive, nil)
	}
	v := func() Verdict { defer stop(); return r.h(ctx, m) }()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	if err := Settle(sctx, m, v); err != nil {
		r.o.Logger.Warn("settle message", "subject", m.Subject(), "verdict", v.String(), "err", err)
	}
}
