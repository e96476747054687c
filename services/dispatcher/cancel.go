package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// defaultCanceller names who cancelled when the caller gives no name.
const defaultCanceller = "api"

func notFound(what, id string) *client.Problem {
	return &client.Problem{Type: client.ProblemNotFound, Title: "Not found", Status: http.StatusNotFound,
		Detail: fmt.Sprintf("no %s %q", what, clip(id))}
}

// cancelDispatch cancels one dispatch, idempotently. A terminal dispatch
// is returned unchanged (for the latest round of a thread paused on a
// question, the router is asked to end the thread). Otherwise the
// dispatcher publishes the dispatch's one terminal event, cancelled, and
// then tells a worker running it to stop: a queued dispatch is skipped by
// the worker that pulls it, a running one is killed.
func (s *Service) cancelDispatch(ctx context.Context, b *bindings, id, by, reason string) (client.Record, error) {
	if !idRE.MatchString(id) {
		return client.Record{}, client.Invalid(client.FieldError{Field: "dispatch_id", Message: fmt.Sprintf("%q is not a valid dispatch id", clip(id))})
	}
	rec, _, err := s.record(ctx, b, id)
	if errors.Is(err, errNoRecord) {
		return rec, notFound("dispatch", id)
	}
	if err != nil {
		return rec, err
	}
	if by == "" {
		by = defaultCanceller
	}
	if rec.Terminal() {
		if rec.Status == lifecycle.KindNeedsInput {
			return rec, s.cancelPausedThread(ctx, b, rec, by, reason)
		}
		return rec, nil
	}
	d := &lifecycle.Cancelled{Common: rec.Common(), By: by, Reason: reason}
	e, pub, err := s.emit(ctx, b, d, rec.Traceparent)
	if err != nil {
		return rec, err
	}
	l := lifecycle.Lifecycle(d)
	if pub.Duplicate {
		// The dispatch has a terminal event already (maybe this cancel's,
		// sent before): record that one instead.
		var found bool
		if e, l, found, err = s.terminalEvent(ctx, b, rec); err != nil {
			return rec, err
		}
		if !found {
			return rec, nil
		}
	}
	if l.LifecycleKind() == lifecycle.KindCancelled {
		if err := s.signalCancel(ctx, rec, by, reason); err != nil {
			return rec, err
		}
	}
	rec, _, err = s.apply(ctx, b, e, l)
	if err == nil {
		s.log.Info("dispatch cancelled", "dispatch_id", rec.DispatchID, "thread_id", rec.ThreadID, "by", by, "status", rec.Status)
	}
	return rec, err
}

// signalCancel publishes the core message that stops a worker running the
// dispatch (agora.control.cancel.<dispatch_id>).
func (s *Service) signalCancel(ctx context.Context, rec client.Record, by, reason string) error {
	subj, err := lifecycle.CancelSubject(rec.DispatchID)
	if err != nil {
		return err
	}
	data, _ := json.Marshal(client.CancelRequest{DispatchID: rec.DispatchID, ThreadID: rec.ThreadID, By: by, Reason: reason})
	if err := s.nc.Publish(subj, data); err != nil {
		return fmt.Errorf("dispatcher: signal cancel %s: %w", rec.DispatchID, err)
	}
	if err := s.nc.FlushWithContext(ctx); err != nil {
		return fmt.Errorf("dispatcher: signal cancel %s: %w", rec.DispatchID, err)
	}
	return nil
}

// cancelPausedThread asks the router to end a thread paused on a question:
// a core message on agora.control.cancel-thread.<thread_id>, body a
// client.CancelRequest naming the paused dispatch. It does so only when rec
// is the thread's latest round.
//
// TODO(router): the router withdraws the question and ends the thread
// cancelled; agree the handshake (who emits which event on which dispatch
// id) and test it end to end once services/router exists.
func (s *Service) cancelPausedThread(ctx context.Context, b *bindings, rec client.Record, by, reason string) error {
	idx, err := s.threadIndex(ctx, b, rec.ThreadID)
	if err != nil {
		var p *client.Problem
		if errors.As(err, &p) {
			return nil // no index: nothing says it is the latest round
		}
		return err
	}
	if n := len(idx.Dispatches); n == 0 || idx.Dispatches[n-1].DispatchID != rec.DispatchID {
		return nil // answered already: a later round exists
	}
	subj, err := client.CancelThreadSubject(rec.ThreadID)
	if err != nil {
		return err
	}
	data, _ := json.Marshal(client.CancelRequest{DispatchID: rec.DispatchID, ThreadID: rec.ThreadID, By: by, Reason: reason})
	if err := s.nc.Publish(subj, data); err != nil {
		return fmt.Errorf("dispatcher: cancel paused thread %s: %w", rec.ThreadID, err)
	}
	if err := s.nc.FlushWithContext(ctx); err != nil {
		return fmt.Errorf("dispatcher: cancel paused thread %s: %w", rec.ThreadID, err)
	}
	s.log.Info("asked the router to end a thread paused on a question", "thread_id", rec.ThreadID, "dispatch_id", rec.DispatchID, "by", by)
	return nil
}

// terminalEvent finds the dispatch's terminal event on the lifecycle
// stream.
func (s *Service) terminalEvent(ctx context.Context, b *bindings, rec client.Record) (lifecycle.Event, lifecycle.Lifecycle, bool, error) {
	for _, k := range []lifecycle.Kind{lifecycle.KindFinished, lifecycle.KindNeedsInput, lifecycle.KindFailed, lifecycle.KindCancelled} {
		subj, err := lifecycle.LifecycleSubject(k, rec.ThreadID, rec.DispatchID)
		if err != nil {
			return lifecycle.Event{}, nil, false, err
		}
		raw, err := b.events.GetLastMsgForSubject(ctx, subj)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return lifecycle.Event{}, nil, false, fmt.Errorf("dispatcher: look up %s: %w", subj, err)
		}
		e, err := lifecycle.Decode(raw.Header, raw.Data)
		if err != nil {
			return lifecycle.Event{}, nil, false, err
		}
		d, err := lifecycle.Parse(e)
		if err != nil {
			return lifecycle.Event{}, nil, false, err
		}
		if l, ok := d.(lifecycle.Lifecycle); ok {
			return e, l, true, nil
		}
	}
	return lifecycle.Event{}, nil, false, nil
}

// cancelThread cancels every dispatch of a thread that has not ended and,
// when the thread is paused on a question, asks the router to end it.
func (s *Service) cancelThread(ctx context.Context, b *bindings, threadID, by, reason string) (client.Thread, error) {
	idx, err := s.threadIndex(ctx, b, threadID)
	if err != nil {
		return client.Thread{}, err
	}
	for _, ent := range idx.Dispatches {
		if _, err := s.cancelDispatch(ctx, b, ent.DispatchID, by, reason); err != nil && !errors.Is(err, client.ErrNotFound) {
			return client.Thread{}, err
		}
	}
	return s.thread(ctx, b, threadID)
}

// threadIndex reads a thread's index; a 404 *client.Problem when there is
// none.
func (s *Service) threadIndex(ctx context.Context, b *bindings, threadID string) (threadIndex, error) {
	if !idRE.MatchString(threadID) {
		return threadIndex{}, client.Invalid(client.FieldError{Field: "thread_id", Message: fmt.Sprintf("%q is not a valid thread id", clip(threadID))})
	}
	e, err := b.dispatches.Get(ctx, threadKey(threadID))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return threadIndex{}, notFound("thread", threadID)
	}
	if err != nil {
		return threadIndex{}, fmt.Errorf("dispatcher: read thread index %s: %w", threadID, err)
	}
	var idx threadIndex
	if err := json.Unmarshal(e.Value(), &idx); err != nil {
		return threadIndex{}, fmt.Errorf("dispatcher: decode thread index %s: %w", threadID, err)
	}
	return idx, nil
}

// status returns one dispatch's record.
func (s *Service) status(ctx context.Context, b *bindings, id string) (client.Record, error) {
	if !idRE.MatchString(id) {
		return client.Record{}, client.Invalid(client.FieldError{Field: "dispatch_id", Message: fmt.Sprintf("%q is not a valid dispatch id", clip(id))})
	}
	rec, _, err := s.record(ctx, b, id)
	if errors.Is(err, errNoRecord) {
		return rec, notFound("dispatch", id)
	}
	return rec, err
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
		rec, _, err := s.record(ctx, b, ent.DispatchID)
		if errors.Is(err, errNoRecord) {
			continue
		}
		if err != nil {
			return client.Thread{}, err
		}
		th.Rounds = append(th.Rounds, client.Round{Record: rec, Events: events[ent.DispatchID]})
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
		FilterSubjects: []string{filter}, DeliverPolicy: jetstream.DeliverAllPolicy,
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
