package dispatcher

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/agora-dispatch/agora/internal/crashpoint"
	"github.com/agora-dispatch/agora/internal/logging"
	"github.com/agora-dispatch/agora/internal/telemetry"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
)

// complete fills what the dispatcher decides: ids, input, revision,
// timeout (the definition's when the request leaves it out or asks for
// more) and round limit.
func complete(req *lifecycle.Request, def subagent.Definition, rev uint64) {
	if req.DispatchID == "" {
		req.DispatchID = lifecycle.NewID()
	}
	if req.ThreadID == "" {
		req.ThreadID = req.DispatchID
	}
	if in := bytes.TrimSpace(req.Input); len(in) == 0 || bytes.Equal(in, []byte("null")) {
		req.Input = json.RawMessage(`{}`)
	}
	req.SubagentRevision = rev
	// A request can only shorten the definition's timeout (a root asking
	// for more was refused by validate).
	if d, err := time.ParseDuration(req.Timeout); req.Timeout == "" || err == nil && d > def.TimeoutDuration() {
		req.Timeout = defTimeout(def)
	}
	if req.MaxRounds == 0 {
		req.MaxRounds = def.Rounds()
	}
}

// accept is the one code path of every door. It returns the dispatch
// record and the result label. The same dispatch id again returns the
// first record, after finishing its acceptance if that was interrupted. A
// refused request answers a *client.Problem; any other error is temporary
// and the request may be retried as it is. door names where it came in,
// for its span (docs/tracing.md).
func (s *Service) accept(ctx context.Context, b *bindings, req lifecycle.Request, size int, traceparent, door, principal string) (answer client.Record, result string, err error) {
	ctx, span := intakeSpan(ctx, traceparent, door, req)
	defer func() { endIntake(span, answer, result, err) }()
	// With tracing on, the dispatch's trace continues from this span.
	traceparent = telemetry.Or(ctx, traceparent)
	// A fresh request is validated and created at once; a repeat of an
	// accepted one is found by the create (the id is taken) or, when it
	// no longer validates, by a read: either way the first record answers.
	vctx, vspan := telemetry.Tracer().Start(ctx, "agora.dispatch.validate")
	def, rev, err := s.validate(vctx, b, &req, size)
	vspan.End()
	if err != nil {
		return s.refused(ctx, b, req, err)
	}
	complete(&req, def, rev)
	if !lifecycle.ValidTraceparent(traceparent) {
		traceparent = lifecycle.NewTraceparent()
	}
	rec, result := newRecord(req, rev, traceparent, principal)
	created, ierr, err := s.create(ctx, b, &rec)
	if errors.Is(err, errConflict) {
		// The id is taken (a retry, or another door won the race for
		// it): answer its record.
		first, _, err := b.store.view(ctx, rec.DispatchID)
		if err != nil {
			return client.Record{}, resultError, err
		}
		return s.repeat(ctx, b, first, req)
	}
	if err != nil {
		return client.Record{}, resultError, err
	}
	if ierr != nil {
		return rec.Record, result, withID(ierr, rec.DispatchID) // a retry finds the record and indexes it
	}
	answer, _, err = s.finish(ctx, b, rec, created)
	return answer, result, withID(err, answer.DispatchID)
}

// endIntake ends the intake span with the request's outcome. A refusal is
// an answer, not a failure of the span; the request's own error is
// returned as it is, whatever the span records.
func endIntake(span trace.Span, answer client.Record, result string, err error) {
	if span.IsRecording() {
		span.SetAttributes(telemetry.KeyOutcome.String(result))
		if answer.DispatchID != "" {
			span.SetAttributes(telemetry.Dispatch(answer.Common())...)
		}
	}
	spanErr := err
	var p *client.Problem
	if errors.As(err, &p) {
		spanErr = nil
	}
	telemetry.End(span, spanErr)
}

// refused answers a request validate refused: with the first record when
// its dispatch id was accepted before (a repeat that no longer
// validates), else with the refusal.
func (s *Service) refused(ctx context.Context, b *bindings, req lifecycle.Request, err error) (client.Record, string, error) {
	var p *client.Problem
	if errors.As(err, &p) && req.DispatchID != "" && idRE.MatchString(req.DispatchID) {
		first, _, rerr := b.store.view(ctx, req.DispatchID)
		switch {
		case rerr == nil:
			return s.repeat(ctx, b, first, req)
		case !errors.Is(rerr, errNoRecord):
			return client.Record{}, resultError, rerr
		}
	}
	return client.Record{}, resultOf(err), err
}

// newRecord is the record of a request accepted now, and its result: a
// round past the thread's limit is recorded failed max-rounds at once.
func newRecord(req lifecycle.Request, rev uint64, traceparent, principal string) (record, string) {
	now := time.Now().UTC()
	rec := record{Record: client.Record{
		DispatchID: req.DispatchID, ThreadID: req.ThreadID, ParentID: req.ParentID, Round: req.Round,
		Subagent: req.Subagent, SubagentRevision: rev, Status: lifecycle.KindAccepted,
		Traceparent: traceparent, Request: &req, CreatedAt: now, AcceptedAt: &now, UpdatedAt: now,
	}}
	if req.Round == 0 {
		rec.Principal = principal // whose thread it is (owner.go)
	}
	if req.Round > req.MaxRounds {
		rec.Status, rec.AcceptedAt, rec.EndedAt = lifecycle.KindFailed, nil, &now
		rec.Result = &client.Result{Kind: lifecycle.KindFailed, Reason: lifecycle.ReasonMaxRounds,
			Detail: fmt.Sprintf("round %d exceeds the thread's limit of %d rounds", req.Round, req.MaxRounds)}
		return rec, resultMaxRounds
	}
	// The record lists the accepted event it is about to publish (finish
	// sends it with this time), so the projection has nothing to write
	// for it.
	rec.Events = []client.EventRef{{ID: lifecycle.AcceptedID(rec.DispatchID), Kind: lifecycle.KindAccepted, Time: now}}
	return rec, resultAccepted
}

// create stores rec, and indexes a later round in its thread. A root is
// its thread's first entry without being written in an index
// (store.enter): its acceptance writes the record alone. A later round is
// indexed after its record exists and is its own, so a request that
// reuses another thread's dispatch id (errConflict) lists nothing in this
// thread; its index is read beside the record's write, which saves that
// read's round trip (docs/dispatcher.md). ierr is the index's failure.
func (s *Service) create(ctx context.Context, b *bindings, rec *record) (created uint64, ierr, err error) {
	var pre *indexRead
	read := make(chan struct{})
	rctx, rspan := telemetry.Tracer().Start(ctx, "agora.dispatch.record")
	if rec.Round > 0 {
		go func() {
			defer close(read)
			pre = b.store.readIndex(rctx, rec.ThreadID)
		}()
	} else {
		close(read)
	}
	created, err = b.store.create(rctx, rec)
	<-read
	if rec.Round > 0 && err == nil {
		ierr = b.store.indexFrom(rctx, rec.ThreadID, rec.Round, rec.DispatchID, pre)
	}
	if errors.Is(err, errConflict) {
		telemetry.End(rspan, ierr) // a repeat: answered by the caller
	} else {
		telemetry.End(rspan, errors.Join(err, ierr))
	}
	return created, ierr, err
}

// repeat answers a request whose dispatch id has a record: the record,
// once its acceptance is complete, or a conflict when the request differs
// from the recorded one.
func (s *Service) repeat(ctx context.Context, b *bindings, first record, req lifecycle.Request) (client.Record, string, error) {
	if err := requestConflict(first.Request, req); err != nil {
		return client.Record{}, resultConflict, err
	}
	answer, _, err := s.finish(ctx, b, first, 0)
	return answer, resultDuplicate, withID(err, answer.DispatchID)
}

// idError is a temporary failure after the dispatch got its id: the answer
// names the id, so a retry with it completes the same dispatch instead of
// starting a second one.
type idError struct {
	id  string
	err error
}

func (e *idError) Error() string { return e.err.Error() }
func (e *idError) Unwrap() error { return e.err }

func withID(err error, id string) error {
	if err == nil {
		return nil
	}
	return &idError{id: id, err: err}
}

func resultOf(err error) string {
	var p *client.Problem
	if errors.As(err, &p) {
		return resultRejected
	}
	return resultError
}

// finish completes an acceptance whose record exists: index the thread,
// then either publish failed max-rounds, or emit accepted and queue the
// request. Every step is idempotent, so finish runs again safely when a
// retry or the reconciler finds a record whose dispatch has not started:
// nothing marks the record queued (docs/storage.md, "The dispatch
// record and the reconciler"), and the work message's Nats-Msg-Id, the
// dispatch id, makes a second one a duplicate. created is the revision of
// a record created just now, already indexed (nothing was published for
// it before); 0 for a record found, whose status rec has from its chain
// (store.view). It returns the record as a door answers it, and whether a
// work message was stored by this call (not a duplicate, not there
// already).
func (s *Service) finish(ctx context.Context, b *bindings, rec record, created uint64) (client.Record, bool, error) {
	if rec.Request == nil {
		return rec.Record, false, nil // made by the projection from a refused request: nothing to queue
	}
	fresh := created > 0
	if !fresh {
		if err := b.store.enter(ctx, rec.ThreadID, rec.Round, rec.DispatchID); err != nil {
			return rec.Record, false, err
		}
	}
	if rec.Result != nil && rec.Result.Reason == lifecycle.ReasonMaxRounds && rec.AcceptedAt == nil {
		if !fresh {
			if seq, err := s.eventSeq(ctx, b, lifecycle.KindFailed, rec.Record); err != nil || seq != 0 {
				return rec.Record, false, err
			}
		}
		d := &lifecycle.Failed{Common: rec.Common(), Reason: lifecycle.ReasonMaxRounds, Detail: rec.Result.Detail}
		_, _, err := s.emit(ctx, b, d, rec.Traceparent)
		return rec.Record, false, err
	}
	if rec.Terminal() || rec.Status == lifecycle.KindStarted {
		// A worker took it (so it was queued), or it ended — cancelled
		// before it was queued, say: a worker would skip it.
		return rec.Record, false, nil
	}
	mark, err := s.parentCancel(ctx, b, rec.Record)
	if err != nil {
		return rec.Record, false, err
	}
	if mark != nil {
		r, err := s.cancelOnAcceptance(ctx, b, rec.Record, fresh, mark)
		return r, false, err
	}
	stored, err := s.publish(ctx, b, rec.Record, fresh)
	return rec.Record, stored, err
}

// acceptedSeq returns the stream sequence of rec's accepted event on
// AGORA_LIFECYCLE, 0 when it is still to be published: always for a
// record created just now, otherwise when the stream has none.
func (s *Service) acceptedSeq(ctx context.Context, b *bindings, rec client.Record, fresh bool) (uint64, error) {
	if fresh {
		return 0, nil
	}
	return s.eventSeq(ctx, b, lifecycle.KindAccepted, rec)
}

// publish sends the accepted event and then the queued work of rec,
// which carries the event's stream sequence (queue): a worker's first
// delivery fences its `started` on it without reading the chain
// (docs/worker.md#fencing), so the work is sent only once `accepted` is
// acknowledged. Its span, agora.dispatch.publish, times the two; the
// events name the dispatch's span (ctx's) as their cause. It reports
// whether a work message was stored by this call.
func (s *Service) publish(ctx context.Context, b *bindings, rec client.Record, fresh bool) (stored bool, err error) {
	_, span := telemetry.Tracer().Start(ctx, "agora.dispatch.publish", trace.WithSpanKind(trace.SpanKindProducer))
	defer func() { telemetry.End(span, err) }()
	req := *rec.Request
	seq, err := s.acceptedSeq(ctx, b, rec, fresh)
	if err != nil {
		return false, err
	}
	if seq == 0 {
		d := &lifecycle.Accepted{Common: rec.Common(), SubagentRevision: rec.SubagentRevision, Target: req.Target, Labels: req.Labels}
		_, msg, err := lifecycle.Message(s.source, d, telemetry.Event(ctx, rec.Traceparent), acceptedTime(rec))
		if err != nil {
			return false, fmt.Errorf("dispatcher: build event: %w", err)
		}
		// A repeat is a duplicate (the event id is its Nats-Msg-Id),
		// acknowledged with the first one's sequence; a replicated stream
		// still storing the first answers an error instead (10158), and a
		// retry or the reconciler completes the acceptance.
		ack, err := b.js.PublishMsg(ctx, msg, jetstream.WithExpectStream(lifecycle.StreamLifecycle))
		if err != nil {
			return false, fmt.Errorf("dispatcher: publish accepted %s: %w", rec.DispatchID, err)
		}
		seq = ack.Sequence
		crashpoint.Here(crashpoint.DispatcherAccepted) // docs/chaos.md
	} else if there, err := s.queuedAlready(ctx, b, rec); err != nil || there {
		return false, err
	}
	return s.queue(ctx, b, &req, rec.Traceparent, seq)
}

// queuedAlready reports whether the work message of an acceptance being
// completed again is on AGORA_DISPATCH. Inside the stream's duplicate
// window of the first publish, queueing it again is a duplicate and
// nothing needs looking at; past it (a retry or a reconciler pass long
// after, with the dispatch still waiting in the queue) the work subject's
// messages are read, so a second copy is never queued.
func (s *Service) queuedAlready(ctx context.Context, b *bindings, rec client.Record) (bool, error) {
	window := b.work.CachedInfo().Config.Duplicates
	if window == 0 || time.Since(rec.CreatedAt) < window-time.Minute {
		return false, nil
	}
	subj, err := lifecycle.DispatchSubject(rec.Subagent)
	if err != nil {
		return false, err
	}
	for seq := uint64(1); ; {
		m, err := b.work.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subj))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("dispatcher: look for the work of %s: %w", rec.DispatchID, err)
		}
		if m.Header.Get(jetstream.MsgIDHeader) == rec.DispatchID {
			return true, nil
		}
		seq = m.Sequence + 1
	}
}

// cancelOnAcceptance ends a re-dispatch whose thread was cancelled while
// paused on the question this round answers: accepted (once), then
// cancelled, never queued.
func (s *Service) cancelOnAcceptance(ctx context.Context, b *bindings, rec client.Record, fresh bool, mark *client.CancelMark) (client.Record, error) {
	seq, err := s.acceptedSeq(ctx, b, rec, fresh)
	if err != nil {
		return rec, err
	}
	if seq == 0 {
		req := rec.Request
		d := &lifecycle.Accepted{Common: rec.Common(), SubagentRevision: rec.SubagentRevision, Target: req.Target, Labels: req.Labels}
		if _, _, err := s.emit(ctx, b, d, rec.Traceparent); err != nil {
			return rec, err
		}
	}
	s.log.With(logging.Trace(rec.Traceparent)...).Info("re-dispatch of a cancelled thread: cancelled on acceptance",
		"dispatch_id", rec.DispatchID, "thread_id", rec.ThreadID, "parent_id", rec.ParentID)
	rec, err = s.cancelDispatch(ctx, b, rec.DispatchID, mark.By, mark.Reason)
	rec.Outcome = "" // an acceptance's answer, not a cancel's
	return rec, err
}

// acceptedTime gives the accepted event the time its record lists for
// it, so the projection finds the event already applied.
func acceptedTime(rec client.Record) lifecycle.Option {
	if rec.AcceptedAt == nil {
		return lifecycle.WithTime(time.Time{}) // now
	}
	return lifecycle.WithTime(*rec.AcceptedAt)
}

// parentCancel returns the cancel mark on the record of the dispatch a
// re-dispatch continues (its parent, paused on the question this round
// answers), or nil. The thread index lists rec before this read, so a
// cancel that marks the parent after it finds rec in the index.
func (s *Service) parentCancel(ctx context.Context, b *bindings, rec client.Record) (*client.CancelMark, error) {
	if rec.Round == 0 || rec.ParentID == "" || rec.Status != lifecycle.KindAccepted {
		return nil, nil
	}
	ctx, span := telemetry.Tracer().Start(ctx, "agora.dispatch.parent")
	parent, _, err := b.store.get(ctx, rec.ParentID)
	telemetry.End(span, ignoreNoRecord(err))
	switch {
	case errors.Is(err, errNoRecord):
		return nil, nil
	case err != nil:
		return nil, err
	case parent.ThreadID != rec.ThreadID:
		return nil, nil
	}
	return parent.CancelRequested, nil
}

func ignoreNoRecord(err error) error {
	if errors.Is(err, errNoRecord) {
		return nil
	}
	return err
}

// queue publishes the completed request on agora.dispatch.<subagent> with
// Nats-Msg-Id = dispatch id, so a repeat is dropped as a duplicate. It
// names the dispatch's accepted event, stored at acceptedSeq on
// AGORA_LIFECYCLE (docs/worker.md#fencing).
func (s *Service) queue(ctx context.Context, b *bindings, req *lifecycle.Request, traceparent string, acceptedSeq uint64) (stored bool, err error) {
	e, err := lifecycle.New(s.source, req, telemetry.Event(ctx, traceparent))
	if err != nil {
		return false, fmt.Errorf("dispatcher: build request event: %w", err)
	}
	subj, err := lifecycle.DispatchSubject(req.Subagent)
	if err != nil {
		return false, err
	}
	msg, err := lifecycle.Encode(subj, e)
	if err != nil {
		return false, err
	}
	msg.Header.Set(lifecycle.AcceptedHeader, lifecycle.AcceptedID(req.DispatchID))
	msg.Header.Set(lifecycle.AcceptedSeqHeader, strconv.FormatUint(acceptedSeq, 10))
	ack, err := b.js.PublishMsg(ctx, msg, jetstream.WithExpectStream(lifecycle.StreamDispatch))
	if err != nil {
		return false, fmt.Errorf("dispatcher: queue %s: %w", req.DispatchID, err)
	}
	return !ack.Duplicate, nil
}

// emit publishes a lifecycle event carrying the dispatch's trace.
func (s *Service) emit(ctx context.Context, b *bindings, d lifecycle.Data, traceparent string) (lifecycle.Event, *jetstream.PubAck, error) {
	e, msg, err := lifecycle.Message(s.source, d, telemetry.Event(ctx, traceparent))
	if err != nil {
		return e, nil, fmt.Errorf("dispatcher: build event: %w", err)
	}
	ack, err := b.js.PublishMsg(ctx, msg, jetstream.WithExpectStream(lifecycle.StreamLifecycle))
	if err != nil {
		return e, nil, fmt.Errorf("dispatcher: publish %s: %w", e.ID(), err)
	}
	return e, ack, nil
}

// eventSeq returns the stream sequence of the dispatch's event of kind k
// on the lifecycle stream, 0 when there is none.
func (s *Service) eventSeq(ctx context.Context, b *bindings, k lifecycle.Kind, rec client.Record) (uint64, error) {
	subj, err := lifecycle.LifecycleSubject(k, rec.ThreadID, rec.DispatchID)
	if err != nil {
		return 0, err
	}
	raw, err := b.events.GetLastMsgForSubject(ctx, subj)
	switch {
	case err == nil:
		return raw.Sequence, nil
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return 0, nil
	}
	return 0, fmt.Errorf("dispatcher: look up %s: %w", subj, err)
}
