package mcpserver

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agora-dispatch/agora/internal/clip"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// ask puts an open question to the client: an input-required result for
// clients of protocol 2026-07-28 that can elicit, an elicitation within
// this call for older ones, else a needs_input result.
func (t *tools) ask(ctx context.Context, req *mcp.CallToolRequest, d *lifecycle.NeedsInput, q lifecycle.Question, note string) (*mcp.CallToolResult, *Result, error) {
	ip := req.Session.InitializeParams()
	canElicit := ip != nil && ip.Capabilities != nil && ip.Capabilities.Elicitation != nil
	r := &Result{Status: "needs_input", ThreadID: d.ThreadID, DispatchID: d.DispatchID, Round: d.Round, Subagent: d.Subagent,
		QuestionID: q.QuestionID, Question: q.Question, Options: q.Options, Kind: string(q.Kind), Context: q.Context,
		ThreadsWaiting: max(1, len(q.WaitingThreads)), Suggestion: suggestionOf(q.Suggestion),
		Next: fmt.Sprintf("answer with agora_answer (question_id %q), then call agora_dispatch with thread_id %q to keep following", q.QuestionID, d.ThreadID)}
	r.Artifacts = artifactRefs(d.DispatchID, d)
	if !canElicit {
		return withLinks(r), r, nil
	}
	params := askFor(q, note, r.Artifacts)
	if ip.ProtocolVersion >= mrtrProtocol {
		st, err := t.s.seal.seal(state{ID: newStateID(), Principal: t.principal, ThreadID: d.ThreadID, QuestionID: q.QuestionID,
			Kind: string(q.Kind), Shown: q.ShownDigest, Expires: time.Now().Add(t.s.cfg.StateTTL)})
		if err != nil {
			return nil, nil, err
		}
		return &mcp.CallToolResult{InputRequests: mcp.InputRequestMap{q.QuestionID: params}, RequestState: st}, nil, nil
	}
	// An older client: ask within this call, as often as the thread asks.
	res, err := req.Session.Elicit(ctx, params)
	if err != nil {
		return nil, nil, fmt.Errorf("asking through the client failed (%v): %s", err, r.Next)
	}
	return t.answered(ctx, req, state{ThreadID: d.ThreadID, QuestionID: q.QuestionID, Kind: string(q.Kind), Shown: q.ShownDigest}, res)
}

// resume handles the retry of an input-required result: it opens and
// consumes the requestState, submits the answer the client collected,
// and keeps following the thread.
func (t *tools) resume(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, *Result, error) {
	st, err := t.s.seal.open(req.Params.RequestState, t.principal, time.Now())
	if err != nil {
		return nil, nil, fmt.Errorf("%v: nothing was answered; call agora_dispatch with the thread_id to be asked again, or answer with agora_answer", err)
	}
	resp, ok := req.Params.InputResponses[st.QuestionID]
	if !ok {
		return nil, nil, fmt.Errorf("inputResponses lack %q, the question this requestState is for: nothing was answered", st.QuestionID)
	}
	er, ok := resp.(*mcp.ElicitResult)
	if !ok {
		return nil, nil, fmt.Errorf("the response to %q is not an elicitation result: nothing was answered", st.QuestionID)
	}
	if err := consume(ctx, t.s.states, st); err != nil {
		if errors.Is(err, errStateReplayed) {
			return nil, nil, fmt.Errorf("%v: nothing was answered again; agora_status shows the thread %q", err, st.ThreadID)
		}
		return nil, nil, t.explain(err)
	}
	return t.answered(ctx, req, st, er)
}

// answered submits what the user gave for the question asked (st: its
// thread, id, kind and shown digest) and keeps following the thread. A
// declined or cancelled elicitation leaves the question open.
func (t *tools) answered(ctx context.Context, req *mcp.CallToolRequest, st state, er *mcp.ElicitResult) (*mcp.CallToolResult, *Result, error) {
	threadID, qid := st.ThreadID, st.QuestionID
	if er == nil || er.Action != "accept" {
		action := "cancel"
		if er != nil {
			action = er.Action
		}
		return nil, &Result{Status: "needs_input", ThreadID: threadID, QuestionID: qid,
			Next: fmt.Sprintf("the user did not answer (%s); the question stays open: answer with agora_answer (question_id %q), cancel with agora_cancel, or call agora_dispatch with thread_id %q to be asked again", action, qid, threadID)}, nil
	}
	a := answerOf(er.Content, st.Kind)
	a.AnsweredBy, a.ShownDigest, a.Door = t.answeredBy(), st.Shown, lifecycle.DoorMCP
	_, err := t.s.c.Answer(ctx, qid, a)
	var ae *client.AnswerError
	switch {
	case err == nil:
	case errors.As(err, &ae) && ae.Reply.Status == client.AnswerAlreadyAnswered:
		// Someone else answered first: their answer resumes the thread.
	case errors.As(err, &ae) && ae.Reply.Status == client.AnswerInvalid:
		return t.follow(ctx, req, threadID, "Your answer was refused: "+ae.Reply.Reason)
	case errors.As(err, &ae) && ae.Reply.Status == client.AnswerChanged:
		return t.follow(ctx, req, threadID, "Nothing was answered: the question changed after you were shown it. Look at it again: "+ae.Reply.Reason)
	default:
		return nil, nil, t.explain(err)
	}
	return t.follow(ctx, req, threadID, "")
}

// askFor is the elicitation that asks q (elicitFor), naming the
// artifacts the asking round left: what the person is asked about, e.g.
// the change to approve.
func askFor(q lifecycle.Question, note string, artifacts []ArtifactRef) *mcp.ElicitParams {
	params := elicitFor(q, note)
	if len(artifacts) > 0 {
		var names []string
		for _, a := range artifacts {
			names = append(names, a.Name+" ("+a.URI+")")
		}
		params.Message += "\n\nThe sub-agent left: " + strings.Join(names, ", ")
	}
	return params
}

// elicitFor builds the form that asks q: its options as a titled
// single-select, approve/reject with a comment for an approval, else text.
func elicitFor(q lifecycle.Question, note string) *mcp.ElicitParams {
	msg := q.Question
	if q.Context != "" {
		msg += "\n\n" + clip.String(q.Context, 2000)
	}
	msg += fmt.Sprintf("\n\n(asked by sub-agent %s, thread %s, round %d)", q.Subagent, q.ThreadID, q.Round)
	if n := len(q.WaitingThreads); n > 1 {
		msg += fmt.Sprintf("\n%d threads asked this question: your answer resumes them all.", n)
	}
	sug := q.Suggestion
	if sug != nil && sug.Accepted {
		sug = nil
	}
	if sug != nil {
		msg += fmt.Sprintf("\n\nSuggested by %s: %s (confidence %.2f)", cmp.Or(sug.By, "an answerer"), cmp.Or(sug.Answer, sug.Decision), sug.Confidence)
		if sug.Rationale != "" {
			msg += ": " + clip.String(sug.Rationale, 1000)
		}
	}
	if note != "" {
		msg = note + "\n\n" + msg
	}
	props := map[string]any{}
	var required []string
	switch {
	case q.Kind == lifecycle.QuestionApproval:
		props["decision"] = map[string]any{"type": "string", "title": "Decision", "oneOf": []any{
			map[string]any{"const": "approve", "title": "Approve"}, map[string]any{"const": "reject", "title": "Reject"}}}
		props["comment"] = map[string]any{"type": "string", "title": "Comment (optional)"}
		required = []string{"decision"}
	case len(q.Options) > 0:
		one := make([]any, len(q.Options))
		for i, o := range q.Options {
			one[i] = map[string]any{"const": o, "title": o}
		}
		props["answer"] = map[string]any{"type": "string", "title": "Answer", "oneOf": one}
		props["comment"] = map[string]any{"type": "string", "title": "Comment (optional)"}
		required = []string{"answer"}
	default:
		props["answer"] = map[string]any{"type": "string", "title": "Answer", "minLength": 1}
		required = []string{"answer"}
	}
	// The suggestion is preselected: the schema's default, where it is
	// one of the values the form takes (docs/mcp.md).
	if def := suggestedValue(q, sug); def != "" {
		field := "answer"
		if q.Kind == lifecycle.QuestionApproval {
			field = "decision"
		}
		props[field].(map[string]any)["default"] = def
	}
	return &mcp.ElicitParams{Mode: "form", Message: msg, RequestedSchema: map[string]any{"type": "object", "properties": props, "required": required}}
}

// suggestedValue is the form value a suggestion preselects: the decision
// of an approval, an option of a question with options, or any text
// otherwise; "" when the suggestion fits none.
func suggestedValue(q lifecycle.Question, s *lifecycle.Suggestion) string {
	switch {
	case s == nil:
		return ""
	case q.Kind == lifecycle.QuestionApproval:
		if d := cmp.Or(s.Decision, s.Answer); d == "approve" || d == "reject" {
			return d
		}
		return ""
	case len(q.Options) > 0:
		if slices.Contains(q.Options, s.Answer) {
			return s.Answer
		}
		return ""
	}
	return s.Answer
}

// answerOf reads an accepted form into an answer.
func answerOf(content map[string]any, kind string) lifecycle.Answer {
	str := func(k string) string { s, _ := content[k].(string); return strings.TrimSpace(s) }
	a := lifecycle.Answer{Answer: str("answer"), Comment: str("comment")}
	if kind == "approval" {
		a.Decision = str("decision")
	}
	return a
}
