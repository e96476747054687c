package mcpserver

import (
	"context"
	"errors"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// TargetArgs name a thread or one dispatch.
type TargetArgs struct {
	ThreadID   string `json:"thread_id,omitempty" jsonschema:"a thread (the root dispatch's id)"`
	DispatchID string `json:"dispatch_id,omitempty" jsonschema:"one dispatch (round) of a thread"`
}

func (a TargetArgs) check() error {
	switch {
	case (a.ThreadID == "") == (a.DispatchID == ""):
		return errors.New("give exactly one of thread_id and dispatch_id")
	case a.ThreadID != "" && lifecycle.ValidToken(a.ThreadID) != nil:
		return fmt.Errorf("thread_id %q is not a thread id", a.ThreadID)
	case a.DispatchID != "" && lifecycle.ValidToken(a.DispatchID) != nil:
		return fmt.Errorf("dispatch_id %q is not a dispatch id", a.DispatchID)
	}
	return nil
}

// Status is agora_status' and agora_cancel's result.
type Status struct {
	ThreadID string        `json:"thread_id"`
	Status   string        `json:"status" jsonschema:"the latest round's status"`
	Rounds   []RoundStatus `json:"rounds"`
	Note     string        `json:"note,omitempty"`
}

// RoundStatus is one round in a Status.
type RoundStatus struct {
	DispatchID string `json:"dispatch_id"`
	Round      int    `json:"round"`
	Subagent   string `json:"subagent"`
	Status     string `json:"status"`
	QuestionID string `json:"question_id,omitempty"`
	Question   string `json:"question,omitempty"`
	// WaitsOn is, for a round paused on a question that joined another,
	// the question asked for both (docs/router.md, "Ask once").
	WaitsOn string `json:"waits_on,omitempty" jsonschema:"the round's question joined this one, asked once for every thread waiting on it: answer it with agora_answer"`
	Reason  string `json:"reason,omitempty"`
	Detail  string `json:"detail,omitempty"`
	Output  any    `json:"output,omitempty"`
}

func roundOf(r *client.Record) RoundStatus {
	rs := RoundStatus{DispatchID: r.DispatchID, Round: r.Round, Subagent: r.Subagent, Status: string(r.Status)}
	if res := r.Result; res != nil {
		rs.QuestionID, rs.Question, rs.Reason, rs.Detail, rs.Output = res.QuestionID, res.Question, string(res.Reason), res.Detail, rawToAny(res.Output)
	}
	return rs
}

func statusOf(th *client.Thread) *Status {
	st := &Status{ThreadID: th.ThreadID, Status: string(th.Status), Rounds: []RoundStatus{}}
	for i := range th.Rounds {
		st.Rounds = append(st.Rounds, roundOf(&th.Rounds[i].Record))
	}
	return st
}

func (t *tools) status(ctx context.Context, _ *mcp.CallToolRequest, in TargetArgs) (*mcp.CallToolResult, *Status, error) {
	if err := in.check(); err != nil {
		return nil, nil, err
	}
	if in.ThreadID != "" {
		th, err := t.s.c.Thread(ctx, in.ThreadID)
		if err != nil {
			return nil, nil, t.explainTarget(err, "thread", in.ThreadID)
		}
		if err := t.seeRead(th); err != nil {
			return nil, nil, err
		}
		st := statusOf(th)
		t.waitsOn(ctx, st.Rounds)
		return nil, st, nil
	}
	if err := t.seeDispatch(ctx, in.DispatchID, false); err != nil {
		return nil, nil, err
	}
	rec, err := t.s.c.Status(ctx, in.DispatchID)
	if err != nil {
		return nil, nil, t.explainTarget(err, "dispatch", in.DispatchID)
	}
	st := &Status{ThreadID: rec.ThreadID, Status: string(rec.Status), Rounds: []RoundStatus{roundOf(rec)}}
	t.waitsOn(ctx, st.Rounds)
	return nil, st, nil
}

// waitsOn sets WaitsOn of the last round when it is paused on a question
// that joined another, from the question's record.
func (t *tools) waitsOn(ctx context.Context, rounds []RoundStatus) {
	if len(rounds) == 0 {
		return
	}
	r := &rounds[len(rounds)-1]
	if r.Status != string(lifecycle.KindNeedsInput) || r.QuestionID == "" {
		return
	}
	if q, err := t.s.c.Question(ctx, r.QuestionID); err == nil && q.Status == lifecycle.StatusJoined {
		r.WaitsOn = q.JoinedTo
	}
}

// CancelArgs are agora_cancel's arguments.
type CancelArgs struct {
	TargetArgs
	Reason string `json:"reason,omitempty" jsonschema:"why, kept with the cancel"`
}

func (t *tools) cancel(ctx context.Context, _ *mcp.CallToolRequest, in CancelArgs) (*mcp.CallToolResult, *Status, error) {
	if err := in.check(); err != nil {
		return nil, nil, err
	}
	by := client.CancelBy(t.answeredBy(), in.Reason)
	if in.ThreadID != "" {
		if err := t.seeThread(ctx, in.ThreadID, true); err != nil {
			return nil, nil, err
		}
		th, err := t.s.c.CancelThread(ctx, in.ThreadID, by)
		if err != nil {
			return nil, nil, t.explainTarget(err, "thread", in.ThreadID)
		}
		st := statusOf(th)
		st.Note = "every round that had not ended is cancelled; a thread paused on a question ends cancelled and its question is withdrawn"
		if th.Outcome == client.OutcomeAlreadyEnded {
			st.Note = "the thread had already ended, or was already being cancelled: nothing was cancelled"
		}
		return nil, st, nil
	}
	if err := t.seeDispatch(ctx, in.DispatchID, true); err != nil {
		return nil, nil, err
	}
	rec, err := t.s.c.Cancel(ctx, in.DispatchID, by)
	if err != nil {
		return nil, nil, t.explainTarget(err, "dispatch", in.DispatchID)
	}
	st := &Status{ThreadID: rec.ThreadID, Status: string(rec.Status), Rounds: []RoundStatus{roundOf(rec)}}
	// The dispatcher's outcome, from the state the cancel found.
	switch {
	case rec.Outcome == client.OutcomeThreadCancelling:
		st.Note = "it was paused on a question: its thread ends cancelled and the question is withdrawn"
	case rec.Outcome == client.OutcomeCancelling:
		st.Note = "it was running: it ends cancelled and its worker stops it"
	case rec.Outcome != client.OutcomeAlreadyEnded:
	case rec.Status == lifecycle.KindNeedsInput && rec.CancelRequested != nil:
		st.Note = "its thread was already being cancelled: nothing more was cancelled"
	case rec.Status == lifecycle.KindNeedsInput:
		st.Note = "this round had already ended and its thread went on: nothing was cancelled; cancel the thread_id instead"
	default:
		st.Note = "it had already ended: nothing was cancelled"
	}
	return nil, st, nil
}
