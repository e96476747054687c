package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// Result is the structured outcome of agora_dispatch and agora_answer.
type Result struct {
	Status     string        `json:"status" jsonschema:"finished, failed, cancelled, needs_input, running or queued"`
	ThreadID   string        `json:"thread_id" jsonschema:"the thread: pass it to agora_dispatch, agora_status, agora_events or agora_cancel"`
	DispatchID string        `json:"dispatch_id,omitempty" jsonschema:"the thread's latest dispatch"`
	Round      int           `json:"round" jsonschema:"the latest round (0 is the first)"`
	Subagent   string        `json:"subagent,omitempty"`
	Output     any           `json:"output,omitempty" jsonschema:"finished: what the sub-agent wrote to its output file"`
	Reason     string        `json:"reason,omitempty" jsonschema:"failed: why (rejected, worker-failed, provider-failed, timeout, limit-exceeded, workspace-lost, …)"`
	Detail     string        `json:"detail,omitempty"`
	Artifacts  []ArtifactRef `json:"artifacts,omitempty" jsonschema:"files the latest round left, each readable with resources/read on its uri"`
	QuestionID string        `json:"question_id,omitempty" jsonschema:"needs_input: the question to answer with agora_answer"`
	Question   string        `json:"question,omitempty"`
	Options    []string      `json:"options,omitempty"`
	Kind       string        `json:"kind,omitempty" jsonschema:"the question's kind: clarification, decision, information or approval"`
	Context    string        `json:"context,omitempty"`
	// ThreadsWaiting and Suggestion are the question's: how many threads
	// one answer resumes, and an answerer's suggested answer.
	ThreadsWaiting int             `json:"threads_waiting,omitempty" jsonschema:"needs_input: how many threads wait on this question; one answer resumes them all"`
	Suggestion     *SuggestionItem `json:"suggestion,omitempty" jsonschema:"needs_input: an answerer's suggested answer, for a person to confirm or override"`
	Next           string          `json:"next,omitempty" jsonschema:"what to do next"`
}

// DispatchArgs are agora_dispatch's arguments.
type DispatchArgs struct {
	Subagent  string            `json:"subagent,omitempty" jsonschema:"the sub-agent to run (agora_subagents lists them); leave out when following thread_id"`
	Input     map[string]any    `json:"input,omitempty" jsonschema:"the task for the sub-agent, a JSON object (e.g. {\"task\": \"…\"})"`
	Labels    map[string]string `json:"labels,omitempty" jsonschema:"labels kept with the dispatch"`
	Timeout   string            `json:"timeout,omitempty" jsonschema:"the sub-agent's time limit per round, e.g. 10m (default: its definition's)"`
	MaxRounds int               `json:"max_rounds,omitempty" jsonschema:"how many rounds of questions the thread may take (default: the definition's)"`
	Wait      *bool             `json:"wait,omitempty" jsonschema:"follow the thread to its end (default true); false returns at once with status queued"`
	ThreadID  string            `json:"thread_id,omitempty" jsonschema:"keep following this thread (from an earlier status running or needs_input) instead of dispatching"`
}

func (t *tools) dispatch(ctx context.Context, req *mcp.CallToolRequest, in DispatchArgs) (*mcp.CallToolResult, *Result, error) {
	if req.Params.RequestState != "" {
		return t.resume(ctx, req)
	}
	threadID, err := t.begin(ctx, in)
	if err != nil {
		return nil, nil, err
	}
	if in.ThreadID == "" && in.Wait != nil && !*in.Wait {
		return nil, &Result{Status: "queued", ThreadID: threadID, DispatchID: threadID, Subagent: in.Subagent,
			Next: "call agora_dispatch with this thread_id to follow it, or agora_status to check on it"}, nil
	}
	return t.follow(ctx, req, threadID, "")
}

// begin checks agora_dispatch's arguments and returns the thread to
// follow: thread_id's, when the caller may see it, or that of a new
// dispatch of the sub-agent. Its errors are tool errors.
func (t *tools) begin(ctx context.Context, in DispatchArgs) (string, error) {
	switch {
	case in.ThreadID != "" && in.Subagent != "":
		return "", errors.New("give either subagent (to dispatch) or thread_id (to keep following a thread), not both")
	case in.ThreadID != "":
		if err := lifecycle.ValidToken(in.ThreadID); err != nil {
			return "", fmt.Errorf("thread_id %q is not a thread id", in.ThreadID)
		}
		if err := t.seeThread(ctx, in.ThreadID, false); err != nil {
			return "", err
		}
		return in.ThreadID, nil
	case in.Subagent == "":
		return "", errors.New("subagent is required: agora_subagents lists the sub-agents you can dispatch")
	}
	input := json.RawMessage(`{}`)
	if in.Input != nil {
		b, err := json.Marshal(in.Input)
		if err != nil {
			return "", fmt.Errorf("input: %v", err)
		}
		input = b
	}
	if !t.who.MayDispatch(in.Subagent) {
		return "", fmt.Errorf("principal %s may not dispatch sub-agent %q: its dispatch scope in AGORA_PRINCIPALS_FILE is %v", t.who.Name, in.Subagent, t.who.Dispatch)
	}
	var opts []client.DispatchOption
	if t.owned {
		opts = append(opts, client.OnBehalfOf(t.principal))
	}
	d, err := t.s.c.Dispatch(ctx, lifecycle.Request{Subagent: in.Subagent, Input: input, Labels: in.Labels, Timeout: in.Timeout, MaxRounds: in.MaxRounds}, opts...)
	if err != nil {
		return "", t.explain(err)
	}
	return d.ThreadID, nil
}

// follow reads the thread from its start until it ends, pauses on an open
// question (which it asks), or the wait cap passes. note, when set, goes
// in front of a question it asks (why it asks again).
func (t *tools) follow(ctx context.Context, req *mcp.CallToolRequest, threadID, note string) (*mcp.CallToolResult, *Result, error) {
	wctx, cancel := context.WithTimeout(ctx, t.s.cfg.WaitCap)
	defer cancel()
	p := t.progress(wctx, req)
	defer p.stop()
	if p.notify != nil {
		// The sub-agents' own progress reports go to the client too.
		pdone := make(chan struct{})
		go func() {
			defer close(pdone)
			for it, err := range t.s.c.WatchProgress(wctx, client.Filter{ThreadID: threadID}) {
				if err != nil {
					return
				}
				r := it.Progress
				p.set(fmt.Sprintf("%s round %d: %s", r.Subagent, r.Round, client.ProgressLine(r)))
			}
		}()
		defer func() { cancel(); <-pdone }()
	}
	last := &Result{Status: "running", ThreadID: threadID}
	for it, err := range t.s.c.Watch(wctx, client.Filter{ThreadID: threadID, FromStart: true}) {
		if err != nil {
			if ctx.Err() != nil {
				return nil, nil, ctx.Err()
			}
			if wctx.Err() != nil {
				break
			}
			return nil, nil, t.explain(err)
		}
		c := it.Data.Base()
		last.DispatchID, last.Round, last.Subagent = c.DispatchID, c.Round, c.Subagent
		p.set(fmt.Sprintf("%s round %d: %s", c.Subagent, c.Round, it.Kind()))
		switch d := it.Data.(type) {
		case *lifecycle.NeedsInput:
			q, open, err := t.openQuestion(wctx, d)
			if err != nil {
				return nil, nil, t.explain(err)
			}
			if open {
				p.stop()
				return t.ask(ctx, req, d, q, note)
			}
		default:
			if res, r, ok := ended(d); ok {
				return res, r, nil
			}
		}
	}
	if ctx.Err() != nil {
		return nil, nil, ctx.Err()
	}
	last.Status = "running"
	last.Next = fmt.Sprintf("still running after this call's wait cap (%s): call agora_dispatch with thread_id %q to keep following it", t.s.cfg.WaitCap, threadID)
	return nil, last, nil
}

// ended is agora_dispatch's result for the event that ended a thread
// (finished, failed or cancelled); ok is false for any other event.
func ended(d lifecycle.Lifecycle) (*mcp.CallToolResult, *Result, bool) {
	c := d.Base()
	r := &Result{ThreadID: c.ThreadID, DispatchID: c.DispatchID, Round: c.Round, Subagent: c.Subagent}
	switch d := d.(type) {
	case *lifecycle.Finished:
		r.Status, r.Output, r.Next = "finished", rawToAny(d.Output), "the thread is done"
	case *lifecycle.Failed:
		r.Status, r.Reason, r.Detail = "failed", string(d.Reason), d.Detail
		r.Next = "the thread ended failed; agora_events shows its history"
	case *lifecycle.Cancelled:
		r.Status, r.Detail, r.Next = "cancelled", strings.TrimSpace(d.By+": "+d.Reason), "the thread was cancelled"
		return nil, r, true
	default:
		return nil, nil, false
	}
	r.Artifacts = artifactRefs(c.DispatchID, d)
	return withLinks(r), r, true
}

// openQuestion reads the question of a needs_input: open reports that it
// still waits for an answer. The router makes the record just after the
// event; until it exists the event's own fields stand for it.
func (t *tools) openQuestion(ctx context.Context, d *lifecycle.NeedsInput) (lifecycle.Question, bool, error) {
	// A thread whose cancel was requested while it waited ends cancelled:
	// its question is being withdrawn, whatever its record says yet.
	if rec, err := t.s.c.Status(ctx, d.DispatchID); err == nil && rec.CancelRequested != nil {
		return lifecycle.Question{}, false, nil
	}
	deadline := time.Now().Add(questionGrace)
	for {
		q, found, err := t.waitedOn(ctx, d.QuestionID)
		if err != nil || found {
			return q, err == nil && q.Status == "asked", err
		}
		if time.Now().After(deadline) {
			return eventQuestion(d), true, nil
		}
		select {
		case <-ctx.Done():
			return lifecycle.Question{}, false, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// questionGrace is how long the router may take to record a question
// after its needs_input event; past it the event stands for the record.
const questionGrace = 5 * time.Second

// waitedOn reads the question a paused round waits on: its own, or the
// one it joined (asked once for every thread waiting on it, whose answer
// resumes this thread too). found is false while the router has not
// recorded it.
func (t *tools) waitedOn(ctx context.Context, qid string) (q lifecycle.Question, found bool, err error) {
	q, err = t.s.c.Question(ctx, qid)
	if err == nil && q.Status == lifecycle.StatusJoined && q.JoinedTo != "" {
		q, err = t.s.c.Question(ctx, q.JoinedTo)
		if err != nil {
			return lifecycle.Question{}, false, err
		}
	}
	switch {
	case errors.Is(err, client.ErrNotFound):
		return lifecycle.Question{}, false, nil
	case err != nil:
		return lifecycle.Question{}, false, err
	}
	return q, true, nil
}

// eventQuestion is the question a needs_input event asked, standing for
// its record while the router has none.
func eventQuestion(d *lifecycle.NeedsInput) lifecycle.Question {
	return lifecycle.Question{Common: d.Common, QuestionID: d.QuestionID, Status: "asked", Question: d.Question,
		Options: d.Options, Context: d.Context, Kind: d.Kind}
}

// progress sends MCP progress notifications while a call follows a
// thread: at once on each event, and every ProgressEvery while nothing
// happens, so a client's request timeout does not end a long wait.
type progress struct {
	mu     sync.Mutex
	msg    string
	n      float64
	notify func(string, float64)
	done   chan struct{}
	once   sync.Once
}

func (t *tools) progress(ctx context.Context, req *mcp.CallToolRequest) *progress {
	p := &progress{done: make(chan struct{})}
	token := req.Params.GetProgressToken()
	if token == nil {
		return p
	}
	p.notify = func(msg string, n float64) {
		_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: token, Message: msg, Progress: n})
	}
	go func() {
		tick := time.NewTicker(t.s.cfg.ProgressEvery)
		defer tick.Stop()
		for {
			select {
			case <-p.done:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
				p.mu.Lock()
				p.n++
				msg, n := p.msg, p.n
				p.mu.Unlock()
				p.notify(msg+" (waiting)", n)
			}
		}
	}()
	return p
}

func (p *progress) set(msg string) {
	if p.notify == nil {
		return
	}
	p.mu.Lock()
	p.msg = msg
	p.n++
	n := p.n
	p.mu.Unlock()
	p.notify(msg, n)
}

func (p *progress) stop() { p.once.Do(func() { close(p.done) }) }
