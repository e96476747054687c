package dispatcher

import (
	"context"
	"errors"
	"time"

	"github.com/agora-dispatch/agora/internal/logging"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// The reconciler (docs/storage.md, "The dispatch record and the reconciler").
// An acceptance interrupted between the record's creation and the queue
// publish (a dispatcher killed, a stream electing its leader) leaves a record
// whose dispatch never starts, that no retry may ever come for. Every
// dispatcher, at start and then every ReconcileGrace, reads the records
// written since its last pass from the bucket's own stream (not every key:
// the scan is bounded by what changed) and completes each one older than the
// grace period whose chain has not gone past `accepted`, with the same
// idempotent steps a retry takes: the work message's Nats-Msg-Id is the
// dispatch id, so work queued already — by the acceptance, or by another
// replica reconciling at once — is a duplicate, and past the duplicate window
// finish looks for it on the work stream first (queuedAlready).

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
			s.metrics.reconcilePasses.Inc()
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(grace):
		}
	}
}

// reconcile completes the acceptances written since `since`, older than
// grace, whose dispatch has not started.
func (s *Service) reconcile(ctx context.Context, b *bindings, since time.Time, grace time.Duration) error {
	// Records too young are left to a later pass without reading their
	// chains.
	ids, err := b.store.unstarted(ctx, since, time.Now().Add(-grace))
	if err != nil {
		return err
	}
	for _, id := range ids {
		rec, _, err := b.store.view(ctx, id)
		if err != nil {
			if errors.Is(err, errNoRecord) {
				continue
			}
			return err
		}
		if rec.Status != lifecycle.KindAccepted {
			continue // started or ended: it was queued
		}
		log := s.log.With("dispatch_id", id, "thread_id", rec.ThreadID).With(logging.Trace(rec.Traceparent)...)
		_, stored, err := s.finish(ctx, b, rec, 0)
		if err != nil {
			log.Warn("reconcile: cannot complete an interrupted acceptance yet", "err", err)
			continue
		}
		if !stored {
			continue // queued already, waiting for a worker
		}
		s.metrics.reconciled.Inc()
		log.Warn("reconciled an interrupted acceptance: queued", "age", time.Since(rec.CreatedAt).Round(time.Millisecond))
	}
	return nil
}
