package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// follow hands each message of stream that cfg selects to each, in stream
// order, through an ordered consumer (nothing durable is left on the
// server), until each returns false (follow returns nil) or ctx ends
// (ctx's error). Any other error is wrapped with what.
func (c *Client) follow(ctx context.Context, stream string, cfg jetstream.OrderedConsumerConfig, what string, each func(jetstream.Msg) bool) error {
	cons, err := c.js.OrderedConsumer(ctx, stream, shortLived(cfg))
	if err != nil {
		return fmt.Errorf("client: %s: %w", what, err)
	}
	msgs, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("client: %s: %w", what, err)
	}
	defer msgs.Stop()
	for {
		m, err := msgs.Next(jetstream.NextContext(ctx))
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("client: %s: %w", what, err)
		}
		if !each(m) {
			return nil
		}
	}
}

// readKept hands each message of stream that cfg selects to each, in
// stream order, and returns once the stream has none left to give or each
// returns false. It never waits for new messages.
func (c *Client) readKept(ctx context.Context, stream string, cfg jetstream.OrderedConsumerConfig, what string, each func(jetstream.Msg) bool) error {
	cons, err := c.js.OrderedConsumer(ctx, stream, shortLived(cfg))
	if err != nil {
		return fmt.Errorf("client: %s: %w", what, err)
	}
	for {
		batch, err := cons.FetchNoWait(64)
		if err != nil {
			return fmt.Errorf("client: %s: %w", what, err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			if !each(m) {
				return nil
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			return fmt.Errorf("client: %s: %w", what, err)
		}
		if n == 0 {
			return nil
		}
	}
}

// orderedInactive is how long the server keeps an ordered consumer nobody
// pulls from (nats.go's default is 5 minutes). A follow pulls all along,
// so only the consumers of follows that ended wait it out; nats-server
// allows 1,000 consumers per stream by default, which the follows of a
// few hundred threads a minute would otherwise fill.
var orderedInactive = 30 * time.Second

// shortLived is cfg with orderedInactive, unless it sets its own.
func shortLived(cfg jetstream.OrderedConsumerConfig) jetstream.OrderedConsumerConfig {
	if cfg.InactiveThreshold == 0 {
		cfg.InactiveThreshold = orderedInactive
	}
	return cfg
}

// decode reads a message's stream sequence, event and data; ok is false
// for anything to skip: events of unknown types and undecodable data alike,
// as the wire contract asks of every consumer.
func decode(m jetstream.Msg) (seq uint64, e lifecycle.Event, d lifecycle.Data, ok bool) {
	md, err := m.Metadata()
	if err != nil {
		return 0, e, nil, false
	}
	if e, err = lifecycle.DecodeMsg(m); err != nil {
		return 0, e, nil, false
	}
	if d, err = lifecycle.Parse(e); err != nil {
		return 0, e, nil, false
	}
	return md.Sequence.Stream, e, d, true
}
