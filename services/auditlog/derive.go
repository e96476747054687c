package auditlog

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/agora-dispatch/agora/internal/statedigest"
	"github.com/agora-dispatch/agora/pkg/audit"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// record is what an entry takes from the question record (the value under
// the question id in agora_questions) beside the event's snapshot: the
// fields question events do not carry.
type record struct {
	Comment         string          `json:"comment"`
	NextDispatchID  string          `json:"next_dispatch_id"`
	Outcome         string          `json:"outcome"`
	OnExpiry        string          `json:"on_expiry"`
	PartialState    json.RawMessage `json:"partial_state"`
	PartialStateRef string          `json:"partial_state_ref"`
	BoundDigest     string          `json:"bound_digest"`
	History         []struct {
		Via  string `json:"via"`
		Door string `json:"door"`
		// NamedDoor is the door the answer named itself with (inbox,
		// link, slack, mcp, a2a, cli, ...); empty when it named none.
		NamedDoor string `json:"named_door"`
		Result    string `json:"result"`
	} `json:"history"`
}

// Answerers Agora itself names (services/router).
const (
	defaultAnsweredBy = "agora:default"
	memoryPrefix      = "memory:"
	suggestedPrefix   = "suggested:"
)

// derive makes the entry for a source message and returns it with the
// id its append carries (the source event's id); a nil entry for an event
// that is no step of the log (a failure that is not a floor refusal).
func (w *writer) derive(ctx context.Context, src source) (*audit.Entry, string, error) {
	ev, err := lifecycle.DecodeMsg(src.msg)
	if err != nil {
		return nil, "", err
	}
	d, err := lifecycle.Parse(ev)
	if err != nil {
		return nil, "", err
	}
	e := &audit.Entry{At: ev.Time().UTC().Format(time.RFC3339Nano), Source: src.stream, SourceSeq: int64(src.seq), SourceID: ev.ID()}
	switch d := d.(type) {
	case *lifecycle.Question:
		w.question(ctx, e, d)
	case *lifecycle.Cancelled:
		e.Kind = audit.KindCancelled
		e.DispatchID, e.ThreadID, e.Subagent, e.Round = d.DispatchID, d.ThreadID, d.Subagent, d.Round
		e.By, e.Reason = d.By, d.Reason
	case *lifecycle.Failed:
		if len(d.BelowFloor) == 0 {
			return nil, "", nil
		}
		// A dispatch refused by a worker's sandbox floor (docs/audit.md).
		e.Kind = audit.KindRefused
		e.DispatchID, e.ThreadID, e.Subagent, e.Round = d.DispatchID, d.ThreadID, d.Subagent, d.Round
		e.By, e.Reason, e.Detail = "worker:"+d.WorkerID, d.Detail, strings.Join(d.BelowFloor, "; ")
		if d.WorkerID == "" {
			e.By = "worker"
		}
	default:
		return nil, "", fmt.Errorf("unexpected %s event", ev.Type())
	}
	return e, ev.ID(), nil
}

// question fills e from a question event and its record.
func (w *writer) question(ctx context.Context, e *audit.Entry, q *lifecycle.Question) {
	e.Kind = string(q.Event)
	e.QuestionID, e.Route, e.Subagent, e.ThreadID, e.DispatchID = q.QuestionID, q.Route, q.Subagent, q.ThreadID, q.DispatchID
	e.Round, e.Escalation, e.Detail, e.JoinedTo = q.Round, q.Escalation, q.Detail, q.JoinedTo
	rec, found := w.record(ctx, q.QuestionID)
	e.RecordMissing = !found
	switch q.Event {
	case lifecycle.QuestionAsked, lifecycle.QuestionEscalated:
		if found {
			e.PartialStateDigest = w.partialState(ctx, rec)
		}
		e.ShownDigest = audit.ShownDigest(q.Question, q.Context, string(q.Kind), q.Options, e.PartialStateDigest)
	case lifecycle.QuestionAnswered:
		// What the question showed when answered, and what the answer was
		// bound to (docs/audit.md, "Bound answers").
		ps := ""
		if found {
			ps = w.partialState(ctx, rec)
		}
		e.ShownDigest, e.BoundDigest = audit.ShownDigest(q.Question, q.Context, string(q.Kind), q.Options, ps), rec.BoundDigest
		e.AnsweredBy, e.Answer, e.Decision = q.AnsweredBy, q.Answer, q.Decision
		e.Door = door(q, rec)
		if q.Reused != nil {
			e.ReusedQuestionID, e.ReusedAnsweredBy = q.Reused.QuestionID, q.Reused.AnsweredBy
		}
		if s := q.Suggestion; s != nil && s.Accepted {
			e.SuggestionBy, e.SuggestionConfidence = s.By, strconv.FormatFloat(s.Confidence, 'f', -1, 64)
		}
		e.Comment, e.Outcome, e.NextDispatchID = rec.Comment, rec.Outcome, rec.NextDispatchID
	case lifecycle.QuestionExpired:
		// A timeout: never an answer, whatever its action.
		e.Action, e.Outcome, e.NextDispatchID = rec.OnExpiry, rec.Outcome, rec.NextDispatchID
		if e.Action == "" && found {
			e.Action = "fail"
		}
		if q.AnsweredBy == defaultAnsweredBy {
			e.Answer, e.Decision = q.Answer, q.Decision
		}
	case lifecycle.QuestionWithdrawn:
		e.Outcome, e.NextDispatchID = rec.Outcome, rec.NextDispatchID
	case lifecycle.QuestionReversed:
		// Who reversed which suggestion, and the dispatches: from the
		// event's own snapshot, so a later change of the record cannot
		// move them.
		e.AnsweredBy, e.Answer, e.Decision, e.Comment = q.AnsweredBy, q.Answer, q.Decision, rec.Comment
		if s := q.Suggestion; s != nil {
			e.SuggestionBy, e.SuggestionConfidence = s.By, strconv.FormatFloat(s.Confidence, 'f', -1, 64)
		}
		if rv := q.Reversal; rv != nil {
			e.By, e.ReversedAnswer, e.CancelledDispatchID, e.NextDispatchID = rv.By, rv.SuggestionAnswer, rv.CancelledDispatchID, rv.NextDispatchID
		}
		e.Outcome, e.Door = rec.Outcome, "api-route agora.api.reverse."+q.Route
	}
	if e.JoinedTo != "" && q.Event == lifecycle.QuestionAnswered {
		e.Door = "join:" + q.JoinedTo
	}
}

// door names the way an accepted answer came: memory, suggestion, or the
// door of the accepted attempt in the record's history (api, api-route,
// stream, with its subject), led by the name the answer gave its door
// when it gave one: "inbox: api agora.api.answer".
func door(q *lifecycle.Question, rec record) string {
	switch {
	case strings.HasPrefix(q.AnsweredBy, memoryPrefix):
		return "memory"
	case strings.HasPrefix(q.AnsweredBy, suggestedPrefix):
		return "suggestion"
	}
	for i := len(rec.History) - 1; i >= 0; i-- {
		if a := rec.History[i]; a.Result == "accepted" {
			how := a.Via
			if a.Door != "" {
				how += " " + a.Door
			}
			if a.NamedDoor != "" {
				how = a.NamedDoor + ": " + how
			}
			return how
		}
	}
	return ""
}

// record reads the question record; false when it is gone (expired with
// its thread's retention before the writer read its event).
func (w *writer) record(ctx context.Context, qid string) (record, bool) {
	var r record
	if w.questions == nil {
		kv, err := w.js.KeyValue(ctx, lifecycle.BucketQuestions)
		if err != nil {
			return r, false
		}
		w.questions = kv
	}
	kve, err := w.questions.Get(ctx, qid)
	if err != nil {
		return r, false
	}
	if json.Unmarshal(kve.Value(), &r) != nil {
		return r, false
	}
	return r, true
}

// partialState is the digest of the question's partial state
// (statedigest.Of, as the router computes it). Never the state itself.
func (w *writer) partialState(ctx context.Context, rec record) string {
	return statedigest.Of(ctx, w.js, rec.PartialState, rec.PartialStateRef)
}
