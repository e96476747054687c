package dispatcher

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// Retention of finished work (docs/storage.md, "Retention"). When a
// thread ends — a dispatch ends finished, failed or cancelled: nothing
// re-dispatches after those — the projection writes the thread's index,
// every dispatch record of it and its closed question records again with a
// per-message TTL of Config.Retention, and deletes its partial-state
// objects, which only a round about to start needs. JetStream then removes
// the records itself. A record is written without a TTL until then, so
// nothing that waits or runs expires, however old.

// endsThread reports whether a dispatch ending with k ends its thread.
func endsThread(k lifecycle.Kind) bool {
	return k == lifecycle.KindFinished || k == lifecycle.KindFailed || k == lifecycle.KindCancelled
}

// expireThread sets the TTL of everything the ended thread left. Every
// step is idempotent: a redelivery of the ending event repeats none. ended
// is the record of the dispatch whose event ended the thread, as the
// projection knows it: it asked nothing (it ended finished, failed or
// cancelled), so it has no question and no partial state to see to, only
// its record, which the projection may have created set to expire.
func (s *Service) expireThread(ctx context.Context, b *bindings, threadID string, ended record, log *slog.Logger) error {
	expires := time.Now().Add(s.cfg.Retention).UTC().Truncate(time.Second)
	if ended.ExpiresAt == nil {
		if err := s.expireRecord(ctx, b, ended.DispatchID, expires); err != nil {
			return err
		}
	}
	idx, err := b.store.expireIndex(ctx, threadID, expires)
	if errors.Is(err, errNoRecord) {
		return nil // a thread of one round has no index (store.enter): the ended record is all of it
	}
	if err != nil {
		return err
	}
	for _, t := range idx.Dispatches {
		if t.DispatchID == ended.DispatchID {
			continue
		}
		if err := s.expireRecord(ctx, b, t.DispatchID, expires); err != nil {
			return err
		}
		// Every round but the last paused on a question. Its record may not
		// show that yet (the projection applies the events of different
		// dispatches in parallel), so the question is looked up whatever
		// the record says; a round that asked nothing has none.
		if err := b.store.expireQuestion(ctx, lifecycle.QuestionID(t.DispatchID), expires); err != nil {
			return err
		}
		// The round this question paused is over and the thread too: its
		// state, if it was kept as an object, is needed no more.
		if err := b.deleteState(ctx, t.DispatchID); err != nil {
			return fmt.Errorf("dispatcher: delete partial state %s: %w", t.DispatchID, err)
		}
	}
	log.Debug("thread ended: its records expire", "thread_id", threadID, "expires_at", expires, "dispatches", len(idx.Dispatches))
	return nil
}

// deleteState deletes partial-state object name, and then the marker the
// object store leaves in its place (its meta message, Deleted set), which
// would otherwise stay for good: one per large partial state ever kept.
// Once the marker is gone the object reads as not found, as it did with
// it, and a repeat finds nothing to do.
func (b *bindings) deleteState(ctx context.Context, name string) error {
	err := b.state.Delete(ctx, name)
	switch {
	case errors.Is(err, jetstream.ErrObjectNotFound):
		return nil
	case err != nil:
		return err
	}
	meta := "$O." + lifecycle.BucketState + ".M." + base64.URLEncoding.EncodeToString([]byte(name))
	return b.stateLog.Purge(ctx, jetstream.WithPurgeSubject(meta))
}

// objectStream names the stream of object store bucket.
func objectStream(bucket string) string { return "OBJ_" + bucket }

// expireRecord writes a record again with its TTL, once; a record that is
// gone already is left so.
func (s *Service) expireRecord(ctx context.Context, b *bindings, id string, expires time.Time) error {
	_, err := b.store.update(ctx, id, func(r *record) bool {
		if r.ExpiresAt != nil {
			return false
		}
		r.ExpiresAt = &expires
		return true
	})
	if err != nil && !errors.Is(err, errNoRecord) {
		return err
	}
	if err == nil {
		s.metrics.projectionWrites.Inc()
	}
	return nil
}

// gone is the problem of a dispatch or thread that is not (or no longer)
// recorded: finished work is kept for the retention only.
func (s *Service) gone(what, id string) *client.Problem {
	p := notFound(what, id)
	p.Detail += fmt.Sprintf(" (finished work is kept for %s after its thread ends: AGORA_RETENTION)", s.cfg.Retention)
	return p
}
