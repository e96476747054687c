package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/agora-dispatch/agora/internal/problem"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/agora-dispatch/agora/internal/logging"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// problem turns an error into the Problem a synchronous door answers: a
// refusal as it is, anything else as a 503 (logged; its text stays here).
func (s *Service) problem(err error) *client.Problem {
	p, temporary := problemOf(err)
	if temporary {
		s.log.Warn("request failed: temporary failure", "err", err)
	}
	return p
}

// problemOf is problem without the log line: it also reports whether err
// was a temporary failure (a 503) rather than a refusal.
func problemOf(err error) (*client.Problem, bool) {
	var p *client.Problem
	if errors.As(err, &p) {
		return p, false
	}
	p = &client.Problem{Type: client.ProblemUnavailable, Title: "Service unavailable", Status: http.StatusServiceUnavailable,
		Detail: "a temporary failure"}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) {
		p.Detail += " (" + storeSilent + ")"
	}
	var ie *idError
	if errors.As(err, &ie) {
		// The record may exist: the retry must carry this id.
		p.DispatchID = ie.id
		p.Detail += " after the dispatch was recorded; retry with dispatch_id " + ie.id + " to complete this same dispatch"
	} else {
		p.Detail += "; retry the request (a dispatch_id makes a retried dispatch safe)"
	}
	return p, true
}

// storeSilent says why a write timed out: JetStream answers no write to a
// stream that failed one (a full disk, docs/chaos.md "A full store") nor
// to one without a leader, so the dispatcher can tell only that it had no
// answer.
const storeSilent = "JetStream did not confirm a write in time: a store whose disk is full, or a stream with no leader, answers none; the operator checks the NATS server's store and log"

// requestLog is the logger of one dispatch request on a synchronous door:
// its dispatch id and the trace and span ids of its traceparent.
func (s *Service) requestLog(door string, req lifecycle.Request, traceparent string) *slog.Logger {
	return s.log.With("door", door, "dispatch_id", req.DispatchID, "subagent", req.Subagent).With(logging.Trace(traceparent)...)
}

// refusal logs why a synchronous door did not accept a request and
// returns the Problem it answers: a conflict (docs/dispatcher.md) at info,
// a temporary failure as a warning; an invalid request is the client's to
// read and is not logged.
func refusal(log *slog.Logger, err error) *client.Problem {
	p, temporary := problemOf(err)
	switch {
	case temporary:
		log.Warn("request failed: temporary failure", "err", err)
	case p.Status == http.StatusConflict:
		log.Info("request refused: its dispatch_id belongs to a different request", "detail", p.Detail)
	}
	return p
}

// The micro handlers answer through the Request before they return (each
// runs on a lane of its own, startMicro): micro's stats then time the
// whole handling and count every error reply (docs/dispatcher.md).

// microError answers a micro request with the micro error headers (code =
// the HTTP status, description = title and detail) and the Problem as body.
func (s *Service) microError(r micro.Request, err error) {
	p := s.problem(err)
	if r.Reply() == "" {
		return
	}
	hdr, data := problem.MicroReply(p)
	desc := hdr.Get(micro.ErrorHeader)
	if desc == "" {
		desc = http.StatusText(p.Status)
	}
	if err := r.Error(hdr.Get(micro.ErrorCodeHeader), desc, data, micro.WithHeaders(micro.Headers(hdr))); err != nil {
		s.log.Warn("micro: respond", "subject", r.Subject(), "err", err)
	}
}

func (s *Service) microRespond(r micro.Request, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		s.microError(r, fmt.Errorf("dispatcher: encode reply: %w", err))
		return
	}
	if r.Reply() == "" {
		return
	}
	if err := r.Respond(data, micro.WithHeaders(micro.Headers{"Content-Type": []string{"application/json"}})); err != nil {
		s.log.Warn("micro: respond", "subject", r.Subject(), "err", err)
	}
}

func microTraceparent(r micro.Request) string {
	h := r.Headers()
	for _, k := range []string{lifecycle.TraceparentExtension, "Traceparent", "ce-traceparent"} {
		if v := h.Get(k); v != "" {
			return v
		}
	}
	return ""
}

// microDispatch serves agora.api.dispatch: a lifecycle.Request in, the
// dispatch record out.
func (s *Service) microDispatch(ctx context.Context, r micro.Request) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	b, err := s.bind(ctx)
	if err != nil {
		s.metrics.request(doorMicro, resultError, start)
		s.microError(r, err)
		return
	}
	req, p := decodeRequest(r.Data())
	if p != nil {
		s.metrics.request(doorMicro, resultRejected, start)
		s.microError(r, p)
		return
	}
	who := r.Headers().Get(lifecycle.PrincipalHeader)
	if who != "" && (len(who) > 64 || lifecycle.ValidToken(who) != nil) {
		s.metrics.request(doorMicro, resultRejected, start)
		s.microError(r, problem.Invalid(client.FieldError{Field: lifecycle.PrincipalHeader, Message: fmt.Sprintf("%q is not a principal name: 1-64 letters, digits, '-' or '_'", short(who))}))
		return
	}
	if p := s.natsCaller(r.Subject()); p != nil {
		var refused *client.Problem
		switch {
		case who != "" && who != p.Name && !p.Admin:
			refused = &client.Problem{Type: client.ProblemForbidden, Title: "Forbidden", Status: http.StatusForbidden,
				Detail: fmt.Sprintf("NATS user %s may not dispatch on behalf of %s (%s): only an admin principal or a trusted user on %s may", p.Name, short(who), lifecycle.PrincipalHeader, lifecycle.APIDispatch)}
		default:
			refused = mayDispatch(p, req.Subagent)
		}
		if refused != nil {
			s.metrics.request(doorMicro, resultRejected, start)
			s.microError(r, refused)
			return
		}
		if who == "" {
			who = p.Name
		}
	}
	tp := microTraceparent(r)
	rec, result, err := s.accept(ctx, b, req, len(r.Data()), tp, doorMicro, who)
	s.metrics.request(doorMicro, result, start)
	if err != nil {
		s.microError(r, refusal(s.requestLog(doorMicro, req, tp), err))
		return
	}
	s.microRespond(r, rec)
}

// decodeTarget reads a cancel or status body: exactly one of dispatch_id
// and thread_id.
func decodeTarget(data []byte) (lifecycle.CancelRequest, error) {
	var req lifecycle.CancelRequest
	if err := json.Unmarshal(data, &req); err != nil {
		return req, problem.Invalid(client.FieldError{Field: "request", Message: "must be a JSON object with dispatch_id or thread_id: " + err.Error()})
	}
	if (req.DispatchID == "") == (req.ThreadID == "") {
		return req, problem.Invalid(client.FieldError{Field: "dispatch_id", Message: "set exactly one of dispatch_id and thread_id"})
	}
	return req, nil
}

// microCancel serves agora.api.cancel: {"dispatch_id"|"thread_id", "by",
// "reason"} in, the record (or the thread) out.
func (s *Service) microCancel(ctx context.Context, r micro.Request) {
	s.microTarget(ctx, r, true, func(ctx context.Context, b *bindings, req lifecycle.CancelRequest) (any, error) {
		if req.ThreadID != "" {
			return s.cancelThread(ctx, b, req.ThreadID, req.By, req.Reason)
		}
		return s.cancelDispatch(ctx, b, req.DispatchID, req.By, req.Reason)
	})
}

// microStatus serves agora.api.status: {"dispatch_id"} in, the record out;
// or {"thread_id"} in, the thread out.
func (s *Service) microStatus(ctx context.Context, r micro.Request) {
	s.microTarget(ctx, r, false, func(ctx context.Context, b *bindings, req lifecycle.CancelRequest) (any, error) {
		if req.ThreadID != "" {
			return s.thread(ctx, b, req.ThreadID)
		}
		return s.status(ctx, b, req.DispatchID)
	})
}

// microTarget serves a request about one dispatch or one thread (cancel,
// status): it binds, decodes the target (decodeTarget), checks that a
// caller on its own subject may see it (and, with cancel, cancel it),
// calls f within opTimeout and answers with what f returns or its error.
func (s *Service) microTarget(ctx context.Context, r micro.Request, cancelling bool, f func(context.Context, *bindings, lifecycle.CancelRequest) (any, error)) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	b, err := s.bind(ctx)
	if err != nil {
		s.microError(r, err)
		return
	}
	req, err := decodeTarget(r.Data())
	if err != nil {
		s.microError(r, err)
		return
	}
	if p := s.natsCaller(r.Subject()); p != nil {
		if req.ThreadID != "" {
			err = s.allowThread(ctx, b, p, "thread", req.ThreadID, req.ThreadID, cancelling)
		} else {
			err = s.allowDispatch(ctx, b, p, req.DispatchID, cancelling)
		}
		if err != nil {
			s.microError(r, err)
			return
		}
	}
	v, err := f(ctx, b, req)
	if err != nil {
		s.microError(r, err)
		return
	}
	s.microRespond(r, v)
}
