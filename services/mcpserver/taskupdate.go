package mcpserver

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// updateTask answers the question a task waits on with the response
// keyed by its question id, through the router as every door answers
// (answered_by mcp:<principal>, the caller's answer scope checked).
// Responses under any other key are ignored, as the extension asks: a
// key already answered, or one of a task that no longer waits.
func (t *tools) updateTask(ctx context.Context, params json.RawMessage) (any, error) {
	p, th, err := t.readTask(ctx, methodTasksUpdate, "update", params)
	if err != nil {
		return nil, err
	}
	if p.InputResponses == nil {
		return nil, invalidParams("tasks/update: params.inputResponses is required: the responses to the task's inputRequests, keyed as they are")
	}
	tk, err := t.taskOf(ctx, th)
	if err != nil {
		return nil, internalError(t.explain(err))
	}
	if q := tk.asked; q != nil {
		if resp, ok := p.InputResponses[q.QuestionID]; ok {
			if err := t.answerTask(ctx, *q, resp); err != nil {
				return nil, err
			}
		}
	}
	return newAck(), nil
}

// answerTask submits resp, the response to the input request asking q.
// An answer that lost to another is no error: that answer resumes the
// thread.
func (t *tools) answerTask(ctx context.Context, q lifecycle.Question, resp mcp.InputResponse) error {
	er, ok := resp.(*mcp.ElicitResult)
	if !ok {
		return invalidParams("tasks/update: inputResponses[%q] must be an elicitation result {action, content}", q.QuestionID)
	}
	if er.Action != "accept" {
		return invalidParams("tasks/update: inputResponses[%q] has action %q: nothing was answered and the question stays open; send action accept with the form's content, or end the task with tasks/cancel", q.QuestionID, er.Action)
	}
	var via []client.AnswerOption
	if q.Route != "" && t.checksAnswers() { // a question the router recorded
		var err error
		if via, err = t.mayAnswer(ctx, q); err != nil {
			return invalidParams("tasks/update: %v", err)
		}
	}
	a := answerOf(er.Content, string(q.Kind))
	a.AnsweredBy, a.Door = t.answeredBy(), lifecycle.DoorMCP
	_, err := t.s.c.Answer(ctx, q.QuestionID, a, via...)
	var ae *client.AnswerError
	switch {
	case err == nil:
		t.s.log.Info("mcp task answered", "question_id", q.QuestionID, "principal", t.principal)
	case errors.As(err, &ae) && ae.Reply.Status == client.AnswerInvalid:
		return invalidParams("tasks/update: inputResponses[%q]: answer refused: %s; the question stays open", q.QuestionID, ae.Reply.Reason)
	case errors.As(err, &ae) && (ae.Reply.Status == client.AnswerAlreadyAnswered || ae.Reply.Status == client.AnswerNotFound):
		// Answered by another meanwhile, or gone: the task goes on.
	default:
		return internalError(t.explain(err))
	}
	return nil
}

// cancelTask cancels the task's thread: running rounds stop, and a thread
// paused on a question ends cancelled with its question withdrawn. The
// ack is sent once the dispatcher took the cancel; a thread that already
// ended is left as it was.
func (t *tools) cancelTask(ctx context.Context, params json.RawMessage) (any, error) {
	_, th, err := t.readTask(ctx, methodTasksCancel, "cancel", params)
	if err != nil {
		return nil, err
	}
	if _, err := t.s.c.CancelThread(ctx, th.ThreadID, client.CancelBy(t.answeredBy(), "tasks/cancel")); err != nil {
		if errors.Is(err, client.ErrNotFound) {
			return nil, taskNotFound("cancel", th.ThreadID)
		}
		return nil, internalError(t.explain(err))
	}
	t.s.log.Info("mcp task cancelled", "thread_id", th.ThreadID, "principal", t.principal)
	return newAck(), nil
}
