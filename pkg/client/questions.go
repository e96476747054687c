package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/pkg/kvsnap"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// QuestionFilter selects question records. Empty fields match anything.
type QuestionFilter struct {
	// Status is a question status: asked (pending), answered, expired or
	// withdrawn.
	Status     string
	Route      string
	ThreadID   string
	DispatchID string
	Subagent   string
}

func (f QuestionFilter) match(q *lifecycle.Question) bool {
	return (f.Status == "" || q.Status == f.Status) && (f.Route == "" || q.Route == f.Route) &&
		(f.ThreadID == "" || q.ThreadID == f.ThreadID) && (f.DispatchID == "" || q.DispatchID == f.DispatchID) &&
		(f.Subagent == "" || q.Subagent == f.Subagent)
}

// Questions returns the question records in the agora_questions bucket that
// match f, oldest first. Every record stored before the call is read, in
// that value or a newer one (pkg/kvsnap: a watch's end marker can come
// before a record being rewritten). Values that are not question records
// are skipped.
func (c *Client) Questions(ctx context.Context, f QuestionFilter) ([]lifecycle.Question, error) {
	es, err := kvsnap.Read(ctx, c.js, lifecycle.BucketQuestions, ">")
	if err != nil {
		return nil, fmt.Errorf("client: questions: %w", err)
	}
	var out []lifecycle.Question
	for _, e := range es {
		var q lifecycle.Question
		if json.Unmarshal(e.Value, &q) != nil || q.QuestionID == "" {
			continue
		}
		if f.match(&q) {
			out = append(out, q)
		}
	}
	slices.SortStableFunc(out, func(a, b lifecycle.Question) int { return a.AskedAt.Compare(b.AskedAt) })
	return out, nil
}

// WaitingRequest is the body of agora.api.questions: which waiting
// questions, and which page of them.
type WaitingRequest struct {
	Route      string `json:"route,omitempty"`
	ThreadID   string `json:"thread_id,omitempty"`
	DispatchID string `json:"dispatch_id,omitempty"`
	Subagent   string `json:"subagent,omitempty"`
	// QuestionID asks for that one question: the page holds it when it
	// waits (on the endpoint's route, for agora.api.questions.<route>),
	// and nothing otherwise.
	QuestionID string `json:"question_id,omitempty"`
	// Limit is the page size: 0 means DefaultWaitingLimit, at most
	// MaxWaitingLimit.
	Limit int `json:"limit,omitempty"`
	// Cursor is a page's NextCursor: the page after it. Empty: the first.
	Cursor string `json:"cursor,omitempty"`
}

// Page sizes of Waiting.
const (
	DefaultWaitingLimit = 100
	MaxWaitingLimit     = 1000
)

// WaitingPage is one page of waiting questions, the router's reply on
// agora.api.questions.
type WaitingPage struct {
	// Questions are the records of the page, oldest first.
	Questions []lifecycle.Question `json:"questions"`
	// Count is how many waiting questions match, on every page.
	Count int `json:"count"`
	// NextCursor continues with the questions asked after this page's
	// last; absent on the last page. A question asked meanwhile comes on
	// a later page, never shifts one.
	NextCursor string `json:"next_cursor,omitempty"`
}

// Waiting returns one page of the questions waiting for an answer (status
// asked) that match f, oldest first, from the router's index of them: it
// reads only the page's records, so a page costs the same with ten
// questions waiting or a hundred thousand. f.Status must be empty or
// asked. limit 0 means DefaultWaitingLimit; cursor "" the first page. With
// no router running the error matches ErrUnavailable (Questions reads the
// bucket instead).
func (c *Client) Waiting(ctx context.Context, f QuestionFilter, limit int, cursor string) (*WaitingPage, error) {
	if f.Status != "" && f.Status != "asked" {
		return nil, fmt.Errorf("client: waiting questions have status asked, not %q", f.Status)
	}
	var page WaitingPage
	req := WaitingRequest{Route: f.Route, ThreadID: f.ThreadID, DispatchID: f.DispatchID, Subagent: f.Subagent, Limit: limit, Cursor: cursor}
	if err := c.call(ctx, lifecycle.APIQuestions, nil, req, &page); err != nil {
		return nil, err
	}
	return &page, nil
}

// WaitingOnRoute is Waiting for an answerer of route: it asks the router
// on agora.api.questions.<route>, which answers only with questions that
// wait on route now, so an answerer needs no read of the question records
// (docs/security.md, "What answerers read"). req.Route, when set, must be
// route; req.QuestionID asks whether that one question waits there.
func (c *Client) WaitingOnRoute(ctx context.Context, route string, req WaitingRequest) (*WaitingPage, error) {
	subject, err := lifecycle.APIQuestionsRoute(route)
	if err != nil {
		return nil, fmt.Errorf("client: route: %w", err)
	}
	var page WaitingPage
	if err := c.call(ctx, subject, nil, req, &page); err != nil {
		return nil, err
	}
	return &page, nil
}

// Question returns one question record from the agora_questions bucket,
// or ErrNotFound when there is none (not asked yet, or removed).
func (c *Client) Question(ctx context.Context, questionID string) (lifecycle.Question, error) {
	if err := lifecycle.ValidToken(questionID); err != nil {
		return lifecycle.Question{}, fmt.Errorf("client: question id: %w", err)
	}
	kv, err := c.js.KeyValue(ctx, lifecycle.BucketQuestions)
	if err != nil {
		return lifecycle.Question{}, fmt.Errorf("client: bucket %s: %w", lifecycle.BucketQuestions, err)
	}
	e, err := kv.Get(ctx, questionID)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return lifecycle.Question{}, fmt.Errorf("client: question %s: %w", questionID, ErrNotFound)
	case err != nil:
		return lifecycle.Question{}, fmt.Errorf("client: question %s: %w", questionID, err)
	}
	var q lifecycle.Question
	if err := json.Unmarshal(e.Value(), &q); err != nil || q.QuestionID != questionID {
		return lifecycle.Question{}, fmt.Errorf("client: question %s: the record is not a question", questionID)
	}
	return q, nil
}

// AnswerOption adjusts one Answer call.
type AnswerOption func(*answerOptions)

type answerOptions struct {
	route string
}

// AnswerVia sends the answer through the answer endpoint of route,
// agora.api.answer.<route>, instead of the generic agora.api.answer. The
// router accepts it only while the question is on that route (not when
// it escalated or fell back to another): otherwise the reply is invalid,
// naming the question's route. Answerers use it: deployments let a route's
// NATS user request only its route's endpoint, and keep the generic one for
// trusted users (operators, the CLI).
func AnswerVia(route string) AnswerOption {
	return func(o *answerOptions) { o.route = route }
}

// Answer submits an answer to a question through the router's
// agora.api.answer endpoint (or a route's, see AnswerVia) and returns its
// reply when the answer is accepted. The first valid answer wins.
// Otherwise the error is an *AnswerError wrapping ErrAlreadyAnswered,
// ErrInvalidAnswer, ErrNotFound or ErrUnavailable (status retry); with no
// router running it matches ErrUnavailable. a.QuestionID is set to
// questionID. Answer blocks until the router replies or ctx ends.
func (c *Client) Answer(ctx context.Context, questionID string, a lifecycle.Answer, opts ...AnswerOption) (*AnswerReply, error) {
	if err := lifecycle.ValidToken(questionID); err != nil {
		return nil, fmt.Errorf("client: question id: %w", err)
	}
	if a.QuestionID != "" && a.QuestionID != questionID {
		return nil, fmt.Errorf("client: answer names question %q, not %q", a.QuestionID, questionID)
	}
	subject, route, err := answerSubject(opts)
	if err != nil {
		return nil, err
	}
	if route != "" {
		if a.Route != "" && a.Route != route {
			return nil, fmt.Errorf("client: answer names route %q but goes through route %q", a.Route, route)
		}
		a.Route = route
	}
	a.QuestionID = questionID
	return c.submit(ctx, subject, questionID, a)
}

// Submission is the body of the router's answer endpoints
// (agora.api.answer, agora.api.answer.<route>) and the data of
// dev.agora.answer.submitted on AGORA_ANSWERS: an answer (the fields of
// lifecycle.Answer), a decline (Decline, with Reason saying why: the
// question goes to its route's fallback), or a suggestion (Suggest, with
// Confidence from 0 to 1 and Reason as its rationale; docs/answering.md,
// "Suggested answers"). Answer, Decline and the answerer SDK send it.
type Submission struct {
	QuestionID string `json:"question_id"`
	Route      string `json:"route,omitempty"` // the route the answerer serves
	Answer     string `json:"answer,omitempty"`
	Decision   string `json:"decision,omitempty"` // approve | reject, for approval questions
	AnsweredBy string `json:"answered_by,omitempty"`
	Comment    string `json:"comment,omitempty"`
	Decline    bool   `json:"decline,omitempty"`
	Reason     string `json:"reason,omitempty"`
	Suggest    bool   `json:"suggest,omitempty"`
	// Confidence is sent with a suggestion, even when zero.
	Confidence *float64 `json:"confidence,omitempty"`
	// ShownDigest binds the answer to what the person saw: the
	// lifecycle.Question.ShownDigest of the question the door showed.
	// The router replies AnswerChanged when the question no longer shows
	// that; empty answers the question as it stands (docs/answering.md,
	// "Bound answers").
	ShownDigest string `json:"shown_digest,omitempty"`
	// Door names the door the answer was given through (lifecycle.Answer's
	// Door): 1 to 32 of [a-z0-9-], or empty.
	Door string `json:"door,omitempty"`
}

// answerSubject is the router endpoint an answer or decline goes to: a
// route's own when AnswerVia names one, the generic one otherwise.
func answerSubject(opts []AnswerOption) (subject, route string, err error) {
	var o answerOptions
	for _, f := range opts {
		f(&o)
	}
	if o.route == "" {
		return lifecycle.APIAnswer, "", nil
	}
	subject, err = lifecycle.APIAnswerRoute(o.route)
	if err != nil {
		return "", "", fmt.Errorf("client: answer route: %w", err)
	}
	return subject, o.route, nil
}

// submit sends an answer or decline to the router and sorts its reply:
// the reply when accepted, an *AnswerError otherwise.
func (c *Client) submit(ctx context.Context, subject, questionID string, body any) (*AnswerReply, error) {
	var reply AnswerReply
	if err := c.call(ctx, subject, nil, body, &reply); err != nil {
		var p *Problem
		if errors.As(err, &p) && p.Status == 404 {
			return nil, &AnswerError{QuestionID: questionID, Reply: AnswerReply{Status: AnswerNotFound, Reason: p.Detail}}
		}
		return nil, err
	}
	switch reply.Status {
	case AnswerAccepted:
		return &reply, nil
	case AnswerAlreadyAnswered, AnswerInvalid, AnswerChanged, AnswerNotFound, AnswerRetry:
		return nil, &AnswerError{QuestionID: questionID, Reply: reply}
	}
	return nil, fmt.Errorf("client: answer to %s: unknown reply status %q", questionID, reply.Status)
}
