package router

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/chain"
	"github.com/agora-dispatch/agora/internal/clip"
	"github.com/agora-dispatch/agora/internal/eventmsg"
	"github.com/agora-dispatch/agora/internal/jserr"
	"github.com/agora-dispatch/agora/internal/logging"
	"github.com/agora-dispatch/agora/internal/resume"
	"github.com/agora-dispatch/agora/internal/telemetry"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
)

// onNeedsInput turns one needs_input event into a question: record, then
// question.asked. A redelivery finds the record and only publishes what is
// still pending.
func (s *Service) onNeedsInput(ctx context.Context, m jetstream.Msg) verdict {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	log := s.log.With("subject", m.Subject())
	e, ni, v, ok := readNeedsInput(m, log)
	if !ok {
		return v
	}
	qid := ni.QuestionID
	ctx, span := askSpan(ctx, e, ni, m.Subject())
	defer span.End()
	log = log.With("question_id", qid, "dispatch_id", ni.DispatchID, "thread_id", ni.ThreadID).With(logging.Trace(telemetry.Or(ctx, lifecycle.Traceparent(e)))...)

	defer s.lock(qid)()

	if r, rev, err := s.store.get(ctx, qid); err == nil {
		// Asked before (a redelivery, or another replica): finish seating
		// a joined question and publishing.
		return s.finish(ctx, log, r, rev)
	} else if !errors.Is(err, errNoQuestion) {
		log.Warn("read question: redelivering", "err", err)
		return retryIn(time.Second)
	}
	drec, v, ok := s.recordOf(ctx, m, log, ni)
	if !ok {
		return v
	}
	r, err := s.newRecord(ctx, ni, telemetry.Or(ctx, lifecycle.Traceparent(e)), drec)
	if errors.Is(err, errOwnerUnread) {
		log.Warn("read the thread's owner: redelivering", "err", err)
		return retryIn(time.Second)
	} else if err != nil {
		log.Error("cannot build the question: skipped", "err", err)
		return ack
	}
	r.traceNew(telemetry.Or(ctx, ""))
	span.SetAttributes(telemetry.KeyRoute.String(r.Route))
	how, err := s.askOnce(ctx, r, ni)
	if errors.Is(err, errJoinLater) {
		return retryIn(time.Second)
	} else if err != nil {
		log.Warn("ask once: redelivering", "err", err)
		return retryIn(time.Second)
	}
	return s.record(ctx, log, e, r, how)
}

// readNeedsInput decodes m as a needs_input event that keeps the
// contract; otherwise ok is false and v says what to do with m.
func readNeedsInput(m jetstream.Msg, log *slog.Logger) (e lifecycle.Event, ni *lifecycle.NeedsInput, v verdict, ok bool) {
	e, d, v, ok := eventmsg.Read(m, log, "needs_input")
	if !ok {
		return e, nil, v, false
	}
	ni, ok = d.(*lifecycle.NeedsInput)
	if !ok {
		log.Warn("not a needs_input event: skipped", "type", e.Type(), "id", e.ID())
		return e, nil, ack, false
	}
	if err := lifecycle.Validate(ni); err != nil {
		log.Error("needs_input that breaks the contract skipped", "id", e.ID(), "err", err)
		return e, nil, ack, false
	}
	return e, ni, ack, true
}

// recordOf reads the dispatch record of ni's dispatch, for the request
// settings the question copies. The dispatcher writes it before it queues
// the work, so it is normally there; the event waits a little for it,
// then asks without it (drec nil). ok false: redeliver as v says.
func (s *Service) recordOf(ctx context.Context, m jetstream.Msg, log *slog.Logger, ni *lifecycle.NeedsInput) (drec *dispatchRecord, v verdict, ok bool) {
	drec, err := s.dispatchRecord(ctx, ni.DispatchID)
	switch {
	case errors.Is(err, errNoRecord):
		if md, merr := m.Metadata(); merr == nil && time.Since(md.Timestamp) < s.cfg.RecordWait {
			return nil, retryIn(min(time.Second, s.cfg.RecordWait)), false
		}
		log.Warn("no dispatch record: asking without the original request settings")
		return nil, ack, true
	case err != nil:
		log.Warn("read dispatch record: redelivering", "err", err)
		return nil, retryIn(time.Second), false
	}
	return drec, ack, true
}

// record writes r, a new question settled by ask once as how, seats it
// when it joined another, and publishes its events.
func (s *Service) record(ctx context.Context, log *slog.Logger, e lifecycle.Event, r *record, how int) verdict {
	rev, err := s.store.create(ctx, r)
	switch {
	case errors.Is(err, errConflict):
		log.Debug("question created by another router")
		r, rev, err := s.store.get(ctx, r.QuestionID)
		if err != nil {
			log.Warn("read question: redelivering", "err", err)
			return retryIn(time.Second)
		}
		return s.finish(ctx, log, r, rev)
	case jserr.TooLarge(err):
		// The record can never be stored: the question can never be
		// asked. The thread ends, saying why, instead of waiting forever.
		if err := s.endTooLarge(ctx, r, e.Time(), err); err != nil {
			log.Warn("end a thread whose question cannot be stored: redelivering", "err", err)
			return retryIn(time.Second)
		}
		log.Error("question too large for its record: the thread ends failed", "err", err)
		return ack
	case err != nil:
		log.Warn("create question: redelivering", "err", err)
		return retryIn(time.Second)
	}
	if how == askJoined {
		if r, err = s.seat(ctx, r, rev); err != nil {
			return s.seatFailed(log, r, err)
		}
		if r.Status != lifecycle.StatusJoined {
			how = askAsked
		}
	}
	s.logAsked(log, r, how)
	// Publish from the record just written, not a read of it.
	if err := errors.Join(s.flushRecord(ctx, r), s.publishJoined(ctx, r)); err != nil {
		log.Warn("publish question events: redelivering", "err", err)
		return retryIn(time.Second)
	}
	return ack
}

// logAsked counts and logs how a new question was settled.
func (s *Service) logAsked(log *slog.Logger, r *record, how int) {
	switch how {
	case askJoined:
		s.metrics.coalesced.WithLabelValues(r.Origin).Inc()
		log.Info("question joined one already waiting", "route", r.Route, "joined_to", r.JoinedTo)
	case askReused:
		s.metrics.reused.WithLabelValues(r.Origin).Inc()
		s.metrics.question(r.Route, r.Event)
		log.Info("question answered from a remembered decision", "route", r.Route, "reused", r.Reused.QuestionID, "next_dispatch_id", r.NextDispatchID)
	default:
		s.metrics.question(r.Route, r.Event)
		log.Info("question asked", "route", r.Route, "answerer", r.Answerer, "kind", r.Kind, "deadline", r.Deadline, "status", r.Status)
	}
}

// finish completes a question recorded already (a redelivery, or one
// another router created): a joined one is seated on the question it
// joined, then its pending events are published.
func (s *Service) finish(ctx context.Context, log *slog.Logger, r *record, rev uint64) verdict {
	if r.Status == lifecycle.StatusJoined {
		var err error
		if r, err = s.seat(ctx, r, rev); err != nil {
			return s.seatFailed(log, r, err)
		}
	}
	if err := errors.Join(s.flushRecord(ctx, r), s.publishJoined(ctx, r)); err != nil {
		log.Warn("publish pending question events: redelivering", "err", err)
		return retryIn(time.Second)
	}
	return ack
}

// seatFailed redelivers a joined question that could not be seated yet.
func (s *Service) seatFailed(log *slog.Logger, r *record, err error) verdict {
	if !errors.Is(err, errJoinLater) {
		log.Warn("list the question on the one it joined: redelivering", "joined_to", r.JoinedTo, "err", err)
	}
	return retryIn(time.Second)
}

// endTooLarge ends the thread of r, a question whose record cannot be
// stored, with failed rejected on the thread's next dispatch id. The id
// is derived from the question and its event's time, so a redelivery
// publishes the same event again, a duplicate.
func (s *Service) endTooLarge(ctx context.Context, r *record, at time.Time, cause error) error {
	r.NextDispatchID = lifecycle.DerivedID(at, "too-large", r.QuestionID)
	f := &lifecycle.Failed{Common: r.next(), Reason: lifecycle.ReasonRejected, Detail: clip.String(fmt.Sprintf(
		"question %s cannot be asked: its record is larger than the server stores (%v); ask with fewer or shorter options and a shorter context", r.QuestionID, cause), 1024)}
	e, err := lifecycle.New(s.source, f)
	if err != nil {
		return err
	}
	subj, err := lifecycle.LifecycleSubject(lifecycle.KindFailed, r.ThreadID, r.NextDispatchID)
	if err != nil {
		return err
	}
	msg, err := lifecycle.Encode(subj, e)
	if err != nil {
		return err
	}
	_, err = s.js.PublishMsg(ctx, msg)
	return err
}

// How a new question is settled by ask once (docs/router.md, "Ask once").
const (
	askAsked  = iota // asked on its own
	askJoined        // joined a matching question already waiting
	askReused        // answered from a remembered decision
)

// askOnce answers r, a new question not written yet, from a remembered
// decision, or joins it to a matching question already waiting, as its
// route says.
func (s *Service) askOnce(ctx context.Context, r *record, ni *lifecycle.NeedsInput) (int, error) {
	if r.Status != statusAsked || r.MatchKey == "" {
		return askAsked, nil
	}
	rt, ok := s.routes.Load().Route(r.Origin)
	if !ok {
		return askAsked, nil
	}
	if (ni.Reuse == nil || *ni.Reuse) && remembers(rt, r.Kind) {
		d, err := s.recall(ctx, r.MatchKey)
		if err != nil {
			return askAsked, err
		}
		if d != nil {
			ok, err := s.answerFromMemory(r, d)
			if err != nil || ok {
				return askReused, err
			}
		}
	}
	if !rt.Coalesce {
		return askAsked, nil
	}
	lid, err := s.holder(ctx, r)
	if err != nil || lid == "" {
		return askAsked, err
	}
	r.asJoined(lid) // listed there once written (seat)
	return askJoined, nil
}

// newRecord builds the record of a new question.
func (s *Service) newRecord(ctx context.Context, ni *lifecycle.NeedsInput, traceparent string, drec *dispatchRecord) (*record, error) {
	var req *lifecycle.Request
	if drec != nil && drec.Request != nil {
		o := drec.Request
		req = &lifecycle.Request{
			Subagent: ni.Subagent, Input: o.Input, Target: o.Target, Env: maps.Clone(o.Env), Labels: maps.Clone(o.Labels),
			Timeout: o.Timeout, MaxRounds: o.MaxRounds,
		}
		if traceparent == "" {
			traceparent = drec.Traceparent
		}
	}
	now := time.Now().UTC()
	r := &record{
		Record: resume.Record{
			Question: lifecycle.Question{
				Common: ni.Common, QuestionID: ni.QuestionID, Status: statusAsked,
				Question: ni.Question, Options: ni.Options, Context: ni.Context, Kind: ni.Kind, AskedAt: now,
			},
			PartialState: ni.PartialState, PartialStateRef: ni.PartialStateRef, Request: req,
		},
		Traceparent: traceparent, History: []attempt{},
	}
	if req != nil {
		r.Target, r.Labels = req.Target, req.Labels
	}
	r.ShownDigest = s.shownDigest(ctx, r)
	rt := s.routes.Load().Match(Facts{Kind: string(ni.Kind), Subagent: ni.Subagent, Labels: r.Labels})
	r.Route, r.Answerer, r.Origin = rt.Name, rt.Answerer, rt.Name
	if rt.Coalesce || rt.Remember > 0 {
		owner, err := s.threadOwner(ctx, ni, drec)
		if err != nil {
			return nil, err
		}
		r.MatchKey, r.DedupeKey = matchKey(rt, ni, owner), ni.DedupeKey
	}
	if rt.Deadline > 0 {
		d := now.Add(rt.Deadline)
		r.Deadline, r.OnExpiry = &d, rt.OnExpiry.String()
	}
	for _, st := range rt.Escalate {
		r.Ladder = append(r.Ladder, rung{At: now.Add(st.After), To: st.To})
	}
	r.MaxRounds = s.maxRounds(ctx, req, ni.Subagent)

	// A thread cancelled before its question was recorded: withdraw at once.
	if cr, ok := s.cancelRequested(ctx, r, drec); ok {
		if err := withdraw(r, cr, "ask"); err != nil {
			return nil, err
		}
		return r, r.queueQuestion(lifecycle.QuestionWithdrawn, r.Detail)
	}
	return r, r.queueQuestion(lifecycle.QuestionAsked, "")
}

// maxRounds is the thread's round limit: the request's, else the
// sub-agent definition's, else the default.
func (s *Service) maxRounds(ctx context.Context, req *lifecycle.Request, name string) int {
	if req != nil && req.MaxRounds > 0 {
		return req.MaxRounds
	}
	if e, err := s.subagents.Get(ctx, name); err == nil {
		var def subagent.Definition
		if json.Unmarshal(e.Value(), &def) == nil {
			return def.Rounds()
		}
	}
	return subagent.DefaultMaxRounds
}

// dispatchRecord is the dispatcher's record, as the router reads it from
// the bucket: the request and the trace, and CancelRequested (JSON
// cancel_requested), which the dispatcher sets on a paused dispatch's
// record when its thread is cancelled: the durable twin of the core
// message on agora.control.cancel-thread.<thread_id>. Its status is the
// one it was created with; dispatchStatus reads the current one.
type dispatchRecord struct {
	client.Record
}

// errOwnerUnread reports a thread whose owner could not be read now.
var errOwnerUnread = errors.New("router: the thread's owner could not be read")

// threadOwner returns the principal that dispatched the thread of ni: the
// Principal of its first round's record (drec itself on round 0); empty
// when the thread has none (docs/security.md, "Principals and scopes").
func (s *Service) threadOwner(ctx context.Context, ni *lifecycle.NeedsInput, drec *dispatchRecord) (string, error) {
	if drec != nil && drec.Round == 0 {
		return drec.Principal, nil
	}
	if ni.Round == 0 {
		return "", nil // asked without its record (RecordWait passed)
	}
	root, err := s.dispatchRecord(ctx, ni.ThreadID)
	switch {
	case errors.Is(err, errNoRecord):
		return "", nil
	case err != nil:
		return "", fmt.Errorf("%w: %w", errOwnerUnread, err)
	}
	return root.Principal, nil
}

// errNoRecord reports a dispatch id without a dispatch record.
var errNoRecord = errors.New("router: no dispatch record")

func (s *Service) dispatchRecord(ctx context.Context, id string) (*dispatchRecord, error) {
	e, err := s.dispatches.Get(ctx, id)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrInvalidKey):
		return nil, fmt.Errorf("%w: %s", errNoRecord, id)
	case err != nil:
		return nil, fmt.Errorf("router: read dispatch record %s: %w", id, err)
	}
	var r dispatchRecord
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		return nil, fmt.Errorf("router: decode dispatch record %s: %w", id, err)
	}
	return &r, nil
}

// dispatchStatus applies the dispatch's chain to drec (internal/chain), as
// every door of the dispatcher reads a status.
func (s *Service) dispatchStatus(ctx context.Context, drec *dispatchRecord) error {
	links, err := s.chains.Last(ctx, drec.ThreadID, drec.DispatchID)
	if err != nil {
		return fmt.Errorf("router: read the status of %s: %w", drec.DispatchID, err)
	}
	chain.Apply(&drec.Record, links...)
	return nil
}

// cancelRequested reports whether the question's thread was cancelled
// while paused: a cancel-thread message this process saw, or the mark the
// dispatcher leaves on the paused dispatch's record (read from drec when
// given, else from the bucket).
func (s *Service) cancelRequested(ctx context.Context, r *record, drec *dispatchRecord) (lifecycle.CancelRequest, bool) {
	if cr, ok := s.cancelled.get(r.ThreadID, r.DispatchID); ok {
		return cr, true
	}
	if drec == nil {
		var err error
		if drec, err = s.dispatchRecord(ctx, r.DispatchID); err != nil {
			return lifecycle.CancelRequest{}, false
		}
	}
	if m := drec.CancelRequested; m != nil {
		cr := m.CancelRequest
		if cr.ThreadID == "" {
			cr.ThreadID = r.ThreadID
		}
		if cr.DispatchID == "" {
			cr.DispatchID = r.DispatchID
		}
		return cr, true
	}
	// The dispatch itself cannot have been cancelled: it has one terminal
	// event, and its question exists because that event is needs_input.
	return lifecycle.CancelRequest{}, false
}
