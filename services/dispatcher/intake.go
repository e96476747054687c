package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/agora-dispatch/agora/internal/jserr"
	"github.com/agora-dispatch/agora/internal/problem"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/clip"
	"github.com/agora-dispatch/agora/internal/logging"
	"github.com/agora-dispatch/agora/internal/resume"
	"github.com/agora-dispatch/agora/internal/telemetry"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// maxDetail bounds the detail of a failed rejected event.
const maxDetail = 2048

// handleIntake handles one message of the AGORA_REQUESTS stream door.
func (s *Service) handleIntake(ctx context.Context, b *bindings, m jetstream.Msg) {
	start := time.Now()
	log := s.log.With("door", doorStream, "subject", m.Subject())
	v, result := s.intake(ctx, b, m, log)
	if result != "" {
		s.metrics.request(doorStream, result, start)
	}
	s.settle(m, v, log)
}

// intake decides what becomes of a request message: accepted (ack),
// refused with a failed rejected event (ack), unreportable (term) or
// temporarily impossible (nak with delay).
func (s *Service) intake(ctx context.Context, b *bindings, m jetstream.Msg, log *slog.Logger) (verdict, string) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	md, err := m.Metadata()
	if err != nil {
		log.Error("request message without metadata terminated", "err", err)
		return term("no metadata"), ""
	}
	r := rejection{}
	r.subagent, _ = lifecycle.ParseRequestSubject(m.Subject())
	e, err := lifecycle.DecodeMsg(m)
	if err != nil {
		r.dispatchID = lifecycle.DerivedID(md.Timestamp, lifecycle.StreamRequests, strconv.FormatUint(md.Sequence.Stream, 10))
		r.derived = r.dispatchID
		r.detail = "the message is not a CloudEvent (send ce-* headers, or a structured application/cloudevents+json body): " + err.Error()
		return s.reject(ctx, b, r, log), resultRejected
	}
	r.traceparent = lifecycle.Traceparent(e)
	log = log.With(logging.Trace(r.traceparent)...)
	// A request without a dispatch id gets one derived from the event's
	// identity, so a redelivery or a republished event maps to the same
	// dispatch.
	derived := lifecycle.DerivedID(eventTime(e, md.Timestamp), e.Source(), e.ID())
	r.dispatchID, r.derived = derived, derived
	if e.Type() != lifecycle.TypeRequested {
		r.detail = fmt.Sprintf("event type %q: want %s", e.Type(), lifecycle.TypeRequested)
		return s.reject(ctx, b, r, log), resultRejected
	}
	req, p := decodeRequest(e.Data())
	if p == nil && req.Subagent != "" && r.subagent != "" && req.Subagent != r.subagent {
		p = problem.Invalid(client.FieldError{Field: "subagent", Message: fmt.Sprintf("%q does not match the subject's sub-agent %q", short(req.Subagent), r.subagent)})
	}
	if p != nil {
		r.from(req, false)
		r.detail = p.Detail
		return s.reject(ctx, b, r, log), resultRejected
	}
	if req.Subagent == "" {
		req.Subagent = r.subagent
	}
	if req.DispatchID == "" {
		req.DispatchID = derived
	}
	rec, result, err := s.accept(ctx, b, req, len(e.Data()), r.traceparent, doorStream, "")
	var ce *conflictError
	if errors.As(err, &ce) {
		// The id belongs to another dispatch, which has (or will have)
		// its own terminal event: a failed event here would be a second
		// one. The request is dropped, logged and counted.
		log.Warn("request dropped: its dispatch_id belongs to a different request", "dispatch_id", req.DispatchID, "detail", ce.p.Detail)
		return ack, resultConflict
	}
	if errors.As(err, &p) {
		r.from(req, req.Round > 0 && isResume(ctx, b, req))
		r.detail = p.Detail
		return s.reject(ctx, b, r, log), resultRejected
	}
	if err != nil {
		log.Warn("request not accepted yet: temporary failure, redelivering", "dispatch_id", req.DispatchID, "err", err)
		return retryLate, resultError
	}
	log.Debug("request handled", "dispatch_id", rec.DispatchID, "thread_id", rec.ThreadID, "result", result)
	return ack, result
}

// rejection is what a failed rejected event says about a refused request.
type rejection struct {
	subagent    string
	dispatchID  string
	derived     string // the id derived from the message, when the request's own cannot be used
	threadID    string
	parentID    string
	round       int
	traceparent string
	detail      string
}

// from takes the ids of a refused request where they are usable. A later
// round's thread, parent and round only when the request is its
// question's resume (isResume): a request that is not cannot put an event
// in a thread that is not its own (docs/security.md, "A resume only the
// router can make").
func (r *rejection) from(req lifecycle.Request, resume bool) {
	if r.subagent == "" && lifecycle.ValidToken(req.Subagent) == nil {
		r.subagent = req.Subagent
	}
	if idRE.MatchString(req.DispatchID) {
		r.dispatchID = req.DispatchID
	}
	if resume && idRE.MatchString(req.ThreadID) {
		r.threadID, r.round = req.ThreadID, req.Round
		if idRE.MatchString(req.ParentID) {
			r.parentID = req.ParentID
		}
	}
}

// isResume reports whether a later round's request is the resume its
// answered question record makes (a router's re-dispatch that the
// definition refuses, say), as far as its ids go.
func isResume(ctx context.Context, b *bindings, req lifecycle.Request) bool {
	r, err := resumeRecord(ctx, b, &req)
	return err == nil && resume.Check(r, &req) == nil
}

// reject emits failed rejected for a refused stream request, so whoever
// sent it sees why on the lifecycle stream. A request that cannot be named
// (no valid sub-agent) is logged and terminated. The event is stored only
// while the dispatch id it names has no event at all: a request naming
// another dispatch's id — running, or about to be — is reported under the
// id derived from its message instead, in a thread of its own, so no
// request can end or mark a dispatch that is not its own.
func (s *Service) reject(ctx context.Context, b *bindings, r rejection, log *slog.Logger) verdict {
	detail := clip.String(r.detail, maxDetail)
	if r.subagent == "" {
		log.Error("refused request cannot be reported (no valid sub-agent name): terminated", "detail", detail)
		return term("refused: " + clip.String(detail, 200))
	}
	if r.threadID == "" {
		r.threadID = r.dispatchID
	}
	tp := r.traceparent
	if !lifecycle.ValidTraceparent(tp) {
		tp = lifecycle.NewTraceparent()
	}
	d := &lifecycle.Failed{
		Common: lifecycle.Common{DispatchID: r.dispatchID, ThreadID: r.threadID, ParentID: r.parentID, Round: r.round, Subagent: r.subagent},
		Reason: lifecycle.ReasonRejected, Detail: detail,
	}
	taken, err := s.emitFirst(ctx, b, d, tp)
	if taken && r.derived != "" && r.derived != r.dispatchID {
		log.Warn("refused request names another dispatch's id: reported under its own", "named", r.dispatchID, "dispatch_id", r.derived)
		d.Common = lifecycle.Common{DispatchID: r.derived, ThreadID: r.derived, Subagent: r.subagent}
		d.Detail = clip.String(fmt.Sprintf("dispatch_id %s is another dispatch's: %s", r.dispatchID, r.detail), maxDetail)
		r.dispatchID, r.threadID = r.derived, r.derived
		taken, err = s.emitFirst(ctx, b, d, tp)
	}
	switch {
	case errors.Is(err, lifecycle.ErrInvalid), errors.Is(err, lifecycle.ErrBadToken), errors.Is(err, lifecycle.ErrBadSubject):
		log.Error("refused request cannot be reported: terminated", "detail", detail, "err", err)
		return term("refused: " + clip.String(detail, 200))
	case err != nil:
		log.Warn("cannot report refused request yet: redelivering", "dispatch_id", r.dispatchID, "err", err)
		return retryLate
	case taken:
		log.Warn("refused request not reported: its dispatch id already has events", "dispatch_id", r.dispatchID, "detail", detail)
		return ack
	}
	log.Info("request refused", "dispatch_id", r.dispatchID, "thread_id", r.threadID, "subagent", r.subagent, "detail", detail)
	return ack
}

// emitFirst publishes d only while its dispatch has no lifecycle event
// (Nats-Expected-Last-Subject-Sequence 0 on every subject of the dispatch
// id); taken reports that it has some, and nothing was stored. A
// duplicate of d itself (a redelivered request reported already) is not
// taken.
func (s *Service) emitFirst(ctx context.Context, b *bindings, d lifecycle.Lifecycle, traceparent string) (taken bool, err error) {
	e, msg, err := lifecycle.Message(s.source, d, telemetry.Event(ctx, traceparent))
	if err != nil {
		return false, fmt.Errorf("dispatcher: build event: %w", err)
	}
	msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, "0")
	msg.Header.Set("Nats-Expected-Last-Subject-Sequence-Subject", lifecycle.LifecycleFilter("", "", d.Base().DispatchID))
	_, err = b.js.PublishMsg(ctx, msg, jetstream.WithExpectStream(lifecycle.StreamLifecycle))
	if jserr.WrongLastSequence(err) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("dispatcher: publish %s: %w", e.ID(), err)
	}
	return false, nil
}

// eventTime is the event's own time when it is plausible, else fallback.
func eventTime(e lifecycle.Event, fallback time.Time) time.Time {
	t := e.Time()
	if t.Before(time.Unix(0, 0)) || t.Year() > 9999 {
		return fallback
	}
	return t
}
