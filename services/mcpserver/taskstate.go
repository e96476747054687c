package mcpserver

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// taskOf derives the task of a thread from its records (docs/mcp.md,
// "Tasks"): working while a round runs, input_required while the latest
// round waits on an open question, completed with agora_dispatch's
// result once it finished or failed, cancelled once it was cancelled.
func (t *tools) taskOf(ctx context.Context, th *client.Thread) (*task, error) {
	first, rd := &th.Rounds[0], &th.Rounds[len(th.Rounds)-1]
	tk := &task{ResultType: "complete", TaskID: th.ThreadID, Status: taskWorking, CreatedAt: stamp(first.CreatedAt),
		LastUpdatedAt: stamp(lastChange(rd)), PollIntervalMs: taskPollInterval.Milliseconds(),
		StatusMessage: fmt.Sprintf("sub-agent %s, round %d: %s", rd.Subagent, rd.Round, rd.Status)}
	if rd.ExpiresAt != nil {
		ttl := rd.ExpiresAt.Sub(first.CreatedAt).Milliseconds()
		tk.TTLMs = &ttl
	}
	switch {
	case rd.Status == lifecycle.KindNeedsInput:
		return t.pausedTask(ctx, tk, rd)
	case rd.Status.Terminal():
		endedTask(tk, rd)
	}
	return tk, nil
}

// pausedTask is the task of a thread whose latest round asked: waiting on
// the question while it is open, asked as agora_dispatch asks it (the
// same form, keyed by the question id); working once it is answered,
// while the next round is dispatched.
func (t *tools) pausedTask(ctx context.Context, tk *task, rd *client.Round) (*task, error) {
	if rd.CancelRequested != nil {
		tk.StatusMessage = "cancelling: the thread ends cancelled and its question is withdrawn"
		return tk, nil
	}
	var ni *lifecycle.NeedsInput
	for _, d := range roundData(rd) {
		if v, ok := d.(*lifecycle.NeedsInput); ok {
			ni = v
		}
	}
	qid := ""
	if rd.Result != nil {
		qid = rd.Result.QuestionID
	} else if ni != nil {
		qid = ni.QuestionID
	}
	q, found, err := t.waitedOn(ctx, qid)
	if err != nil {
		return nil, err
	}
	if !found {
		if ni == nil || rd.EndedAt == nil || time.Since(*rd.EndedAt) < questionGrace {
			tk.StatusMessage = fmt.Sprintf("sub-agent %s, round %d asked: the question is being routed", rd.Subagent, rd.Round)
			return tk, nil
		}
		q = eventQuestion(ni)
	}
	if q.Status != "asked" {
		tk.StatusMessage = fmt.Sprintf("question %s is %s: the thread goes on", q.QuestionID, q.Status)
		return tk, nil
	}
	var arts []ArtifactRef
	if ni != nil {
		arts = artifactRefs(ni.DispatchID, ni)
	}
	tk.Status, tk.asked = taskInputRequired, &q
	tk.InputRequests = mcp.InputRequestMap{q.QuestionID: askFor(q, "", arts)}
	tk.StatusMessage = fmt.Sprintf("sub-agent %s, round %d asks question %s: answer it with tasks/update, inputResponses keyed %q", rd.Subagent, rd.Round, q.QuestionID, q.QuestionID)
	return tk, nil
}

// endedTask sets the task of a thread whose latest round ended otherwise
// than by asking: completed with the result agora_dispatch returns for
// it (a failed thread too: its failure is the tool's result, not a
// protocol error), or cancelled.
func endedTask(tk *task, rd *client.Round) {
	var end lifecycle.Lifecycle
	for _, d := range roundData(rd) {
		if l, ok := d.(lifecycle.Lifecycle); ok && l.LifecycleKind() == rd.Status {
			end = l
		}
	}
	if end == nil {
		end = recordEnd(&rd.Record)
	}
	res, r, _ := ended(end)
	tk.StatusMessage = "the thread " + r.Status
	if r.Status == "failed" {
		tk.StatusMessage += ": " + strings.TrimSpace(r.Reason+" "+r.Detail)
	}
	if rd.Status == lifecycle.KindCancelled {
		tk.Status, tk.StatusMessage = taskCancelled, "the thread was cancelled: "+r.Detail
		return
	}
	// As the SDK sends a typed tool's result: its output as structured
	// content too.
	res.StructuredContent = r
	tk.Status, tk.Result = taskCompleted, res
}

// roundData parses a round's events, skipping any it cannot.
func roundData(rd *client.Round) []lifecycle.Data {
	var out []lifecycle.Data
	for _, e := range rd.Events {
		if d, err := lifecycle.Parse(e); err == nil {
			out = append(out, d)
		}
	}
	return out
}

// recordEnd stands for a round's terminal event, from its record, when
// the event is not among those read.
func recordEnd(r *client.Record) lifecycle.Lifecycle {
	res := r.Result
	if res == nil {
		res = &client.Result{}
	}
	switch r.Status {
	case lifecycle.KindFinished:
		return &lifecycle.Finished{Common: r.Common(), Output: res.Output}
	case lifecycle.KindCancelled:
		return &lifecycle.Cancelled{Common: r.Common(), By: res.By, Reason: res.Detail}
	}
	return &lifecycle.Failed{Common: r.Common(), Reason: res.Reason, Detail: res.Detail}
}

// lastChange is when a round last changed: its latest event, or its
// record's update.
func lastChange(rd *client.Round) time.Time {
	at := rd.UpdatedAt
	for _, t := range []*time.Time{rd.StartedAt, rd.EndedAt} {
		if t != nil && t.After(at) {
			at = *t
		}
	}
	for _, e := range rd.Events {
		if e.Time().After(at) {
			at = e.Time()
		}
	}
	return at
}

// stamp is a task's ISO 8601 time.
func stamp(at time.Time) string { return at.UTC().Format(time.RFC3339Nano) }
