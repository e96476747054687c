package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/retention"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// Retention of finished work (docs/design.md §2, "Retention"). When a
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

// write updates a record of agora_dispatches over rev: with a TTL when the
// record is set to expire, so a late write (a redelivered event) keeps it
// expiring.
func (s *Service) write(ctx context.Context, b *bindings, key string, data []byte, rev uint64, expires *time.Time) (uint64, error) {
	if expires == nil {
		return b.dispatches.Update(ctx, key, data, rev)
	}
	n, err := retention.Update(ctx, b.js, lifecycle.BucketDispatches, key, data, rev, *expires)
	if errors.Is(err, retention.ErrConflict) {
		return 0, jetstream.ErrKeyExists
	}
	return n, err
}

// expireThread sets the TTL of everything the ended thread left. Every
// step is idempotent: a redelivery of the ending event repeats none. ended
// is the dispatch whose event ended the thread: its record got its TTL
// with that event, and it asked nothing (it ended finished, failed or
// cancelled), so it has no question and no partial state to see to.
func (s *Service) expireThread(ctx context.Context, b *bindings, threadID, ended string, log *slog.Logger) error {
	expires := time.Now().Add(s.cfg.Retention).UTC().Truncate(time.Second)
	idx, err := s.expireIndex(ctx, b, threadID, expires)
	if errors.Is(err, errNoRecord) {
		return nil // a refused request's thread: only its own record, which has no index
	}
	if err != nil {
		return err
	}
	for _, t := range idx.Dispatches {
		if t.DispatchID == ended {
			continue
		}
		_, err := s.update(ctx, b, t.DispatchID, func(r *client.Record) bool {
			if r.ExpiresAt != nil {
				return false
			}
			r.ExpiresAt = &expires
			return true
		})
		if err != nil && !errors.Is(err, errNoRecord) {
			return err
		}
		// Every round but the last paused on a question. Its record may not
		// show that yet (the projection applies the events of different
		// dispatches in parallel), so the question is looked up whatever
		// the record says; a round that asked nothing has none.
		if err := s.expireQuestion(ctx, b, lifecycle.QuestionID(t.DispatchID), expires); err != nil {
			return err
		}
		// The round this question paused is over and the thread too: its
		// state, if it was kept as an object, is needed no more.
		if err := b.state.Delete(ctx, t.DispatchID); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
			return fmt.Errorf("dispatcher: delete partial state %s: %w", t.DispatchID, err)
		}
	}
	log.Debug("thread ended: its records expire", "thread_id", threadID, "expires_at", expires, "dispatches", len(idx.Dispatches))
	return nil
}

// expireIndex writes the thread index again with its TTL.
func (s *Service) expireIndex(ctx context.Context, b *bindings, threadID string, expires time.Time) (threadIndex, error) {
	key := threadKey(threadID)
	for range maxCAS {
		e, err := b.dispatches.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return threadIndex{}, fmt.Errorf("%w: thread %s", errNoRecord, threadID)
		}
		if err != nil {
			return threadIndex{}, fmt.Errorf("dispatcher: read thread index %s: %w", threadID, err)
		}
		var idx threadIndex
		if err := json.Unmarshal(e.Value(), &idx); err != nil {
			return threadIndex{}, fmt.Errorf("dispatcher: decode thread index %s: %w", threadID, err)
		}
		if idx.ExpiresAt != nil {
			return idx, nil
		}
		idx.ExpiresAt = &expires
		data, _ := json.Marshal(idx)
		if _, err := s.write(ctx, b, key, data, e.Revision(), &expires); err == nil {
			return idx, nil
		} else if !conflict(err) {
			return threadIndex{}, fmt.Errorf("dispatcher: write thread index %s: %w", threadID, err)
		}
	}
	return threadIndex{}, fmt.Errorf("dispatcher: thread index %s: %d conflicting writers", threadID, maxCAS)
}

// expireQuestion writes a closed question record again with its TTL and
// expires_at, which the router keeps on its own later writes. A question
// still asked is left alone: nothing that waits expires.
func (s *Service) expireQuestion(ctx context.Context, b *bindings, qid string, expires time.Time) error {
	for range maxCAS {
		e, err := b.questions.Get(ctx, qid)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("dispatcher: read question %s: %w", qid, err)
		}
		var q map[string]json.RawMessage
		if err := json.Unmarshal(e.Value(), &q); err != nil {
			return nil // not a record the router wrote: left alone
		}
		var status string
		_ = json.Unmarshal(q["status"], &status)
		if status == "asked" || string(q["expires_at"]) != "" {
			return nil
		}
		q["expires_at"], _ = json.Marshal(expires)
		data, err := json.Marshal(q)
		if err != nil {
			return fmt.Errorf("dispatcher: encode question %s: %w", qid, err)
		}
		_, err = retention.Update(ctx, b.js, lifecycle.BucketQuestions, qid, data, e.Revision(), expires)
		if err == nil {
			return nil
		}
		if !errors.Is(err, retention.ErrConflict) {
			return fmt.Errorf("dispatcher: write question %s: %w", qid, err)
		}
	}
	return fmt.Errorf("dispatcher: question %s: %d conflicting writers", qid, maxCAS)
}

// gone is the problem of a dispatch or thread that is not (or no longer)
// recorded: finished work is kept for the retention only.
func (s *Service) gone(what, id string) *client.Problem {
	p := notFound(what, id)
	p.Detail += fmt.Sprintf(" (finished work is kept for %s after its thread ends: AGORA_RETENTION)", s.cfg.Retention)
	return p
}
