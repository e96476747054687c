package router

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agora-dispatch/agora/internal/problem"

	"github.com/nats-io/nats.go/micro"

	"github.com/agora-dispatch/agora/internal/clip"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// microQuestions serves agora.api.questions: a page of the waiting
// questions from the index, oldest first (docs/wire.md, "Core subjects
// and micro services"), and agora.api.questions.<route>, the same for one route's
// questions only (docs/security.md, "What answerers read"). Only the
// page's records are read; question_id reads that one record.
func (s *Service) microQuestions(ctx context.Context, req micro.Request) {
	in, p := decodeWaiting(req.Data())
	if p != nil {
		s.respondProblem(req, p)
		return
	}
	if route, err := lifecycle.ParseAPIQuestionsRoute(req.Subject()); err == nil {
		// One route's endpoint: its questions only, whatever is asked.
		if in.Route != "" && in.Route != route {
			s.respondProblem(req, problem.Invalid(client.FieldError{Field: "route",
				Message: fmt.Sprintf("%s serves route %s only, not %s", req.Subject(), route, in.Route)}))
			return
		}
		in.Route = route
	}
	if in.QuestionID != "" {
		page, p := s.waitingOne(ctx, in)
		s.respondWaiting(req, page, p)
		return
	}
	var after *askedKey
	if in.Cursor != "" {
		k, ok := parseWaitingCursor(in.Cursor)
		if !ok {
			s.respondProblem(req, problem.Invalid(client.FieldError{Field: "cursor", Message: "not a cursor the router gave"}))
			return
		}
		after = &k
	}
	var keep func(askedRef) bool
	if in.Route != "" || in.ThreadID != "" || in.DispatchID != "" || in.Subagent != "" {
		keep = func(r askedRef) bool {
			return (in.Route == "" || r.route == in.Route) && r.has(in.ThreadID, in.DispatchID) && (in.Subagent == "" || r.subagent == in.Subagent)
		}
	}
	keys, total, more := s.idx.waiting(after, in.Limit, keep)
	qs, err := s.readWaiting(ctx, keys)
	if err != nil {
		s.log.Warn("waiting questions: read records", "err", err)
		s.respondProblem(req, &client.Problem{Type: client.ProblemUnavailable, Title: "Unavailable", Status: 503,
			Detail: "the question records could not be read; try again"})
		return
	}
	page := client.WaitingPage{Questions: qs, Count: total}
	if more {
		page.NextCursor = waitingCursor(keys[len(keys)-1])
	}
	s.respondWaiting(req, page, nil)
}

// waitingOne is the page of one question, in.QuestionID: it when its
// record says it waits (on in.Route, when set), or nothing.
func (s *Service) waitingOne(ctx context.Context, in client.WaitingRequest) (client.WaitingPage, *client.Problem) {
	page := client.WaitingPage{Questions: []lifecycle.Question{}}
	if lifecycle.ValidToken(in.QuestionID) != nil {
		return page, problem.Invalid(client.FieldError{Field: "question_id", Message: "not a question id"})
	}
	r, _, err := s.store.get(ctx, in.QuestionID)
	switch {
	case errors.Is(err, errNoQuestion):
		return page, nil
	case err != nil:
		s.log.Warn("waiting question: read record", "question_id", in.QuestionID, "err", err)
		return page, &client.Problem{Type: client.ProblemUnavailable, Title: "Unavailable", Status: 503,
			Detail: "the question record could not be read; try again"}
	}
	if r.Status == statusAsked && (in.Route == "" || r.Route == in.Route) {
		page.Questions, page.Count = append(page.Questions, r.Question), 1
	}
	return page, nil
}

// respondWaiting answers a page request with page, or p.
func (s *Service) respondWaiting(req micro.Request, page client.WaitingPage, p *client.Problem) {
	if p != nil {
		s.respondProblem(req, p)
		return
	}
	data, err := json.Marshal(page)
	if err != nil {
		s.respondProblem(req, &client.Problem{Title: "Internal error", Status: 500, Detail: err.Error()})
		return
	}
	if err := req.Respond(data, micro.WithHeaders(micro.Headers{"Content-Type": []string{"application/json"}})); err != nil {
		s.log.Warn("micro: respond", "err", err)
	}
}

// readWaiting reads the records of keys, a few at a time, in their order;
// a record that is no longer asked (answered meanwhile) is left out.
func (s *Service) readWaiting(ctx context.Context, keys []askedKey) ([]lifecycle.Question, error) {
	recs := make([]*record, len(keys))
	errs := make([]error, len(keys))
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for i, k := range keys {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			recs[i], _, errs[i] = s.store.get(ctx, k.qid)
		})
	}
	wg.Wait()
	qs := make([]lifecycle.Question, 0, len(keys))
	for i, r := range recs {
		switch {
		case errors.Is(errs[i], errNoQuestion):
			continue // removed meanwhile
		case errs[i] != nil:
			return nil, errs[i]
		case r.Status == statusAsked:
			qs = append(qs, r.Question)
		}
	}
	return qs, nil
}

// decodeWaiting reads a page request strictly; an empty body asks for
// the first page of every waiting question.
func decodeWaiting(data []byte) (client.WaitingRequest, *client.Problem) {
	var in client.WaitingRequest
	if len(bytes.TrimSpace(data)) > 0 {
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&in); err != nil {
			if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
				return in, problem.Invalid(client.FieldError{Field: strings.Trim(name, `"`),
					Message: "unknown field: a page request has route, thread_id, dispatch_id, subagent, question_id, limit and cursor"})
			}
			return in, problem.Invalid(client.FieldError{Field: "body", Message: "not a JSON page request: " + clip.String(err.Error(), 200)})
		}
	}
	switch {
	case in.QuestionID != "" && (in.ThreadID != "" || in.DispatchID != "" || in.Subagent != "" || in.Cursor != ""):
		return in, problem.Invalid(client.FieldError{Field: "question_id", Message: "asks for one question: give it alone (or with route), without thread_id, dispatch_id, subagent or cursor"})
	case in.Limit < 0 || in.Limit > client.MaxWaitingLimit:
		return in, problem.Invalid(client.FieldError{Field: "limit", Message: fmt.Sprintf("%d: want 1 to %d (0 for %d)", in.Limit, client.MaxWaitingLimit, client.DefaultWaitingLimit)})
	case in.Limit == 0:
		in.Limit = client.DefaultWaitingLimit
	}
	return in, nil
}

// waitingCursor is the position after k: asked_at in Unix nanoseconds, a
// dot, the question id (ids hold no dot: they are subject tokens).
func waitingCursor(k askedKey) string {
	return strconv.FormatInt(k.at.UnixNano(), 10) + "." + k.qid
}

func parseWaitingCursor(c string) (askedKey, bool) {
	ns, qid, ok := strings.Cut(c, ".")
	n, err := strconv.ParseInt(ns, 10, 64)
	if !ok || err != nil || lifecycle.ValidToken(qid) != nil {
		return askedKey{}, false
	}
	return askedKey{at: time.Unix(0, n), qid: qid}, true
}

// respondProblem answers a micro request with p as a micro error reply
// (problem.MicroReply, as the dispatcher answers), through micro's
// Request.Error so that the service's stats count it.
func (s *Service) respondProblem(req micro.Request, p *client.Problem) {
	hdr, data := problem.MicroReply(p)
	if err := req.Error(hdr.Get(micro.ErrorCodeHeader), hdr.Get(micro.ErrorHeader), data, micro.WithHeaders(micro.Headers(hdr))); err != nil {
		s.log.Warn("micro: respond", "err", err)
	}
}
