package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// DecisionsArgs are agora_decisions' arguments.
type DecisionsArgs struct {
	Route string `json:"route,omitempty" jsonschema:"only this route's decisions"`
}

// DecisionList is agora_decisions' result.
type DecisionList struct {
	Decisions []DecisionItem `json:"decisions"`
}

// DecisionItem is one remembered decision.
type DecisionItem struct {
	ID         string   `json:"id" jsonschema:"pass it to agora_forget_decision"`
	Route      string   `json:"route"`
	DedupeKey  string   `json:"dedupe_key,omitempty" jsonschema:"matches questions with this dedupe_key; absent: the same sub-agent, question, options and kind"`
	Subagent   string   `json:"subagent,omitempty"`
	Question   string   `json:"question"`
	Options    []string `json:"options,omitempty"`
	Kind       string   `json:"kind,omitempty"`
	QuestionID string   `json:"question_id" jsonschema:"the question whose answer this is"`
	Answer     string   `json:"answer"`
	Decision   string   `json:"decision,omitempty"`
	AnsweredBy string   `json:"answered_by"`
	AnsweredAt string   `json:"answered_at"`
	ExpiresAt  string   `json:"expires_at" jsonschema:"when it is forgotten by itself"`
}

func decisionItem(d client.Decision) DecisionItem {
	return DecisionItem{ID: d.ID, Route: d.Route, DedupeKey: d.DedupeKey, Subagent: d.Subagent, Question: d.Question, Options: d.Options,
		Kind: d.Kind, QuestionID: d.QuestionID, Answer: d.Answer, Decision: d.Decision, AnsweredBy: d.AnsweredBy,
		AnsweredAt: d.AnsweredAt.UTC().Format(time.RFC3339), ExpiresAt: d.ExpiresAt.UTC().Format(time.RFC3339)}
}

func (t *tools) decisions(ctx context.Context, _ *mcp.CallToolRequest, in DecisionsArgs) (*mcp.CallToolResult, *DecisionList, error) {
	if in.Route != "" && lifecycle.ValidToken(in.Route) != nil {
		return nil, nil, fmt.Errorf("route %q is not a route name (letters, digits, - and _)", in.Route)
	}
	if !t.who.Admin && !t.who.SeeAll { // decisions answer every principal's threads
		return nil, nil, t.scopeError("list remembered decisions", "see: all or admin: true")
	}
	ds, err := t.s.c.Decisions(ctx, in.Route)
	if err != nil {
		return nil, nil, t.explain(err)
	}
	out := &DecisionList{Decisions: []DecisionItem{}}
	for _, d := range ds {
		out.Decisions = append(out.Decisions, decisionItem(d))
	}
	return nil, out, nil
}

// ForgetArgs are agora_forget_decision's arguments.
type ForgetArgs struct {
	ID string `json:"id" jsonschema:"the decision to forget (agora_decisions lists them)"`
}

// Forgotten is agora_forget_decision's result.
type Forgotten struct {
	Forgotten DecisionItem `json:"forgotten"`
	Note      string       `json:"note"`
}

func (t *tools) forgetDecision(ctx context.Context, _ *mcp.CallToolRequest, in ForgetArgs) (*mcp.CallToolResult, *Forgotten, error) {
	if in.ID == "" || lifecycle.ValidToken(in.ID) != nil {
		return nil, nil, fmt.Errorf("id %q is not a decision id: agora_decisions lists them", in.ID)
	}
	if !t.who.Admin {
		return nil, nil, t.scopeError("forget a remembered decision", "admin: true")
	}
	d, err := t.s.c.ForgetDecision(ctx, in.ID)
	if errors.Is(err, client.ErrNotFound) {
		return nil, nil, fmt.Errorf("no remembered decision %q (it may have expired or been forgotten): agora_decisions lists them", in.ID)
	}
	if err != nil {
		return nil, nil, t.explain(err)
	}
	return nil, &Forgotten{Forgotten: decisionItem(d), Note: "later questions that matched it are asked again; the threads it already answered are not changed"}, nil
}
