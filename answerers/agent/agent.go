// Package agent is an Agora answerer that answers a question by
// dispatching a configured sub-agent.
//
// The answering sub-agent gets the question as its input
//
//	{"question": "…", "options": […], "context": "…", "kind": "…",
//	 "subagent": "<the asking sub-agent>", "question_id": "…",
//	 "thread_id": "…", "target": "…", "labels": {…}}
//
// and answers by writing .agora/output.json with an "answer" member (a
// string; any other JSON value is passed on as its JSON text) and,
// optionally, "decision" and "comment". When it also gives "confidence" (a
// number from 0 to 1, and optionally "rationale"), its answer is a
// suggestion (answerer.Suggest): the route takes it at or above its
// auto_accept, and otherwise hands the question to its fallback with the
// suggestion preselected (docs/router.md, "Ask once"). When it finishes
// without an answer, with a confidence outside 0 to 1, needs input itself,
// fails or is cancelled, the question is declined, so the route's fallback
// (typically a human) gets it.
//
// Serve it with pkg/answerer:
//
//	a, _ := agent.New(c, agent.Config{Subagent: "oracle"})
//	err := answerer.Serve(ctx, nc, "agents", a)
package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"time"

	"github.com/agora-dispatch/agora/pkg/answerer"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
)

// Config configures an Answerer.
type Config struct {
	// Subagent is the sub-agent dispatched to answer (required).
	Subagent string
	// Timeout bounds one answering dispatch: its request timeout and the
	// wait for its end. Default 10m.
	Timeout time.Duration
	// Labels are added to the answering dispatch.
	Labels map[string]string
}

// Answerer answers questions with a sub-agent. It is an answerer.Handler,
// safe for concurrent use.
type Answerer struct {
	c   *client.Client
	cfg Config
}

// New returns an Answerer dispatching cfg.Subagent through c.
func New(c *client.Client, cfg Config) (*Answerer, error) {
	if c == nil {
		return nil, errors.New("agent: nil client")
	}
	if !subagent.ValidName(cfg.Subagent) {
		return nil, fmt.Errorf("agent: sub-agent %q: want 1-64 letters, digits, '-' or '_'", cfg.Subagent)
	}
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("agent: timeout %s is negative", cfg.Timeout)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 10 * time.Minute
	}
	return &Answerer{c: c, cfg: cfg}, nil
}

// Input is the input of the answering dispatch.
type Input struct {
	Question   string            `json:"question"`
	Options    []string          `json:"options,omitempty"`
	Context    string            `json:"context,omitempty"`
	Kind       string            `json:"kind,omitempty"`
	Subagent   string            `json:"subagent"`
	QuestionID string            `json:"question_id"`
	ThreadID   string            `json:"thread_id"`
	Target     string            `json:"target,omitempty"`
	Labels     map[string]string `json:"labels,omitempty"`
}

// DispatchID is the id of the dispatch that answers q: derived from the
// question id and its escalation step, so a retried handler finds the
// same dispatch instead of starting another.
func DispatchID(q lifecycle.Question) string {
	h := sha256.Sum256([]byte(q.QuestionID + "#" + strconv.Itoa(q.Escalation)))
	return "ans-" + hex.EncodeToString(h[:16])
}

// Handle dispatches the answering sub-agent and waits for its end. It
// blocks until then, until the timeout (a decline) or until ctx ends (an
// error, so the question is handled again later).
func (a *Answerer) Handle(ctx context.Context, q lifecycle.Question) (answerer.Reply, error) {
	if q.Subagent == a.cfg.Subagent {
		// Its own question, routed back here: answering it would recurse.
		return answerer.Decline(fmt.Sprintf("sub-agent %s does not answer its own questions", a.cfg.Subagent)), nil
	}
	in, err := json.Marshal(Input{
		Question: q.Question, Options: q.Options, Context: q.Context, Kind: string(q.Kind), Subagent: q.Subagent,
		QuestionID: q.QuestionID, ThreadID: q.ThreadID, Target: q.Target, Labels: q.Labels,
	})
	if err != nil {
		return answerer.Reply{}, err
	}
	labels := maps.Clone(a.cfg.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	labels["agora.answers"] = q.QuestionID
	d, err := a.c.Dispatch(ctx, lifecycle.Request{
		DispatchID: DispatchID(q), Subagent: a.cfg.Subagent, Input: in, Target: q.Target,
		Labels: labels, Timeout: a.cfg.Timeout.String(),
	})
	switch {
	case errors.Is(err, client.ErrInvalidRequest):
		return answerer.Decline(fmt.Sprintf("cannot dispatch sub-agent %s: %v", a.cfg.Subagent, err)), nil
	case err != nil:
		return answerer.Reply{}, fmt.Errorf("agent: dispatch %s: %w", a.cfg.Subagent, err)
	}
	wctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
	defer cancel()
	res, err := a.end(wctx, d.DispatchID)
	if err != nil {
		if ctx.Err() != nil {
			return answerer.Reply{}, ctx.Err()
		}
		if errors.Is(err, context.DeadlineExceeded) {
			cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			_, _ = a.c.Cancel(cctx, d.DispatchID, client.CancelBy("answerer:agent", "no answer in time"))
			ccancel()
			return answerer.Decline(fmt.Sprintf("sub-agent %s did not answer within %s", a.cfg.Subagent, a.cfg.Timeout)), nil
		}
		return answerer.Reply{}, fmt.Errorf("agent: wait for %s: %w", d.DispatchID, err)
	}
	switch res.Kind {
	case lifecycle.KindFinished:
		return reply(a.cfg.Subagent, res.Output), nil
	case lifecycle.KindNeedsInput:
		// The answering thread is not continued: end it, so its own
		// question is withdrawn.
		a.endThread(ctx, d.DispatchID, d.ThreadID)
		return answerer.Decline(fmt.Sprintf("sub-agent %s needs input itself: %s", a.cfg.Subagent, res.Question)), nil
	case lifecycle.KindFailed:
		return answerer.Decline(fmt.Sprintf("sub-agent %s failed (%s): %s", a.cfg.Subagent, res.Reason, res.Detail)), nil
	case lifecycle.KindCancelled:
		return answerer.Decline(fmt.Sprintf("sub-agent %s was cancelled by %s", a.cfg.Subagent, res.By)), nil
	}
	return answerer.Reply{}, fmt.Errorf("agent: dispatch %s ended %s", d.DispatchID, res.Kind)
}

// end waits for dispatch id's end by reading its record (agora.api.status,
// on the answerer's own subject with AGORA_AGENT_CALLER): the answerer
// reads nothing of other threads, not even the lifecycle stream
// (docs/security.md, "What each NATS user of the deploy may do"). It asks
// every 100 ms at first, then every second.
func (a *Answerer) end(ctx context.Context, id string) (*client.Result, error) {
	every := 100 * time.Millisecond
	for {
		rec, err := a.c.Status(ctx, id)
		switch {
		case err == nil && rec.Terminal() && rec.Result != nil:
			return rec.Result, nil
		case err != nil && !errors.Is(err, client.ErrNotFound) && !errors.Is(err, client.ErrUnavailable) && ctx.Err() == nil:
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(every):
		}
		every = min(2*every, time.Second)
	}
}

// reply reads the answer from a finished dispatch's output: a suggestion
// when the output carries a confidence.
func reply(name string, output json.RawMessage) answerer.Reply {
	var out struct {
		Answer     json.RawMessage `json:"answer"`
		Decision   string          `json:"decision"`
		Comment    string          `json:"comment"`
		Confidence json.RawMessage `json:"confidence"`
		Rationale  string          `json:"rationale"`
	}
	if len(output) == 0 || json.Unmarshal(output, &out) != nil || len(out.Answer) == 0 || string(out.Answer) == "null" {
		return answerer.Decline(fmt.Sprintf("sub-agent %s finished without an answer in .agora/output.json", name))
	}
	var answer string
	if json.Unmarshal(out.Answer, &answer) != nil {
		answer = string(out.Answer)
	}
	if len(out.Confidence) == 0 || string(out.Confidence) == "null" {
		return answerer.Reply{Answer: answer, Decision: out.Decision, Comment: out.Comment}
	}
	var conf float64
	if json.Unmarshal(out.Confidence, &conf) != nil || conf < 0 || conf > 1 {
		return answerer.Decline(fmt.Sprintf("sub-agent %s gave confidence %s: want a number from 0 to 1", name, clipRaw(out.Confidence)))
	}
	r := answerer.Suggest(answer, conf, out.Rationale)
	r.Decision, r.Comment = out.Decision, out.Comment
	return r
}

// clipRaw is a JSON value's text, cut to a length fit for a reason.
func clipRaw(b json.RawMessage) string {
	if len(b) > 40 {
		return string(b[:40]) + "…"
	}
	return string(b)
}

// endThread cancels the thread of an answering dispatch paused on its own
// question. The dispatcher treats the cancel as that of a paused thread
// only once its record shows needs_input, so wait for that first (its
// projection of the lifecycle stream may lag behind the event).
func (a *Answerer) endThread(ctx context.Context, dispatchID, threadID string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
	defer cancel()
	for {
		rec, err := a.c.Status(ctx, dispatchID)
		if err == nil && rec.Status == lifecycle.KindNeedsInput {
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
	_, _ = a.c.CancelThread(ctx, threadID, client.CancelBy("answerer:agent", "the answering sub-agent asked a question itself"))
}
