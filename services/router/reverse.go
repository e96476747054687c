package router

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/agora-dispatch/agora/internal/clip"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// A person reverses an accepted suggestion (docs/answering.md, "Reversing
// an accepted suggestion") through agora.api.reverse.<route>, while the
// thread has not gone on: the dispatch the suggestion resumed has no
// terminal event yet — it has not finished, failed, asked a new question
// or been cancelled. The router then ends that dispatch cancelled (its one
// terminal event, published with the terminal id, so a run that ends at
// the same moment wins or loses cleanly), signals its worker, and rewrites
// the answer with a compare-and-set that picks the thread's next dispatch
// anew and queues its re-dispatch and question.reversed.

// viaReverse is the history's via of a reversal.
const viaReverse = "reverse"

// reverseReasonPrefix starts the reason of the cancel a reversal makes;
// a retried reversal that finds its own cancel goes on from there.
const reverseReasonPrefix = "reversed: the person's answer replaces the accepted suggestion of question "

// microReverse serves agora.api.reverse.<route>.
func (s *Service) microReverse(ctx context.Context, req micro.Request) {
	route, ok := strings.CutPrefix(req.Subject(), "agora.api.reverse.")
	if !ok || lifecycle.ValidToken(route) != nil {
		s.respondProblem(req, problemInvalid("not a reverse endpoint: "+clip.String(req.Subject(), 128)))
		return
	}
	var in client.ReverseRequest
	if p := decodeStrict(req.Data(), &in, "a reversal has question_id, answer, decision, comment and reversed_by"); p != nil {
		s.respondProblem(req, p)
		return
	}
	rep, p := s.reverse(ctx, route, req.Subject(), in)
	if p != nil {
		s.respondProblem(req, p)
		return
	}
	s.respondJSON(req, rep)
}

func problemInvalid(detail string) *client.Problem {
	return &client.Problem{Type: client.ProblemInvalidRequest, Title: "Invalid request", Status: 422, Detail: detail}
}

func problemTooLate(detail string) *client.Problem {
	return &client.Problem{Type: client.ProblemConflict, Title: "Too late", Status: 409, Detail: detail}
}

// reverse reverses the accepted suggestion of question in.QuestionID on
// route, or says why not.
func (s *Service) reverse(ctx context.Context, route, subject string, in client.ReverseRequest) (client.ReverseReply, *client.Problem) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	qid := in.QuestionID
	if err := lifecycle.ValidToken(qid); err != nil {
		return client.ReverseReply{}, problemInvalid("question_id: " + err.Error())
	}
	by := strings.TrimSpace(in.ReversedBy)
	if why := reverserRefused(by); why != "" {
		return client.ReverseReply{}, problemInvalid(why)
	}
	log := s.log.With("question_id", qid, "route", route, "reversed_by", by)
	defer s.lock(qid)()

	r, rev, err := s.store.get(ctx, qid)
	switch {
	case errors.Is(err, errNoQuestion):
		return client.ReverseReply{}, notOnRoute(qid, route)
	case err != nil:
		log.Warn("reverse: read question", "err", err)
		return client.ReverseReply{}, unavailable("the question could not be read; try again")
	case r.Route != route:
		// A route's door learns nothing of another route's question.
		return client.ReverseReply{}, notOnRoute(qid, route)
	}
	if why := notReversible(r); why != "" {
		return client.ReverseReply{}, problemInvalid(why)
	}
	sub := Submission{QuestionID: qid, Route: route, Answer: in.Answer, Decision: in.Decision, AnsweredBy: by, Comment: clip.String(in.Comment, MaxCommentBytes)}
	if why := validate(r, &sub); why != "" {
		return client.ReverseReply{}, problemInvalid(why)
	}
	old := r.NextDispatchID
	if p := s.cancelResumed(ctx, r, by); p != nil {
		log.Info("reversal refused", "reason", p.Detail)
		return client.ReverseReply{}, p
	}
	var reason string
	r, rev, _, err = s.store.updateFrom(ctx, qid, r, rev, func(r *record) (bool, error) {
		if r.Reversal != nil || r.NextDispatchID != old {
			reason = "the question changed meanwhile: reversed already, or answered anew"
			return false, nil
		}
		return true, s.applyReversal(r, sub, subject)
	})
	switch {
	case err != nil:
		log.Warn("reverse: record the reversal", "err", err)
		return client.ReverseReply{}, unavailable("the resumed dispatch " + old + " is cancelled but the reversal could not be recorded; send it again")
	case reason != "":
		return client.ReverseReply{}, problemTooLate(reason)
	}
	if err := s.flushAt(ctx, r, rev); err != nil {
		log.Warn("publish the reversal: left for the scanner", "err", err)
	}
	if r.Memorize {
		s.goFollowUp(qid)
	}
	log.Info("accepted suggestion reversed", "cancelled_dispatch_id", old, "next_dispatch_id", r.NextDispatchID)
	return client.ReverseReply{QuestionID: qid, CancelledDispatchID: old, NextDispatchID: r.NextDispatchID}, nil
}

func notOnRoute(qid, route string) *client.Problem {
	return &client.Problem{Type: client.ProblemNotFound, Title: "Not found", Status: 404, Detail: "no question " + qid + " on route " + route}
}

// reverserRefused says why by cannot be the person reversing, or "".
func reverserRefused(by string) string {
	switch {
	case by == "":
		return "reversed_by: name the person reversing the suggestion"
	case len(by) > MaxAnsweredByBytes:
		return fmt.Sprintf("reversed_by: longer than %d bytes", MaxAnsweredByBytes)
	case strings.HasPrefix(by, suggestedAnsweredBy), strings.HasPrefix(by, "memory:"), strings.HasPrefix(by, "agora:"):
		return "reversed_by: " + clip.String(by, 64) + " names Agora or an answerer, not a person"
	}
	return ""
}

// notReversible says why r has no suggestion a person may reverse, or "".
func notReversible(r *record) string {
	sg := r.Suggestion
	switch {
	case r.Reversal != nil:
		return fmt.Sprintf("question %s was reversed already, by %s at %s", r.QuestionID, r.Reversal.By, r.Reversal.At.Format(time.RFC3339))
	case r.Status != statusAnswered || sg == nil || !sg.Accepted || !strings.HasPrefix(r.AnsweredBy, suggestedAnsweredBy):
		return fmt.Sprintf("question %s was not answered by an accepted suggestion: nothing to reverse", r.QuestionID)
	case r.Outcome != outcomeRedispatched || r.NextDispatchID == "":
		return fmt.Sprintf("question %s did not resume its thread (%s): nothing to reverse", r.QuestionID, r.Outcome)
	case len(r.WaitingThreads) > 1:
		return fmt.Sprintf("the suggestion answered %d threads that asked the same question: a reversal changes one thread only, so it is refused", len(r.WaitingThreads))
	}
	return ""
}

// cancelResumed ends the dispatch r's suggestion resumed with a cancelled
// event, unless it has a terminal event already: the thread went on, and
// the reversal is refused (409). A cancel this reversal made before (a
// retry after a failure) counts as its own.
func (s *Service) cancelResumed(ctx context.Context, r *record, by string) *client.Problem {
	old := r.NextDispatchID
	ownReason := reverseReasonPrefix + r.QuestionID
	switch end, err := s.terminal(ctx, r.ThreadID, old); {
	case err != nil:
		s.log.Warn("reverse: read the resumed dispatch", "dispatch_id", old, "err", err)
		return unavailable("the resumed dispatch's state could not be read; try again")
	case end != nil:
		if c, ok := end.(*lifecycle.Cancelled); ok && strings.HasPrefix(c.Reason, ownReason) {
			return nil
		}
		return problemTooLate(tooLate(old, end))
	}
	c := &lifecycle.Cancelled{Common: r.next(), By: by, Reason: clip.String(ownReason+" (answered by "+r.AnsweredBy+")", MaxReasonBytes)}
	c.DispatchID = old
	_, msg, err := lifecycle.Message(s.source, c)
	if err != nil {
		return unavailable("the cancel could not be built: " + err.Error())
	}
	ack, err := s.js.PublishMsg(ctx, msg, jetstream.WithExpectStream(lifecycle.StreamLifecycle))
	if err != nil {
		s.log.Warn("reverse: cancel the resumed dispatch", "dispatch_id", old, "err", err)
		return unavailable("the resumed dispatch could not be cancelled; try again")
	}
	if ack.Duplicate {
		// Its run ended first, this instant.
		end, _ := s.terminal(ctx, r.ThreadID, old)
		return problemTooLate(tooLate(old, end))
	}
	// Stop a run in progress; a queued one finds its cancel and never runs.
	if subj, err := lifecycle.CancelSubject(old); err == nil {
		data, _ := json.Marshal(lifecycle.CancelRequest{DispatchID: old, ThreadID: r.ThreadID, By: by, Reason: c.Reason})
		if err := s.nc.Publish(subj, data); err != nil {
			s.log.Warn("reverse: signal the worker", "dispatch_id", old, "err", err)
		}
	}
	return nil
}

// tooLate is the refusal of a reversal whose resumed dispatch ended with
// end (nil: unknown).
func tooLate(id string, end lifecycle.Lifecycle) string {
	what := "ended"
	switch end.(type) {
	case *lifecycle.Finished:
		what = "finished"
	case *lifecycle.NeedsInput:
		what = "asked a new question"
	case *lifecycle.Failed:
		what = "failed"
	case *lifecycle.Cancelled:
		what = "was cancelled"
	}
	return "too late to reverse: the thread went on with the suggestion — the resumed dispatch " + id + " " + what + ". Answer its next question, or cancel the thread"
}

// terminal returns the terminal event of dispatch id, nil when it has none.
func (s *Service) terminal(ctx context.Context, threadID, id string) (lifecycle.Lifecycle, error) {
	st, err := s.js.Stream(ctx, lifecycle.StreamLifecycle)
	if err != nil {
		return nil, fmt.Errorf("router: lifecycle stream: %w", err)
	}
	for _, k := range []lifecycle.Kind{lifecycle.KindFinished, lifecycle.KindNeedsInput, lifecycle.KindFailed, lifecycle.KindCancelled} {
		subj, err := lifecycle.LifecycleSubject(k, threadID, id)
		if err != nil {
			return nil, err
		}
		m, err := st.GetLastMsgForSubject(ctx, subj)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("router: read %s: %w", subj, err)
		}
		e, err := lifecycle.Decode(m.Header, m.Data)
		if err != nil {
			return nil, err
		}
		d, err := lifecycle.Parse(e)
		if err != nil {
			return nil, err
		}
		if l, ok := d.(lifecycle.Lifecycle); ok {
			return l, nil
		}
	}
	return nil, nil
}

// applyReversal writes the person's answer sub over the accepted
// suggestion on r, picks the thread's next dispatch and queues its
// re-dispatch and question.reversed.
func (s *Service) applyReversal(r *record, sub Submission, subject string) error {
	now := time.Now().UTC()
	sg := r.Suggestion
	rv := &lifecycle.Reversal{By: sub.AnsweredBy, At: now, SuggestionBy: sg.By, SuggestionAnswer: clip.String(sg.Answer, 256), CancelledDispatchID: r.NextDispatchID}
	r.Answer, r.Decision, r.AnsweredBy, r.Comment, r.AnsweredAt = sub.Answer, sub.Decision, sub.AnsweredBy, sub.Comment, &now
	if err := s.resume(r, "answered by "+sub.AnsweredBy+", reversing the suggestion of "+sg.By); err != nil {
		return err
	}
	// The first resume went out under the question's id: this one needs
	// an id of its own, or the stream would drop it as a duplicate.
	if n := len(r.Pending); n > 0 && r.Pending[n-1].Resume {
		r.Pending[n-1].ID = r.QuestionID + ".reversal"
	}
	rv.NextDispatchID = r.NextDispatchID
	r.Reversal = rv
	detail := fmt.Sprintf("%s reversed the suggestion of %s (%q); dispatch %s cancelled, the thread resumes as %s with the person's answer",
		rv.By, rv.SuggestionBy, rv.SuggestionAnswer, rv.CancelledDispatchID, rv.NextDispatchID)
	r.addHistory(attempt{At: now, Via: viaReverse, Door: subject, Route: r.Route, AnsweredBy: sub.AnsweredBy,
		Answer: clip.String(sub.Answer, 256), Decision: sub.Decision, Result: "reversed", Reason: detail})
	if rt, ok := s.routes.Load().Route(r.Origin); ok && r.MatchKey != "" && remembers(rt, r.Kind) {
		r.Memorize = true // the remembered decision becomes the person's
	}
	return r.queueQuestion(lifecycle.QuestionReversed, detail)
}
