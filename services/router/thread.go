package router

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/agora-dispatch/agora/internal/clip"
	"github.com/agora-dispatch/agora/internal/resume"
	"github.com/agora-dispatch/agora/internal/telemetry"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// How a thread went on after its question (record.Outcome).
const (
	outcomeRedispatched = resume.OutcomeRedispatched
	outcomeUnanswered   = "failed:unanswered"
	outcomeMaxRounds    = "failed:max-rounds"
	outcomeCancelled    = "cancelled"
	outcomeWithdrawn    = "withdrawn"
)

// The name the router gives as the canceller of a thread whose question
// expired with on_expiry cancel.
const expiryCanceller = "agora:router"

// next returns the Common of the thread's next dispatch.
func (r *record) next() lifecycle.Common {
	return lifecycle.Common{DispatchID: r.NextDispatchID, ThreadID: r.ThreadID, ParentID: r.DispatchID, Round: r.Round + 1, Subagent: r.Subagent}
}

// resume decides what an answered question does to its thread: the
// re-dispatch, or failed max-rounds when the next round is past the limit.
// It picks the next dispatch id once; the caller's compare-and-set stores
// it with the answer.
func (s *Service) resume(r *record, why string) error {
	r.NextDispatchID = lifecycle.NewID()
	if r.Round+1 > r.MaxRounds {
		r.Outcome = outcomeMaxRounds
		return r.queueEnd(&lifecycle.Failed{
			Common: r.next(), Reason: lifecycle.ReasonMaxRounds,
			Detail: fmt.Sprintf("round %d exceeds the thread's limit of %d rounds; question %s was %s", r.Round+1, r.MaxRounds, r.QuestionID, why),
		}, nil)
	}
	if _, err := r.resumeRequest(); err != nil {
		return err
	}
	subj, err := lifecycle.RequestSubject(r.Subagent)
	if err != nil {
		return err
	}
	r.Outcome = outcomeRedispatched
	r.Pending = append(r.Pending, pending{ID: r.QuestionID, Subject: subj, Resume: true})
	return nil
}

// queueEnd appends the one lifecycle event of the dispatch that ends the
// thread.
func (r *record) queueEnd(f *lifecycle.Failed, c *lifecycle.Cancelled) error {
	p := pending{ID: lifecycle.TerminalID(r.NextDispatchID), Failed: f, Cancelled: c}
	k := lifecycle.KindFailed
	if c != nil {
		k = lifecycle.KindCancelled
	}
	subj, err := lifecycle.LifecycleSubject(k, r.ThreadID, r.NextDispatchID)
	if err != nil {
		return err
	}
	p.Subject = subj
	r.Pending = append(r.Pending, p)
	return nil
}

// resumeRequest builds the re-dispatch from the record (resume.Build),
// as the dispatcher does again when it accepts it.
func (r *record) resumeRequest() (*lifecycle.Request, error) { return resume.Build(&r.Record) }

// endCancelled ends the thread cancelled: it picks the thread's next
// dispatch id, unless one was picked already (the caller's compare-and-set
// stores it), and queues that dispatch's one event, cancelled by by.
func (r *record) endCancelled(by, reason string) error {
	if r.NextDispatchID == "" {
		r.NextDispatchID = lifecycle.NewID()
	}
	return r.queueEnd(nil, &lifecycle.Cancelled{Common: r.next(), By: by, Reason: reason})
}

// withdraw marks the question withdrawn because its thread was cancelled,
// and ends the thread cancelled (by and reason from cr) on the thread's
// next dispatch id, as on_expiry cancel does. The caller queues
// question.withdrawn after it.
func withdraw(r *record, cr lifecycle.CancelRequest, via string) error {
	by := cr.By
	if by == "" {
		by = "api"
	}
	by = clip.String(by, MaxAnsweredByBytes)
	reason := clip.String(cr.Reason, MaxReasonBytes)
	r.Status, r.Outcome = statusWithdrawn, outcomeWithdrawn
	r.Detail = "the thread was cancelled by " + by
	if reason != "" {
		r.Detail += ": " + reason
	}
	r.addHistory(attempt{At: time.Now().UTC(), Via: "cancel", AnsweredBy: by, Result: "withdrawn", Reason: r.Detail + " (seen on " + via + ")"})
	return r.endCancelled(by, reason)
}

// cancelThread applies a cancel of r's thread to r and returns the
// question event it queued, if any: a question that joined another is
// withdrawn (the caller then takes it off that one with unjoin); the asking
// thread of a question others joined leaves it, which stays asked for
// them; any other question is withdrawn (docs/router.md, "Ask once").
func (s *Service) cancelThread(r *record, cr lifecycle.CancelRequest, via string) (lifecycle.QuestionEvent, error) {
	switch {
	case r.Left:
		return "", nil
	case r.Status == statusAsked && r.hasJoined():
		return "", leave(r, cr, via)
	}
	if err := withdraw(r, cr, via); err != nil {
		return "", err
	}
	s.settled(r, false)
	return lifecycle.QuestionWithdrawn, r.queueQuestion(lifecycle.QuestionWithdrawn, r.Detail)
}

// advance acts on a question the scanner found due: escalation steps, the
// deadline, events still to publish, what an ended question still owes.
func (s *Service) advance(ctx context.Context, qid string) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	log := s.log.With("question_id", qid)
	defer s.lock(qid)()
	var ev lifecycle.QuestionEvent
	r, changed, err := s.store.update(ctx, qid, func(r *record) (bool, error) {
		ev = ""
		now := time.Now().UTC()
		if r.Status != statusAsked {
			return false, nil
		}
		if due := r.due(); due.IsZero() || now.Before(due) {
			return false, nil
		}
		if !r.Left {
			if cr, ok := s.cancelRequested(ctx, r, nil); ok {
				var err error
				ev, err = s.cancelThread(r, cr, "deadline")
				return true, err
			}
		}
		if r.Deadline != nil && !now.Before(*r.Deadline) {
			ev = lifecycle.QuestionExpired
			return true, s.expire(r, now)
		}
		// Escalation rungs past due; after a long pause only the last
		// counts, so the question moves once.
		var to string
		for r.Step < len(r.Ladder) && !now.Before(r.Ladder[r.Step].At) {
			to = r.Ladder[r.Step].To
			r.Step++
		}
		rt, ok := s.routes.Load().Route(to)
		if !ok {
			log.Warn("escalation target is no longer a route: step skipped", "to", to)
			return true, nil
		}
		if rt.Name == r.Route {
			return true, nil
		}
		ev = lifecycle.QuestionEscalated
		return true, r.moveTo(rt, fmt.Sprintf("escalated from %s: no answer %s after it was asked", r.Route, now.Sub(r.AskedAt).Round(time.Second)))
	})
	if err != nil {
		if !errors.Is(err, errNoQuestion) {
			log.Warn("advance question: will retry", "err", err)
		}
		return
	}
	if changed {
		s.afterChange(ctx, r, ev)
		if ev != "" {
			log.Info("question "+string(ev), "route", r.Route, "detail", r.Detail, "outcome", r.Outcome, "next_dispatch_id", r.NextDispatchID)
		}
	}
	if err := s.flush(ctx, qid); err != nil {
		log.Warn("publish question events: will retry", "err", err)
	}
	if r.owes() {
		if err := s.followUp(ctx, qid); err != nil {
			log.Warn("fan out to joined questions: will retry", "err", err)
		}
	}
}

// expire applies the question's expiry action, to its own thread and
// (through the fan-out) to every thread that joined it.
func (s *Service) expire(r *record, now time.Time) error {
	r.Status = statusExpired
	s.settled(r, false)
	if r.Left {
		// The asking thread ended already; the joined ones take the
		// action each on its own record.
		r.addHistory(attempt{At: now, Via: viaDeadline, Result: "expired", Reason: "on_expiry " + r.OnExpiry + ", for the threads that joined it"})
		return r.queueQuestion(lifecycle.QuestionExpired, "no answer by the deadline; on_expiry "+r.OnExpiry+" applies to each thread that joined it")
	}
	action, _ := parseExpiry(r.OnExpiry)
	if action.Action == "" {
		action.Action = ExpiryFail
	}
	a := attempt{At: now, Via: viaDeadline, Result: "expired", Reason: "on_expiry " + action.String()}
	var detail string
	if action.Action == ExpiryDefault {
		sub := Submission{QuestionID: r.QuestionID, Answer: action.Option, AnsweredBy: DefaultAnsweredBy}
		if r.Kind == lifecycle.QuestionApproval && (action.Option == "approve" || action.Option == "reject") {
			sub.Decision = action.Option
		}
		if why := validate(r, &sub); why != "" {
			detail = fmt.Sprintf("no answer by the deadline; the default option %q cannot answer (%s), so the thread ends failed unanswered", action.Option, why)
			action.Action = ExpiryFail
		} else {
			r.Answer, r.Decision, r.AnsweredBy, r.AnsweredAt = sub.Answer, sub.Decision, DefaultAnsweredBy, &now
			a.AnsweredBy, a.Answer, a.Decision, a.Result = DefaultAnsweredBy, sub.Answer, sub.Decision, "accepted"
			r.addHistory(a)
			r.Detail = fmt.Sprintf("no answer by the deadline; answered with the default option %q", sub.Answer)
			if err := s.resume(r, "answered by "+DefaultAnsweredBy); err != nil {
				return err
			}
			if r.Outcome == outcomeMaxRounds {
				r.Detail += "; the thread ends failed max-rounds"
			}
			return r.queueQuestion(lifecycle.QuestionExpired, r.Detail)
		}
	}
	switch action.Action {
	case ExpiryCancel:
		if detail == "" {
			detail = "no answer by the deadline; the thread ends cancelled"
		}
		r.Outcome = outcomeCancelled
		if err := r.endCancelled(expiryCanceller, fmt.Sprintf("question %s expired unanswered (route %s, on_expiry cancel)", r.QuestionID, r.Origin)); err != nil {
			return err
		}
	default:
		if detail == "" {
			detail = "no answer by the deadline; the thread ends failed unanswered"
		}
		r.NextDispatchID = lifecycle.NewID()
		r.Outcome = outcomeUnanswered
		if err := r.queueEnd(&lifecycle.Failed{Common: r.next(), Reason: lifecycle.ReasonUnanswered,
			Detail: fmt.Sprintf("question %s expired unanswered after %s (route %s)", r.QuestionID, now.Sub(r.AskedAt).Round(time.Second), r.Origin)}, nil); err != nil {
			return err
		}
	}
	r.addHistory(a)
	return r.queueQuestion(lifecycle.QuestionExpired, detail)
}

// onCancelThread withdraws the pending question of a thread cancelled
// while paused (core message agora.control.cancel-thread.<thread_id>).
func (s *Service) onCancelThread(ctx context.Context, m *nats.Msg) {
	thread := strings.TrimPrefix(m.Subject, lifecycle.CancelThreadPrefix)
	if lifecycle.ValidToken(thread) != nil {
		return
	}
	var cr lifecycle.CancelRequest
	if len(m.Data) > 0 {
		if err := json.Unmarshal(m.Data, &cr); err != nil {
			s.log.Warn("cancel-thread message with a bad body: cancelling the thread anyway", "thread_id", thread, "err", err)
		}
	}
	cr.ThreadID = thread
	s.cancelled.add(cr)
	qids := s.idx.thread(thread)
	if cr.DispatchID != "" && lifecycle.ValidToken(cr.DispatchID) == nil {
		if q := lifecycle.QuestionID(cr.DispatchID); !slices.Contains(qids, q) {
			qids = append(qids, q)
		}
	}
	for _, qid := range qids {
		s.withdrawQuestion(ctx, qid, cr, "cancel-thread")
	}
}

// withdrawQuestion withdraws an asked question of the thread cr cancels;
// via names where the cancel was seen.
func (s *Service) withdrawQuestion(ctx context.Context, qid string, cr lifecycle.CancelRequest, via string) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	log := s.log.With("question_id", qid, "thread_id", cr.ThreadID)
	defer s.lock(qid)()
	var ev lifecycle.QuestionEvent
	r, changed, err := s.store.update(ctx, qid, func(r *record) (bool, error) {
		ev = ""
		if (r.Status != statusAsked && r.Status != lifecycle.StatusJoined) || r.Left || r.ThreadID != cr.ThreadID {
			return false, nil
		}
		var err error
		ev, err = s.cancelThread(r, cr, via)
		return true, err
	})
	switch {
	case errors.Is(err, errNoQuestion):
		return // its needs_input finds the cancel in the memo or the record
	case err != nil:
		log.Warn("withdraw question", "err", err)
		return
	}
	if changed {
		s.afterChange(ctx, r, ev)
		if ev == "" {
			log.Info("asking thread left the question; the threads that joined it still wait", "route", r.Route, "waiting_threads", len(r.WaitingThreads), "next_dispatch_id", r.NextDispatchID)
		} else {
			log.Info("question withdrawn", "route", r.Route, "detail", r.Detail, "next_dispatch_id", r.NextDispatchID)
		}
	}
	if err := s.flush(ctx, qid); err != nil {
		log.Warn("publish question events: left for the scanner", "err", err)
	}
	s.afterCancel(ctx, r)
}

// afterCancel does what a cancel of r's thread leaves to do: take a
// joined question off the question it joined, release a withdrawn one's
// match.
func (s *Service) afterCancel(ctx context.Context, r *record) {
	switch {
	case r.Status == statusWithdrawn && r.JoinedTo != "":
		by := "api"
		if n := len(r.History); n > 0 {
			by = r.History[n-1].AnsweredBy
		}
		if err := s.unjoin(ctx, r.JoinedTo, r.QuestionID, by); err != nil {
			s.log.Warn("take the cancelled thread off the question it joined", "question_id", r.QuestionID, "joined_to", r.JoinedTo, "err", err)
		}
	case r.owes():
		if err := s.followUp(ctx, r.QuestionID); err != nil {
			s.log.Warn("release the question's match: left for the scanner", "question_id", r.QuestionID, "err", err)
		}
	}
}

// flush publishes the record's pending events in order, each with its
// fixed id, then removes the published ones from the record.
func (s *Service) flush(ctx context.Context, qid string) error {
	r, _, err := s.store.get(ctx, qid)
	if err != nil {
		return err
	}
	return s.flushRecord(ctx, r)
}

// flushRecord publishes r's pending events. The router passes a record it
// has just written, rather than reading it back: on a cluster a read may
// be served by a replica that has not applied the write yet.
func (s *Service) flushRecord(ctx context.Context, r *record) error {
	return s.flushAt(ctx, r, 0)
}

// flushAt publishes r's pending events — all sent, then all awaited: one
// round trip — and removes the published ones from the record. rev, when
// not 0, is the revision r was written at, so the removal needs no read
// unless somebody wrote the record since.
func (s *Service) flushAt(ctx context.Context, r *record, rev uint64) error {
	qid := r.QuestionID
	if len(r.Pending) == 0 {
		return nil
	}
	type sent struct {
		id   string
		ack  jetstream.PubAckFuture
		span trace.Span
	}
	var (
		done     []string
		inflight []sent
		perr     error
	)
	for _, p := range r.Pending {
		ack, span, err := s.publishAsync(ctx, r, p)
		if err != nil {
			perr = err
			break
		}
		if ack == nil {
			done = append(done, p.ID) // nothing to publish
			continue
		}
		inflight = append(inflight, sent{p.ID, ack, span})
	}
	for _, x := range inflight {
		var err error
		select {
		case <-x.ack.Ok():
			done = append(done, x.id)
		case err = <-x.ack.Err():
			err = fmt.Errorf("router: publish %s: %w", x.id, err)
		case <-ctx.Done():
			err = fmt.Errorf("router: publish %s: %w", x.id, ctx.Err())
		}
		telemetry.End(x.span, err)
		perr = errors.Join(perr, err)
	}
	if len(done) > 0 {
		known := r
		if rev == 0 {
			known = nil
		}
		_, _, _, err := s.store.updateFrom(ctx, qid, known, rev, func(r *record) (bool, error) {
			n := len(r.Pending)
			r.Pending = slices.DeleteFunc(r.Pending, func(p pending) bool { return slices.Contains(done, p.ID) })
			return len(r.Pending) != n, nil
		})
		perr = errors.Join(perr, err)
	}
	return perr
}

// publishAsync sends one pending event without waiting for its
// acknowledgement; a nil future means there is nothing to publish. The
// span ends when the caller has the acknowledgement.
func (s *Service) publishAsync(ctx context.Context, r *record, p pending) (jetstream.PubAckFuture, trace.Span, error) {
	d, err := p.data(r)
	if err != nil || d == nil {
		return nil, nil, err
	}
	_, span, opt := s.publishSpan(ctx, r, p)
	e, err := lifecycle.New(s.source, d, opt)
	if err != nil {
		telemetry.End(span, err)
		return nil, nil, fmt.Errorf("router: build %s: %w", p.ID, err)
	}
	e.SetID(p.ID)
	msg, err := lifecycle.Encode(p.Subject, e)
	if err != nil {
		telemetry.End(span, err)
		return nil, nil, err
	}
	ack, err := s.js.PublishMsgAsync(msg)
	if err != nil {
		telemetry.End(span, err)
		return nil, nil, fmt.Errorf("router: publish %s on %s: %w", p.ID, p.Subject, err)
	}
	return ack, span, nil
}
