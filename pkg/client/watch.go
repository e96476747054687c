package client

import (
	"context"
	"fmt"
	"iter"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// Filter selects lifecycle events for Watch. Empty fields match anything.
type Filter struct {
	Kind       lifecycle.Kind
	ThreadID   string
	DispatchID string
	// FromStart replays every retained event first (the lifecycle stream
	// keeps 7 days by default); otherwise Watch starts with new events.
	FromStart bool
	// AfterSeq resumes after the event with this stream sequence (an
	// Item.Seq seen before). It takes precedence over FromStart.
	AfterSeq uint64
	// Progress makes Watch yield the progress reports of the matching
	// runs too (docs/progress.md): items with Progress set and Data nil,
	// from AGORA_PROGRESS, merged as they arrive. Their Seq is that
	// stream's, so AfterSeq does not apply to them (they start from new,
	// or from the reports kept with FromStart). A Kind filter leaves them
	// out.
	Progress bool
}

// Subject returns the lifecycle subject filter f selects.
func (f Filter) Subject() string {
	return lifecycle.LifecycleFilter(f.Kind, f.ThreadID, f.DispatchID)
}

func (f Filter) validate() error {
	if f.Kind != "" && !f.Kind.Valid() {
		return fmt.Errorf("client: filter: %q is not a lifecycle kind", f.Kind)
	}
	if f.ThreadID != "" {
		if err := lifecycle.ValidToken(f.ThreadID); err != nil {
			return fmt.Errorf("client: filter: thread id: %w", err)
		}
	}
	if f.DispatchID != "" {
		if err := lifecycle.ValidToken(f.DispatchID); err != nil {
			return fmt.Errorf("client: filter: dispatch id: %w", err)
		}
	}
	return nil
}

// Watch iterates over lifecycle events matching f, in stream order, through
// an ordered consumer on AGORA_LIFECYCLE (nothing durable is left on the
// server). The sequence ends when the loop stops or ctx ends; it then yields
// ctx's error once. Events of unknown types or with undecodable data are
// skipped, as the wire contract asks of every consumer. Any other error is
// yielded once and ends the sequence.
func (c *Client) Watch(ctx context.Context, f Filter) iter.Seq2[Item, error] {
	if f.Progress && f.Kind == "" {
		return c.watchWithProgress(ctx, f)
	}
	return func(yield func(Item, error) bool) {
		if err := f.validate(); err != nil {
			yield(Item{}, err)
			return
		}
		err := c.follow(ctx, lifecycle.StreamLifecycle, f.consumer(f.Subject()), "watch "+f.Subject(), func(m jetstream.Msg) bool {
			it, ok := item(m)
			return !ok || yield(it, nil)
		})
		if err != nil {
			yield(Item{}, err)
		}
	}
}

// consumer is the ordered consumer of subject that starts where f says:
// after AfterSeq, else at the first message kept with FromStart, else at
// new messages.
func (f Filter) consumer(subject string) jetstream.OrderedConsumerConfig {
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}, DeliverPolicy: jetstream.DeliverNewPolicy}
	switch {
	case f.AfterSeq > 0:
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, f.AfterSeq+1
	case f.FromStart:
		cfg.DeliverPolicy = jetstream.DeliverAllPolicy
	}
	return cfg
}

// item decodes a lifecycle message; ok is false for anything to skip.
func item(m jetstream.Msg) (Item, bool) {
	seq, e, d, ok := decode(m)
	if !ok {
		return Item{}, false
	}
	l, ok := d.(lifecycle.Lifecycle)
	if !ok {
		return Item{}, false
	}
	return Item{Seq: seq, Event: e, Data: l}, true
}

// watchWithProgress merges Watch's lifecycle events with WatchProgress's
// reports, each source in its own stream order.
func (c *Client) watchWithProgress(ctx context.Context, f Filter) iter.Seq2[Item, error] {
	return func(yield func(Item, error) bool) {
		ctx, cancel := context.WithCancel(ctx)
		type next struct {
			it  Item
			err error
		}
		ch := make(chan next)
		var wg sync.WaitGroup
		defer wg.Wait() // after cancel
		defer cancel()
		send := func(n next) bool {
			select {
			case ch <- n:
				return true
			case <-ctx.Done():
				return false
			}
		}
		lf := f
		lf.Progress = false
		wg.Go(func() {
			for it, err := range c.Watch(ctx, lf) {
				if !send(next{it, err}) || err != nil {
					return
				}
			}
		})
		pf := f
		pf.AfterSeq = 0
		wg.Go(func() {
			for p, err := range c.WatchProgress(ctx, pf) {
				if err != nil {
					if ctx.Err() == nil {
						send(next{err: err})
					}
					return
				}
				if !send(next{it: Item{Seq: p.Seq, Event: p.Event, Progress: p.Progress}}) {
					return
				}
			}
		})
		for {
			select {
			case n := <-ch:
				if !yield(n.it, n.err) || n.err != nil {
					return
				}
			case <-ctx.Done():
				yield(Item{}, ctx.Err())
				return
			}
		}
	}
}
