package client

import (
	"context"
	"fmt"
	"time"

	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// Decision is a remembered answer: a route with `remember` keeps the
// answer to a question for that long, and a later question that matches it
// (same route, same dedupe_key or the same sub-agent, question, options
// and kind) is answered with it at once, answered_by memory:<QuestionID>
// (docs/router.md, "Ask once").
type Decision struct {
	// ID names the decision: a digest of the matching rule's fields.
	ID        string   `json:"id"`
	Route     string   `json:"route"`
	Subagent  string   `json:"subagent,omitempty"`
	DedupeKey string   `json:"dedupe_key,omitempty"`
	Question  string   `json:"question"`
	Options   []string `json:"options,omitempty"`
	Kind      string   `json:"kind,omitempty"`
	// ContextSHA256 is the hex SHA-256 of the question's context (empty
	// for none): a later question is answered from this decision only when
	// its text, context, options and kind are the same.
	ContextSHA256 string `json:"context_sha256,omitempty"`
	// ShownDigest is the shown digest of the question the decision was
	// made on (lifecycle.Question.ShownDigest, partial state included): a
	// later question is answered from it only when it shows the same.
	ShownDigest string `json:"shown_digest,omitempty"`
	// QuestionID is the question whose answer this is.
	QuestionID string    `json:"question_id"`
	Answer     string    `json:"answer"`
	Decision   string    `json:"decision,omitempty"`
	AnsweredBy string    `json:"answered_by"`
	Comment    string    `json:"comment,omitempty"`
	AnsweredAt time.Time `json:"answered_at"`
	// ExpiresAt is when the decision is forgotten by itself: its
	// answer's time plus the route's remember.
	ExpiresAt time.Time `json:"expires_at"`
}

// DecisionsPage is the router's reply on agora.api.decisions: the
// remembered decisions, newest answer first.
type DecisionsPage struct {
	Decisions []Decision `json:"decisions"`
	Count     int        `json:"count"`
}

// Decisions lists the remembered decisions, of one route when route is not
// empty, newest answer first.
func (c *Client) Decisions(ctx context.Context, route string) ([]Decision, error) {
	if route != "" {
		if err := lifecycle.ValidToken(route); err != nil {
			return nil, fmt.Errorf("client: route: %w", err)
		}
	}
	var page DecisionsPage
	if err := c.call(ctx, lifecycle.APIDecisions, nil, lifecycle.DecisionsRequest{Route: route}, &page); err != nil {
		return nil, err
	}
	return page.Decisions, nil
}

// ForgetDecision forgets the remembered decision id, returning what was
// forgotten; later questions are asked again. Threads it already answered
// are not changed. A *Problem wrapping ErrNotFound reports an id that is
// not (or no longer) remembered.
func (c *Client) ForgetDecision(ctx context.Context, id string) (Decision, error) {
	if err := lifecycle.ValidToken(id); err != nil {
		return Decision{}, fmt.Errorf("client: decision id: %w", err)
	}
	var d Decision
	if err := c.call(ctx, lifecycle.APIDecisionsForget, nil, lifecycle.ForgetRequest{ID: id}, &d); err != nil {
		return Decision{}, err
	}
	return d, nil
}

// ReverseRequest is the body of agora.api.reverse.<route>: a person's
// answer that reverses the accepted suggestion which answered a question
// of that route (docs/answering.md, "Reversing an accepted suggestion").
type ReverseRequest struct {
	QuestionID string `json:"question_id"`
	Answer     string `json:"answer"`
	Decision   string `json:"decision,omitempty"`
	Comment    string `json:"comment,omitempty"`
	// ReversedBy is the person reversing it.
	ReversedBy string `json:"reversed_by"`
}

// ReverseReply is the router's answer to a reversal it made.
type ReverseReply struct {
	QuestionID string `json:"question_id"`
	// CancelledDispatchID is the dispatch the suggestion resumed, now
	// cancelled; NextDispatchID the one that carries the person's answer.
	CancelledDispatchID string `json:"cancelled_dispatch_id"`
	NextDispatchID      string `json:"next_dispatch_id"`
}

// Reverse asks the router to reverse the accepted suggestion that
// answered question req.QuestionID on route. A refusal is a *Problem: 409
// (ProblemConflict) when the thread went on already, 404 when there is no
// such question on route, 422 when it has nothing to reverse or the
// answer is invalid.
func (c *Client) Reverse(ctx context.Context, route string, req ReverseRequest) (ReverseReply, error) {
	subj, err := lifecycle.APIReverseRoute(route)
	if err != nil {
		return ReverseReply{}, fmt.Errorf("client: reverse: %w", err)
	}
	var rep ReverseReply
	if err := c.call(ctx, subj, nil, req, &rep); err != nil {
		return ReverseReply{}, err
	}
	return rep, nil
}
