package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/logging"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// The reconciler (docs/design.md §2). An acceptance interrupted
// between the record's creation and the queue publish (a dispatcher killed,
// a stream electing its leader) leaves a record `queued: false` that no
// retry may ever come for. Every dispatcher, at start and then every
// ReconcileGrace, reads the records written since its last pass from the
// bucket's own stream (not every key: the scan is bounded by what changed)
// and completes each one older than the grace period with the same
// idempotent steps a retry takes: the work message's Nats-Msg-Id is the
// dispatch id and the record's queued flag is set by compare-and-set, so
// several replicas reconciling at once queue it once.

// reconcileLoop runs passes until ctx ends.
func (s *Service) reconcileLoop(ctx context.Context, b *bindings) {
	grace := s.cfg.ReconcileGrace
	since := time.Now().Add(-s.cfg.ReconcileLookback)
	for {
		passStart := time.Now()
		if err := s.reconcile(ctx, b, since, grace); err != nil && ctx.Err() == nil {
			s.log.Warn("reconcile pass failed; the next one retries", "err", err)
		} else if err == nil {
			// The next pass overlaps this one by the grace period, so a
			// record too young now is seen again.
			since = passStart.Add(-2 * grace)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(grace):
		}
	}
}

// reconcile completes the unqueued records written since `since` that are
// older than grace.
func (s *Service) reconcile(ctx context.Context, b *bindings, since time.Time, grace time.Duration) error {
	stream := "KV_" + lifecycle.BucketDispatches
	prefix := "$KV." + lifecycle.BucketDispatches + "."
	// One consumer for the whole pass, fetched from until nothing is
	// pending. No subject filter: the bucket's stream holds only its
	// keys, and nats-server counts a filtered consumer's pending messages
	// over every key when it creates it (127 ms at 200,000 keys, against
	// under 1 ms unfiltered). Not an ordered consumer either: its Fetch
	// makes a new consumer for every batch, each counting again — at
	// 30,000 paused threads, a pass after a busy minute took over a second
	// of the server's CPU.
	cons, err := b.js.CreateConsumer(ctx, stream, jetstream.ConsumerConfig{
		DeliverPolicy:     jetstream.DeliverByStartTimePolicy,
		OptStartTime:      &since,
		AckPolicy:         jetstream.AckNonePolicy,
		MemoryStorage:     true,
		InactiveThreshold: time.Minute, // gone on its own if this pass dies
	})
	if err != nil {
		return err
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = b.js.DeleteConsumer(dctx, stream, cons.CachedInfo().Name)
	}()
	candidates := map[string]bool{}
	for pending := cons.CachedInfo().NumPending; pending > 0; {
		batch, err := cons.Fetch(256, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return err
		}
		n := 0
		for m := range batch.Messages() {
			n++
			key := strings.TrimPrefix(m.Subject(), prefix)
			if md, err := m.Metadata(); err == nil {
				pending = md.NumPending
			}
			if strings.HasPrefix(key, "thread.") {
				continue
			}
			// Only what decides: a record is decoded into these fields
			// alone.
			var rec struct {
				DispatchID string         `json:"dispatch_id"`
				Status     lifecycle.Kind `json:"status"`
				Queued     bool           `json:"queued"`
			}
			if json.Unmarshal(m.Data(), &rec) == nil && rec.DispatchID == key {
				candidates[key] = !rec.Queued && !rec.Status.Terminal()
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) && !errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		if n == 0 {
			break
		}
	}
	for id, unqueued := range candidates {
		if !unqueued {
			continue
		}
		rec, _, err := s.record(ctx, b, id)
		if err != nil {
			if errors.Is(err, errNoRecord) {
				continue
			}
			return err
		}
		if rec.Queued || rec.Terminal() || time.Since(rec.CreatedAt) < grace {
			continue
		}
		log := s.log.With("dispatch_id", id, "thread_id", rec.ThreadID).With(logging.Trace(rec.Traceparent)...)
		if _, err := s.finish(ctx, b, rec, 0); err != nil {
			log.Warn("reconcile: cannot complete an interrupted acceptance yet", "err", err)
			continue
		}
		s.metrics.reconciled.Inc()
		log.Warn("reconciled an interrupted acceptance: queued", "age", time.Since(rec.CreatedAt).Round(time.Millisecond))
	}
	return nil
}
