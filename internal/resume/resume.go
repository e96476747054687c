// Package resume derives a thread's next round from its answered question
// record (docs/wire.md, "Re-dispatch"). The router publishes the
// round this derivation makes; the dispatcher accepts a later round only
// as the same derivation of the record makes it, so no request — whatever
// door or credentials it comes with — can resume a thread with an answer
// nobody gave, resume another thread, or name who answered
// (docs/security.md, "A resume only the router can make").
package resume

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// OutcomeRedispatched is Record.Outcome once the question's answer (a
// person's, an answerer's, memory's or an expiry default) resumes its
// thread.
const OutcomeRedispatched = "redispatched"

// Record is the part of a question record (the value under the question id
// in agora_questions, written by the router alone) a resume is made from.
// The router's own record embeds it, so both read the same JSON.
type Record struct {
	lifecycle.Question

	// PartialState is the sub-agent's state when it travelled inline;
	// otherwise PartialStateRef names the object in agora_state.
	PartialState    json.RawMessage `json:"partial_state,omitempty"`
	PartialStateRef string          `json:"partial_state_ref,omitempty"`
	// Request holds the paused dispatch's request settings the
	// re-dispatch copies (input, target, env, labels, timeout,
	// max_rounds), read from its dispatch record when the question was
	// asked; nil when there was none.
	Request   *lifecycle.Request `json:"request,omitempty"`
	MaxRounds int                `json:"max_rounds"`

	Comment string `json:"comment,omitempty"`
	// NextDispatchID is the thread's next dispatch: the re-dispatch, or
	// the dispatch id whose only event ends the thread (failed unanswered
	// or max-rounds, cancelled). Chosen once, by the compare-and-set that
	// ends the question, so a retried publish is a duplicate.
	NextDispatchID string `json:"next_dispatch_id,omitempty"`
	// Outcome says how the thread went on: redispatched, failed:unanswered,
	// failed:max-rounds, cancelled or withdrawn.
	Outcome string `json:"outcome,omitempty"`
}

// Build returns the re-dispatch of r's thread: the original request's
// settings, the thread's ids, and input = original input + answer,
// answered_by, decision, comment and the partial state (inline, or by
// reference in partial_state_ref for the worker to resolve).
func Build(r *Record) (*lifecycle.Request, error) {
	req := &lifecycle.Request{
		DispatchID: r.NextDispatchID, Subagent: r.Subagent, MaxRounds: r.MaxRounds,
		ThreadID: r.ThreadID, ParentID: r.DispatchID, Round: r.Round + 1, QuestionID: r.QuestionID,
		PartialStateRef: r.PartialStateRef,
	}
	var orig json.RawMessage
	if o := r.Request; o != nil {
		req.Target, req.Env, req.Labels, req.Timeout = o.Target, o.Env, o.Labels, o.Timeout
		if o.MaxRounds > 0 {
			req.MaxRounds = o.MaxRounds
		}
		orig = o.Input
	}
	in := map[string]json.RawMessage{}
	if t := strings.TrimSpace(string(orig)); t != "" && t != "null" {
		// The dispatcher accepts only objects; anything else is dropped
		// rather than leaving the question unable to resume.
		if json.Unmarshal(orig, &in) != nil {
			in = map[string]json.RawMessage{}
		}
	}
	// What an earlier round added goes; this round's answer replaces it.
	for _, k := range []string{"answer", "answered_by", "decision", "comment", "partial_state"} {
		delete(in, k)
	}
	str := func(s string) json.RawMessage { b, _ := json.Marshal(s); return b }
	in["answer"] = str(r.Answer)
	in["answered_by"] = str(r.AnsweredBy)
	if r.Decision != "" {
		in["decision"] = str(r.Decision)
	}
	if r.Comment != "" {
		in["comment"] = str(r.Comment)
	}
	if len(r.PartialState) > 0 && r.PartialStateRef == "" {
		in["partial_state"] = r.PartialState
	}
	b, err := json.Marshal(in)
	if err != nil {
		return nil, fmt.Errorf("resume: question %s: encode input: %w", r.QuestionID, err)
	}
	req.Input = b
	return req, nil
}

// ErrNotAResume is the error Check wraps when a later round's request is
// not the resume its question record makes.
var ErrNotAResume = errors.New("not the resume of an answered question")

// Check reports whether a later round's request (round > 0) is the resume
// of the answered question record r: the question the request names is
// the parent dispatch's, answered and resumed by the router into exactly
// this dispatch id of this thread. It says why not, wrapping
// ErrNotAResume. The request's own input, env and other settings are not
// compared: the accepted request is Build(r), not the one received.
func Check(r *Record, req *lifecycle.Request) error {
	qid := lifecycle.QuestionID(req.ParentID)
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrNotAResume}, a...)...)
	}
	switch {
	case req.QuestionID != "" && req.QuestionID != qid:
		return bad("question_id %q is not the question of parent_id %q (%s)", req.QuestionID, req.ParentID, qid)
	case r.QuestionID != qid || r.DispatchID != req.ParentID:
		return bad("question %s is not parent_id %q's", r.QuestionID, req.ParentID)
	case r.ThreadID != req.ThreadID:
		return bad("question %s belongs to another thread than thread_id %q", qid, req.ThreadID)
	case r.Outcome != OutcomeRedispatched || r.NextDispatchID == "":
		return bad("question %s has not resumed its thread (status %s)", qid, r.Status)
	case r.NextDispatchID != req.DispatchID:
		return bad("question %s resumed its thread as another dispatch than dispatch_id %q", qid, req.DispatchID)
	case r.Round+1 != req.Round:
		return bad("question %s was asked in round %d: its resume is round %d, not %d", qid, r.Round, r.Round+1, req.Round)
	}
	return nil
}
