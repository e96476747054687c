// Package kvwatch keeps an in-memory view of a KV bucket current from a
// watch: the router's index of questions, the dispatcher's copy of the
// sub-agent definitions, the inbox's questions and sessions and the Slack
// answerer's messages use it.
package kvwatch

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrClosed is Run's error when the watch's updates stopped while ctx was
// still live (the connection closed, the bucket was deleted).
var ErrClosed = errors.New("the watch stopped")

// Run watches kv (every key, with opts) and calls apply with each entry —
// puts, deletes and purges, in the bucket's order — and loaded, when not
// nil, once the entries stored when the watch started have been applied.
// It blocks until ctx ends (nil) or the watch breaks (an error, ErrClosed
// when its updates stopped).
func Run(ctx context.Context, kv jetstream.KeyValue, apply func(jetstream.KeyValueEntry), loaded func(), opts ...jetstream.WatchOpt) error {
	w, err := kv.WatchAll(ctx, opts...)
	if err != nil {
		return fmt.Errorf("watch %s: %w", kv.Bucket(), err)
	}
	return follow(ctx, kv, w, apply, loaded)
}

// Start runs the watch of Run on a goroutine of its own until ctx ends or
// the watch does. It returns once the entries stored when it started have
// been applied; done is closed when the watch has stopped and apply will
// not be called again.
func Start(ctx context.Context, kv jetstream.KeyValue, apply func(jetstream.KeyValueEntry)) (done <-chan struct{}, err error) {
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return nil, fmt.Errorf("watch %s: %w", kv.Bucket(), err)
	}
	initial := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		_ = follow(ctx, kv, w, apply, func() { close(initial) })
	}()
	select {
	case <-initial:
		return stopped, nil
	case <-stopped:
		return nil, fmt.Errorf("watch %s ended before the stored entries were read", kv.Bucket())
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// follow applies w's updates until ctx ends or they stop, and stops w.
func follow(ctx context.Context, kv jetstream.KeyValue, w jetstream.KeyWatcher, apply func(jetstream.KeyValueEntry), loaded func()) error {
	defer func() { _ = w.Stop() }()
	initial := true
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			switch {
			case !ok:
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("%w: %s", ErrClosed, kv.Bucket())
			case e != nil:
				apply(e)
			case initial: // nil marks the end of the stored entries
				initial = false
				if loaded != nil {
					loaded()
				}
			}
		}
	}
}
