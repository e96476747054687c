package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/agora-dispatch/agora/internal/chain"
	"github.com/agora-dispatch/agora/internal/problem"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// defaultCanceller names who cancelled when the caller gives no name.
const defaultCanceller = "api"

func notFound(what, id string) *client.Problem {
	return &client.Problem{Type: client.ProblemNotFound, Title: "Not found", Status: http.StatusNotFound,
		Detail: fmt.Sprintf("no %s %q", what, short(id))}
}

// cancelDispatch cancels one dispatch, idempotently. A terminal dispatch
// is returned unchanged, except that the latest round of a thread paused on
// a question ends the thread (cancelPausedThread). Otherwise the dispatcher
// publishes the dispatch's one terminal event, cancelled, and then tells a
// worker running it to stop: a queued dispatch is skipped by the worker
// that pulls it, a running one is killed.
//
// The status is read from the chain (store.view), so the cancelled event
// is published only when the chain has no terminal event — none is
// published after one older than the duplicate window — and the chain is
// read again when the publish is a duplicate: the terminal event stored
// first counts. When that event is needs_input, the dispatch is paused on a
// question and the thread is ended through the router.
func (s *Service) cancelDispatch(ctx context.Context, b *bindings, id, by, reason string) (client.Record, error) {
	if !idRE.MatchString(id) {
		return client.Record{}, problem.Invalid(client.FieldError{Field: "dispatch_id", Message: fmt.Sprintf("%q is not a valid dispatch id", short(id))})
	}
	stored, _, err := b.store.view(ctx, id)
	if errors.Is(err, errNoRecord) {
		return client.Record{}, s.gone("dispatch", id)
	}
	if err != nil {
		return client.Record{}, err
	}
	rec := stored.Record
	if by == "" {
		by = defaultCanceller
	}
	if rec.Terminal() {
		if rec.Status == lifecycle.KindNeedsInput {
			return s.cancelPausedThread(ctx, b, rec, by, reason)
		}
		rec.Outcome = client.OutcomeAlreadyEnded
		return rec, nil
	}
	wasRunning := rec.Status == lifecycle.KindStarted
	d := &lifecycle.Cancelled{Common: rec.Common(), By: by, Reason: reason}
	e, pub, err := s.emit(ctx, b, d, rec.Traceparent)
	if err != nil {
		return rec, err
	}
	var l lifecycle.Lifecycle = d
	ours := !pub.Duplicate // the cancelled event is this request's
	if pub.Duplicate {
		// The dispatch has a terminal event already (the worker's, or
		// this cancel's, sent before): that one counts.
		var found bool
		if e, l, found, err = s.terminalEvent(ctx, b, rec); err != nil {
			return rec, err
		}
		if !found {
			rec.Outcome = client.OutcomeAlreadyEnded
			return rec, nil
		}
	}
	if l.LifecycleKind() == lifecycle.KindCancelled {
		if err := s.signalCancel(ctx, rec, by, reason); err != nil {
			return rec, err
		}
	}
	chain.Apply(&rec, event{Event: e, Data: l})
	if l.LifecycleKind() == lifecycle.KindNeedsInput {
		// Paused on a question the record did not show yet.
		return s.cancelPausedThread(ctx, b, rec, by, reason)
	}
	switch {
	case !ours:
		rec.Outcome = client.OutcomeAlreadyEnded
	case wasRunning:
		rec.Outcome = client.OutcomeCancelling
	default:
		rec.Outcome = client.OutcomeCancelled
	}
	s.log.Info("dispatch cancelled", "dispatch_id", rec.DispatchID, "thread_id", rec.ThreadID, "by", by, "status", rec.Status, "outcome", rec.Outcome)
	return rec, nil
}

// signalCancel publishes the core message that stops a worker running the
// dispatch (agora.control.cancel.<dispatch_id>).
func (s *Service) signalCancel(ctx context.Context, rec client.Record, by, reason string) error {
	subj, err := lifecycle.CancelSubject(rec.DispatchID)
	if err != nil {
		return err
	}
	data, _ := json.Marshal(lifecycle.CancelRequest{DispatchID: rec.DispatchID, ThreadID: rec.ThreadID, By: by, Reason: reason})
	if err := s.nc.Publish(subj, data); err != nil {
		return fmt.Errorf("dispatcher: signal cancel %s: %w", rec.DispatchID, err)
	}
	if err := s.nc.FlushWithContext(ctx); err != nil {
		return fmt.Errorf("dispatcher: signal cancel %s: %w", rec.DispatchID, err)
	}
	return nil
}

// cancelPausedThread ends a thread paused on a question, when rec (a
// needs_input dispatch) is the thread's latest round. It is the handshake
// with the router:
//
//  1. It marks rec's record with cancel_requested (client.CancelMark) by
//     compare-and-set; the first mark stands. The router reads the mark
//     whenever it handles an answer, a deadline or a new question of the
//     dispatch, and when it starts, so the cancel survives a router that
//     is down or misses step 2.
//  2. It publishes the mark's lifecycle.CancelRequest on the core subject
//     agora.control.cancel-thread.<thread_id>, so a running router acts at
//     once.
//
// The router then withdraws the question (question.withdrawn) and ends the
// thread with the one event of a new dispatch of the thread: cancelled,
// round + 1, parent = rec, by and reason from the mark. An answer that won
// the race has a re-dispatch instead: a later round, which is cancelled
// here, or when it is accepted (finish reads the mark on its parent).
func (s *Service) cancelPausedThread(ctx context.Context, b *bindings, rec client.Record, by, reason string) (client.Record, error) {
	if !s.latestRound(ctx, b, rec) {
		rec.Outcome = client.OutcomeAlreadyEnded // its thread went on
		return rec, nil
	}
	mark := client.CancelMark{CancelRequest: lifecycle.CancelRequest{DispatchID: rec.DispatchID, ThreadID: rec.ThreadID, By: by, Reason: reason}, At: time.Now().UTC()}
	marked := false
	stored, err := b.store.update(ctx, rec.DispatchID, func(r *record) bool {
		if r.CancelRequested != nil {
			return false // cancelled before: the first mark stands
		}
		m := mark
		r.CancelRequested = &m
		marked = true
		return true
	})
	if err != nil {
		return rec, err
	}
	rec.CancelRequested, rec.UpdatedAt = stored.CancelRequested, stored.UpdatedAt
	rec.Outcome = client.OutcomeThreadCancelling
	if !marked {
		// Its thread's cancel was asked for before: it is sent again
		// (the router's handling is idempotent), but this request
		// changed nothing.
		rec.Outcome = client.OutcomeAlreadyEnded
	}
	subj, err := lifecycle.CancelThreadSubject(rec.ThreadID)
	if err != nil {
		return rec, err
	}
	data, _ := json.Marshal(rec.CancelRequested.CancelRequest)
	if err := s.nc.Publish(subj, data); err != nil {
		return rec, fmt.Errorf("dispatcher: cancel paused thread %s: %w", rec.ThreadID, err)
	}
	if err := s.nc.FlushWithContext(ctx); err != nil {
		return rec, fmt.Errorf("dispatcher: cancel paused thread %s: %w", rec.ThreadID, err)
	}
	s.log.Info("asked the router to end a thread paused on a question", "thread_id", rec.ThreadID, "dispatch_id", rec.DispatchID, "by", rec.CancelRequested.By)

	// A round indexed since the first look is the re-dispatch of an answer
	// that won the race; its acceptance may have read rec before the mark.
	idx, err := s.threadIndex(ctx, b, rec.ThreadID)
	if err != nil {
		return rec, nil
	}
	pos := slices.IndexFunc(idx.Dispatches, func(t threadEntry) bool { return t.DispatchID == rec.DispatchID })
	for _, ent := range idx.Dispatches[pos+1:] {
		if ent.Round <= rec.Round {
			continue
		}
		if _, err := s.cancelDispatch(ctx, b, ent.DispatchID, rec.CancelRequested.By, rec.CancelRequested.Reason); err != nil && !errors.Is(err, client.ErrNotFound) {
			return rec, err
		}
	}
	return rec, nil
}

// latestRound reports whether rec is its thread's latest round; false when
// the thread has no index.
func (s *Service) latestRound(ctx context.Context, b *bindings, rec client.Record) bool {
	idx, err := s.threadIndex(ctx, b, rec.ThreadID)
	if err != nil {
		return false
	}
	n := len(idx.Dispatches)
	return n > 0 && idx.Dispatches[n-1].DispatchID == rec.DispatchID
}

// terminalEvent finds the dispatch's terminal event on the lifecycle
// stream, with one read of its chain: the first one stored, should there
// be more.
func (s *Service) terminalEvent(ctx context.Context, b *bindings, rec client.Record) (lifecycle.Event, lifecycle.Lifecycle, bool, error) {
	links, err := b.store.chain.Last(ctx, rec.ThreadID, rec.DispatchID)
	if err != nil {
		return lifecycle.Event{}, nil, false, err
	}
	t, found := terminal(links)
	return t.Event, t.Data, found, nil
}

// cancelThread cancels every dispatch of a thread that has not ended and,
// when the thread is paused on a question, asks the router to end it.
func (s *Service) cancelThread(ctx context.Context, b *bindings, threadID, by, reason string) (client.Thread, error) {
	idx, err := s.threadIndex(ctx, b, threadID)
	if err != nil {
		return client.Thread{}, err
	}
	outcome := client.OutcomeAlreadyEnded
	rank := map[string]int{client.OutcomeAlreadyEnded: 0, client.OutcomeCancelling: 1, client.OutcomeCancelled: 2, client.OutcomeThreadCancelling: 3}
	for _, ent := range idx.Dispatches {
		rec, err := s.cancelDispatch(ctx, b, ent.DispatchID, by, reason)
		if err != nil && !errors.Is(err, client.ErrNotFound) {
			return client.Thread{}, err
		}
		if err == nil && rank[rec.Outcome] > rank[outcome] {
			outcome = rec.Outcome
		}
	}
	th, err := s.thread(ctx, b, threadID)
	th.Outcome = outcome
	return th, err
}

// threadIndex reads a thread's index; a 404 *client.Problem when there is
// none.
func (s *Service) threadIndex(ctx context.Context, b *bindings, threadID string) (threadIndex, error) {
	if !idRE.MatchString(threadID) {
		return threadIndex{}, problem.Invalid(client.FieldError{Field: "thread_id", Message: fmt.Sprintf("%q is not a valid thread id", short(threadID))})
	}
	idx, err := b.store.thread(ctx, threadID)
	if errors.Is(err, errNoRecord) {
		return threadIndex{}, s.gone("thread", threadID)
	}
	return idx, err
}

// status returns one dispatch's record.
func (s *Service) status(ctx context.Context, b *bindings, id string) (client.Record, error) {
	rec, _, err := s.statusChain(ctx, b, id)
	return rec, err
}

// statusChain is status, and the chain's events its status was read from.
func (s *Service) statusChain(ctx context.Context, b *bindings, id string) (client.Record, []chain.Link, error) {
	if !idRE.MatchString(id) {
		return client.Record{}, nil, problem.Invalid(client.FieldError{Field: "dispatch_id", Message: fmt.Sprintf("%q is not a valid dispatch id", short(id))})
	}
	rec, links, _, err := b.store.viewChain(ctx, id)
	if errors.Is(err, errNoRecord) {
		return client.Record{}, nil, s.gone("dispatch", id)
	}
	return rec.Record, links, err
}

// thread returns every round of a thread with its lifecycle events.
func (s *Service) thread(ctx context.Context, b *bindings, threadID string) (client.Thread, error) {
	idx, err := s.threadIndex(ctx, b, threadID)
	if err != nil {
		return client.Thread{}, err
	}
	events, err := s.threadEvents(ctx, b, threadID)
	if err != nil {
		return client.Thread{}, err
	}
	th := client.Thread{ThreadID: threadID, Rounds: []client.Round{}}
	for _, ent := range idx.Dispatches {
		rec, _, err := b.store.get(ctx, ent.DispatchID)
		if errors.Is(err, errNoRecord) {
			continue
		}
		if err != nil {
			return client.Thread{}, err
		}
		// The round's status comes from its events, read already.
		chain.Apply(&rec.Record, chain.Parse(events[ent.DispatchID])...)
		th.Rounds = append(th.Rounds, client.Round{Record: rec.Record, Events: events[ent.DispatchID]})
	}
	if r := th.Latest(); r != nil {
		th.Status = r.Status
	}
	return th, nil
}

// threadEvents reads a thread's lifecycle events, grouped by dispatch id,
// with a short-lived ordered consumer.
func (s *Service) threadEvents(ctx context.Context, b *bindings, threadID string) (map[string][]lifecycle.Event, error) {
	filter := lifecycle.LifecycleFilter("", threadID, "")
	last, err := b.events.GetLastMsgForSubject(ctx, filter)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("dispatcher: events of thread %s: %w", threadID, err)
	}
	cons, err := b.js.OrderedConsumer(ctx, lifecycle.StreamLifecycle, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{filter}, DeliverPolicy: jetstream.DeliverAllPolicy, InactiveThreshold: orderedInactive,
	})
	if err != nil {
		return nil, fmt.Errorf("dispatcher: events of thread %s: %w", threadID, err)
	}
	msgs, err := cons.Messages()
	if err != nil {
		return nil, fmt.Errorf("dispatcher: events of thread %s: %w", threadID, err)
	}
	defer msgs.Stop()
	out := map[string][]lifecycle.Event{}
	for {
		m, err := msgs.Next(jetstream.NextContext(ctx))
		if err != nil {
			return nil, fmt.Errorf("dispatcher: events of thread %s: %w", threadID, err)
		}
		md, err := m.Metadata()
		if err != nil {
			return nil, fmt.Errorf("dispatcher: events of thread %s: %w", threadID, err)
		}
		if a, err := lifecycle.ParseLifecycleSubject(m.Subject()); err == nil {
			if e, err := lifecycle.DecodeMsg(m); err == nil {
				out[a.DispatchID] = append(out[a.DispatchID], e)
			}
		}
		if md.NumPending == 0 || md.Sequence.Stream >= last.Sequence {
			return out, nil
		}
	}
}
