// Package kvwatch keeps an in-memory view of a KV bucket current from a
// watch: the router's index of questions and the dispatcher's copy of the
// sub-agent definitions use it.
package kvwatch

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// Start watches every key of kv and calls apply with each entry — puts,
// deletes and purges, in the bucket's order — until ctx ends or the watch
// does. It returns once the entries stored when it started have been
// applied; done is closed when the watch has stopped and apply will not be
// called again.
func Start(ctx context.Context, kv jetstream.KeyValue, apply func(jetstream.KeyValueEntry)) (done <-chan struct{}, err error) {
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return nil, fmt.Errorf("watch %s: %w", kv.Bucket(), err)
	}
	initial := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		defer func() { _ = w.Stop() }()
		first := true
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-w.Updates():
				switch {
				case !ok:
					return
				case e != nil:
					apply(e)
				case first: // nil marks the end of the stored entries
					first = false
					close(initial)
				}
			}
		}
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
