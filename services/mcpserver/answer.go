package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// AnswerArgs are agora_answer's arguments.
type AnswerArgs struct {
	QuestionID string `json:"question_id" jsonschema:"the question (agora_questions lists them)"`
	Answer     string `json:"answer,omitempty" jsonschema:"the answer: one of the options when the question has options"`
	Decision   string `json:"decision,omitempty" jsonschema:"approve or reject, for an approval question"`
	Comment    string `json:"comment,omitempty" jsonschema:"an optional comment kept with the answer"`
	// ShownDigest binds the answer to the question as it was shown.
	ShownDigest string `json:"shown_digest,omitempty" jsonschema:"the question's shown_digest as agora_questions showed it: the answer is refused if the question changed since"`
}

func (t *tools) answer(ctx context.Context, _ *mcp.CallToolRequest, in AnswerArgs) (*mcp.CallToolResult, *Result, error) {
	if err := lifecycle.ValidToken(in.QuestionID); err != nil || in.QuestionID == "" {
		return nil, nil, fmt.Errorf("question_id %q is not a question id: agora_questions lists them", in.QuestionID)
	}
	if in.Decision != "" && in.Decision != "approve" && in.Decision != "reject" {
		return nil, nil, fmt.Errorf("decision %q: want approve or reject", in.Decision)
	}
	var via []client.AnswerOption
	if t.checksAnswers() {
		q, err := t.s.c.Question(ctx, in.QuestionID)
		if errors.Is(err, client.ErrNotFound) {
			return nil, nil, fmt.Errorf("no question %s: agora_questions lists them", in.QuestionID)
		} else if err != nil {
			return nil, nil, t.explain(err)
		}
		if via, err = t.mayAnswer(ctx, q); err != nil {
			return nil, nil, err
		}
	}
	rep, err := t.s.c.Answer(ctx, in.QuestionID, lifecycle.Answer{Answer: in.Answer, Decision: in.Decision, Comment: in.Comment, AnsweredBy: t.answeredBy(), ShownDigest: in.ShownDigest, Door: lifecycle.DoorMCP}, via...)
	var ae *client.AnswerError
	if errors.As(err, &ae) {
		switch ae.Reply.Status {
		case client.AnswerAlreadyAnswered:
			who := ae.Reply.AnsweredBy
			if ae.Reply.AnsweredAt != nil {
				who += " at " + ae.Reply.AnsweredAt.UTC().Format(time.RFC3339)
			}
			return nil, nil, fmt.Errorf("question %s is closed: %s (answered by %s); its thread goes on without this answer", in.QuestionID, ae.Reply.Reason, strings.TrimSpace(who))
		case client.AnswerInvalid:
			return nil, nil, fmt.Errorf("answer refused: %s. Call agora_answer again with a valid answer", ae.Reply.Reason)
		case client.AnswerChanged:
			return nil, nil, fmt.Errorf("answer refused: %s (agora_questions shows the question as it stands)", ae.Reply.Reason)
		case client.AnswerNotFound:
			return nil, nil, fmt.Errorf("no question %s: agora_questions lists them", in.QuestionID)
		}
	}
	if err != nil {
		return nil, nil, t.explain(err)
	}
	threadID := strings.TrimPrefix(in.QuestionID, "q-")
	if q, err := t.s.c.Question(ctx, in.QuestionID); err == nil {
		threadID = q.ThreadID
	}
	return nil, &Result{Status: "answered", ThreadID: threadID, QuestionID: in.QuestionID,
		Next: fmt.Sprintf("answered as %s at %s; the thread resumes as a new round: call agora_dispatch with thread_id %q to follow it", rep.AnsweredBy, rep.AnsweredAt.UTC().Format(time.RFC3339), threadID)}, nil
}

// checksAnswers reports whether the caller's answers are checked against
// its scope (mayAnswer): everyone's but an admin's, and a see-all
// principal's without an answer scope.
func (t *tools) checksAnswers() bool { return !t.who.Admin && (!t.who.SeeAll || t.who.Answer != nil) }

// mayAnswer decides whether the caller may answer q, as every door does:
// it must see every thread the answer resumes, and its answer scope must
// hold q's route. It returns the options that make the router check the
// route again.
func (t *tools) mayAnswer(ctx context.Context, q lifecycle.Question) ([]client.AnswerOption, error) {
	if err := t.seeQuestion(ctx, &q); err != nil {
		return nil, err
	}
	if !t.who.MayAnswer(q.Route) {
		return nil, fmt.Errorf("principal %s may not answer question %s: it is on route %s, and its answer scope is %v (AGORA_PRINCIPALS_FILE)", t.who.Name, q.QuestionID, q.Route, t.who.Answer)
	}
	if t.who.Answer != nil {
		// Through the route's door: the router refuses the answer if the
		// question moved off the route meanwhile.
		return []client.AnswerOption{client.AnswerVia(q.Route)}, nil
	}
	return nil, nil
}
