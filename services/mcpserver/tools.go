package mcpserver

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agora-dispatch/agora/internal/clip"
	"github.com/agora-dispatch/agora/internal/principal"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// mrtrProtocol is the first MCP protocol version with multi round-trip
// input-required results.
const mrtrProtocol = "2026-07-28"

// tools are the tool handlers of one principal's server.
type tools struct {
	s         *Service
	principal string
	// who is the principal and its scope (owner.go); owned records the
	// threads it dispatches as its own.
	who   *principal.Principal
	owned bool
}

// answeredBy is how answers given through this server are recorded.
func (t *tools) answeredBy() string { return "mcp:" + t.principal }

func (t *tools) register(srv *mcp.Server) {
	mcp.AddTool(srv, &mcp.Tool{Name: "agora_dispatch", Title: "Dispatch a sub-agent and follow it", Description: descDispatch}, t.dispatch)
	mcp.AddTool(srv, &mcp.Tool{Name: "agora_answer", Title: "Answer a sub-agent's question", Description: descAnswer}, t.answer)
	mcp.AddTool(srv, &mcp.Tool{Name: "agora_questions", Title: "List questions", Description: descQuestions, Annotations: readOnly()}, t.questions)
	mcp.AddTool(srv, &mcp.Tool{Name: "agora_status", Title: "Status of a thread or dispatch", Description: descStatus, Annotations: readOnly()}, t.status)
	mcp.AddTool(srv, &mcp.Tool{Name: "agora_cancel", Title: "Cancel a thread or dispatch", Description: descCancel}, t.cancel)
	mcp.AddTool(srv, &mcp.Tool{Name: "agora_events", Title: "A thread's lifecycle events", Description: descEvents, Annotations: readOnly()}, t.events)
	mcp.AddTool(srv, &mcp.Tool{Name: "agora_subagents", Title: "List sub-agents", Description: descSubagents, Annotations: readOnly()}, t.subagents)
	mcp.AddTool(srv, &mcp.Tool{Name: "agora_decisions", Title: "List remembered decisions", Description: descDecisions, Annotations: readOnly()}, t.decisions)
	mcp.AddTool(srv, &mcp.Tool{Name: "agora_forget_decision", Title: "Forget a remembered decision", Description: descForget,
		Annotations: &mcp.ToolAnnotations{DestructiveHint: new(true), IdempotentHint: true}}, t.forgetDecision)
	srv.AddResourceTemplate(&mcp.ResourceTemplate{URITemplate: artifactURIPrefix + "{dispatch_id}/{+name}", Name: "artifact",
		Title: "A file a sub-agent left", Description: "An artifact of a dispatch (agora_dispatch lists them as resource links); text as text, anything else as a blob, up to 8 MiB."}, t.readArtifact)
}

// artifactURIPrefix starts the URI of an artifact resource:
// agora://artifacts/<dispatch_id>/<name>.
const artifactURIPrefix = "agora://artifacts/"

// maxResourceBytes bounds an artifact read through MCP.
const maxResourceBytes = 8 << 20

// ArtifactRef is an artifact in a Result: read it with resources/read on
// its uri.
type ArtifactRef struct {
	Name        string `json:"name"`
	Size        int64  `json:"size"`
	ContentType string `json:"content_type"`
	SHA256      string `json:"sha256"`
	URI         string `json:"uri" jsonschema:"read it with resources/read"`
}

func artifactRefs(dispatchID string, d lifecycle.Data) []ArtifactRef {
	outs := lifecycle.RunOutputs(d)
	if outs == nil {
		return nil
	}
	var refs []ArtifactRef
	for _, a := range outs.Artifacts {
		refs = append(refs, ArtifactRef{Name: a.Name, Size: a.Size, ContentType: a.ContentType, SHA256: a.SHA256,
			URI: artifactURIPrefix + dispatchID + "/" + (&url.URL{Path: a.Name}).EscapedPath()})
	}
	return refs
}

// withLinks returns the tool result for r: its JSON as text, and a
// resource link per artifact.
func withLinks(r *Result) *mcp.CallToolResult {
	b, _ := json.Marshal(r)
	res := &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(b)}}}
	for _, a := range r.Artifacts {
		size := a.Size
		res.Content = append(res.Content, &mcp.ResourceLink{URI: a.URI, Name: a.Name, MIMEType: a.ContentType, Size: &size,
			Description: "an artifact of dispatch " + r.DispatchID})
	}
	return res
}

// readArtifact serves resources/read of an artifact URI.
func (t *tools) readArtifact(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	uri := req.Params.URI
	rest, ok := strings.CutPrefix(uri, artifactURIPrefix)
	id, escaped, ok2 := strings.Cut(rest, "/")
	name, err := url.PathUnescape(escaped)
	if !ok || !ok2 || err != nil || lifecycle.ValidToken(id) != nil || name == "" {
		return nil, mcp.ResourceNotFoundError(uri)
	}
	if err := t.seeDispatch(ctx, id, false); err != nil {
		return nil, mcp.ResourceNotFoundError(uri)
	}
	r, a, err := t.s.c.OpenArtifact(ctx, id, name)
	switch {
	case errors.Is(err, client.ErrNotFound), errors.Is(err, client.ErrNotEnded):
		return nil, mcp.ResourceNotFoundError(uri)
	case errors.Is(err, client.ErrArtifactExpired):
		return nil, fmt.Errorf("%s has expired (artifacts are kept as long as the lifecycle history)", uri)
	case err != nil:
		return nil, t.explain(err)
	}
	defer r.Close()
	if a.Size > maxResourceBytes {
		return nil, fmt.Errorf("%s is %d bytes, over the %d bytes served here: download it with `agora artifacts get %s %s`", uri, a.Size, maxResourceBytes, id, name)
	}
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", uri, err)
	}
	c := &mcp.ResourceContents{URI: uri, MIMEType: a.ContentType}
	if strings.Contains(a.ContentType, "charset=utf-8") || a.ContentType == "application/json" {
		c.Text = string(b)
	} else {
		c.Blob = b
	}
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{c}}, nil
}

func readOnly() *mcp.ToolAnnotations { return &mcp.ToolAnnotations{ReadOnlyHint: true} }

const (
	descDispatch  = `Run a sub-agent on a task and follow its thread to the end. Use it to hand work to a sub-agent (agora_subagents lists them). The sub-agent may stop to ask a question instead of guessing: you (or your user) are then asked for the answer through your client, and the thread resumes with it, possibly asking again in a later round. Returns the thread's outcome: status "finished" with the sub-agent's output, "failed" with a reason and detail, or "cancelled". Other statuses tell you what to do next: "needs_input" (your client cannot ask: answer with agora_answer, then call agora_dispatch again with the thread_id), "running" (the call's wait cap passed: call agora_dispatch again with the thread_id to keep following the same thread; it is not dispatched again), "queued" (wait was false). To keep following an existing thread, pass only thread_id.`
	descAnswer    = `Answer a question a sub-agent asked (agora_questions lists open ones; agora_dispatch returns status "needs_input" with the question_id). For a question with options, answer must be one of them; an approval question needs decision "approve" or "reject" (and an optional comment). The first valid answer wins: the thread then resumes as a new round; follow it with agora_dispatch and its thread_id. Fails if the question was already answered (saying by whom and when), expired, or the answer is invalid (listing the options).`
	descQuestions = `List questions sub-agents asked. By default the open ones (status "asked"); filter by route, status (asked, joined, answered, expired, withdrawn, all) or thread_id. Each has its question_id, the question, options, kind and context: answer one with agora_answer. A question several threads asked is listed once: threads_waiting says how many threads one answer resumes, and waiting_threads lists them; a joined question (status joined) waits on joined_to, the one to answer. suggestion is an answerer's suggested answer with its confidence, waiting for a person to confirm or override; reused names the remembered decision that answered a question.`
	descStatus    = `Show where a thread (thread_id) or one dispatch (dispatch_id) stands: every round with its status (accepted, started, needs_input, finished, failed, cancelled), the question a paused round asked, and the final output. Use it to check on work without waiting.`
	descCancel    = `Cancel a whole thread (thread_id) or one dispatch (dispatch_id): queued work never runs, running work is stopped, and a thread paused on a question ends with its question withdrawn. Give a reason. Cancelling something that already ended changes nothing and says so.`
	descEvents    = `List a thread's lifecycle events in order (accepted, started, needs_input, finished, failed, cancelled), each with its id, time, dispatch and round. Pass since (an event id from an earlier call) to get only later events.`
	descSubagents = `List the sub-agents Agora can run, with their descriptions, runtime, time limit and round limit. Use a name with agora_dispatch.`
	descDecisions = `List the decisions Agora remembers (on routes with remember in the routing file), newest first, optionally of one route: each answered a question once, and answers later matching questions at once (answered_by memory:<question_id>). Each has its id (for agora_forget_decision), route, what it matches (dedupe_key, or the sub-agent with question, options and kind), the answer, who gave it and when, and when it expires.`
	descForget    = `Forget one remembered decision (its id from agora_decisions): later questions that matched it are asked again. Threads it already answered are not changed. Use it when a remembered answer no longer holds.`
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
	threadID := in.ThreadID
	switch {
	case threadID != "" && in.Subagent != "":
		return nil, nil, errors.New("give either subagent (to dispatch) or thread_id (to keep following a thread), not both")
	case threadID != "":
		if err := lifecycle.ValidToken(threadID); err != nil {
			return nil, nil, fmt.Errorf("thread_id %q is not a thread id", threadID)
		}
		if err := t.seeThread(ctx, threadID, false); err != nil {
			return nil, nil, err
		}
	case in.Subagent == "":
		return nil, nil, errors.New("subagent is required: agora_subagents lists the sub-agents you can dispatch")
	default:
		input := json.RawMessage(`{}`)
		if in.Input != nil {
			b, err := json.Marshal(in.Input)
			if err != nil {
				return nil, nil, fmt.Errorf("input: %v", err)
			}
			input = b
		}
		if !t.who.MayDispatch(in.Subagent) {
			return nil, nil, fmt.Errorf("principal %s may not dispatch sub-agent %q: its dispatch scope in AGORA_PRINCIPALS_FILE is %v", t.who.Name, in.Subagent, t.who.Dispatch)
		}
		var opts []client.DispatchOption
		if t.owned {
			opts = append(opts, client.OnBehalfOf(t.principal))
		}
		d, err := t.s.c.Dispatch(ctx, lifecycle.Request{Subagent: in.Subagent, Input: input, Labels: in.Labels, Timeout: in.Timeout, MaxRounds: in.MaxRounds}, opts...)
		if err != nil {
			return nil, nil, t.explain(err)
		}
		threadID = d.ThreadID
		if in.Wait != nil && !*in.Wait {
			return nil, &Result{Status: "queued", ThreadID: threadID, DispatchID: threadID, Subagent: in.Subagent,
				Next: "call agora_dispatch with this thread_id to follow it, or agora_status to check on it"}, nil
		}
	}
	return t.follow(ctx, req, threadID, "")
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
		case *lifecycle.Finished:
			r := *last
			r.Status, r.Output, r.Next = "finished", rawToAny(d.Output), "the thread is done"
			r.Artifacts = artifactRefs(d.DispatchID, d)
			return withLinks(&r), &r, nil
		case *lifecycle.Failed:
			r := *last
			r.Status, r.Reason, r.Detail = "failed", string(d.Reason), d.Detail
			r.Next = "the thread ended failed; agora_events shows its history"
			r.Artifacts = artifactRefs(d.DispatchID, d)
			return withLinks(&r), &r, nil
		case *lifecycle.Cancelled:
			r := *last
			r.Status, r.Detail, r.Next = "cancelled", strings.TrimSpace(d.By+": "+d.Reason), "the thread was cancelled"
			return nil, &r, nil
		}
	}
	if ctx.Err() != nil {
		return nil, nil, ctx.Err()
	}
	last.Status = "running"
	last.Next = fmt.Sprintf("still running after this call's wait cap (%s): call agora_dispatch with thread_id %q to keep following it", t.s.cfg.WaitCap, threadID)
	return nil, last, nil
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
	deadline := time.Now().Add(5 * time.Second)
	for {
		q, err := t.s.c.Question(ctx, d.QuestionID)
		if err == nil && q.Status == lifecycle.StatusJoined && q.JoinedTo != "" {
			// The thread waits on the question its own joined: that one
			// is asked, and its answer resumes this thread too.
			if q, err = t.s.c.Question(ctx, q.JoinedTo); err != nil {
				return lifecycle.Question{}, false, err
			}
		}
		if err == nil {
			return q, q.Status == "asked", nil
		}
		if !errors.Is(err, client.ErrNotFound) {
			return lifecycle.Question{}, false, err
		}
		if time.Now().After(deadline) {
			return lifecycle.Question{Common: d.Common, QuestionID: d.QuestionID, Status: "asked", Question: d.Question,
				Options: d.Options, Context: d.Context, Kind: d.Kind}, true, nil
		}
		select {
		case <-ctx.Done():
			return lifecycle.Question{}, false, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// ask puts an open question to the client: an input-required result for
// clients of protocol 2026-07-28 that can elicit, an elicitation within
// this call for older ones, else a needs_input result.
func (t *tools) ask(ctx context.Context, req *mcp.CallToolRequest, d *lifecycle.NeedsInput, q lifecycle.Question, note string) (*mcp.CallToolResult, *Result, error) {
	ip := req.Session.InitializeParams()
	canElicit := ip != nil && ip.Capabilities != nil && ip.Capabilities.Elicitation != nil
	r := &Result{Status: "needs_input", ThreadID: d.ThreadID, DispatchID: d.DispatchID, Round: d.Round, Subagent: d.Subagent,
		QuestionID: q.QuestionID, Question: q.Question, Options: q.Options, Kind: q.Kind, Context: q.Context,
		ThreadsWaiting: max(1, len(q.WaitingThreads)), Suggestion: suggestionOf(q.Suggestion),
		Next: fmt.Sprintf("answer with agora_answer (question_id %q), then call agora_dispatch with thread_id %q to keep following", q.QuestionID, d.ThreadID)}
	r.Artifacts = artifactRefs(d.DispatchID, d)
	if !canElicit {
		return withLinks(r), r, nil
	}
	params := elicitFor(q, note)
	if len(r.Artifacts) > 0 {
		// What the person is asked about, e.g. the change to approve.
		var names []string
		for _, a := range r.Artifacts {
			names = append(names, a.Name+" ("+a.URI+")")
		}
		params.Message += "\n\nThe sub-agent left: " + strings.Join(names, ", ")
	}
	if ip.ProtocolVersion >= mrtrProtocol {
		st, err := t.s.seal.seal(state{ID: newStateID(), Principal: t.principal, ThreadID: d.ThreadID, QuestionID: q.QuestionID,
			Kind: q.Kind, Expires: time.Now().Add(t.s.cfg.StateTTL)})
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
	return t.answered(ctx, req, d.ThreadID, q.QuestionID, q.Kind, res)
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
	return t.answered(ctx, req, st.ThreadID, st.QuestionID, st.Kind, er)
}

// answered submits what the user gave for a question and keeps following
// the thread. A declined or cancelled elicitation leaves the question open.
func (t *tools) answered(ctx context.Context, req *mcp.CallToolRequest, threadID, qid, kind string, er *mcp.ElicitResult) (*mcp.CallToolResult, *Result, error) {
	if er == nil || er.Action != "accept" {
		action := "cancel"
		if er != nil {
			action = er.Action
		}
		return nil, &Result{Status: "needs_input", ThreadID: threadID, QuestionID: qid,
			Next: fmt.Sprintf("the user did not answer (%s); the question stays open: answer with agora_answer (question_id %q), cancel with agora_cancel, or call agora_dispatch with thread_id %q to be asked again", action, qid, threadID)}, nil
	}
	a := answerOf(er.Content, kind)
	a.AnsweredBy = t.answeredBy()
	_, err := t.s.c.Answer(ctx, qid, a)
	var ae *client.AnswerError
	switch {
	case err == nil:
	case errors.As(err, &ae) && ae.Reply.Status == client.AnswerAlreadyAnswered:
		// Someone else answered first: their answer resumes the thread.
	case errors.As(err, &ae) && ae.Reply.Status == client.AnswerInvalid:
		return t.follow(ctx, req, threadID, "Your answer was refused: "+ae.Reply.Reason)
	default:
		return nil, nil, t.explain(err)
	}
	return t.follow(ctx, req, threadID, "")
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
	case q.Kind == "approval":
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
		if q.Kind == "approval" {
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
	case q.Kind == "approval":
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

// AnswerArgs are agora_answer's arguments.
type AnswerArgs struct {
	QuestionID string `json:"question_id" jsonschema:"the question (agora_questions lists them)"`
	Answer     string `json:"answer,omitempty" jsonschema:"the answer: one of the options when the question has options"`
	Decision   string `json:"decision,omitempty" jsonschema:"approve or reject, for an approval question"`
	Comment    string `json:"comment,omitempty" jsonschema:"an optional comment kept with the answer"`
}

func (t *tools) answer(ctx context.Context, _ *mcp.CallToolRequest, in AnswerArgs) (*mcp.CallToolResult, *Result, error) {
	if err := lifecycle.ValidToken(in.QuestionID); err != nil || in.QuestionID == "" {
		return nil, nil, fmt.Errorf("question_id %q is not a question id: agora_questions lists them", in.QuestionID)
	}
	if in.Decision != "" && in.Decision != "approve" && in.Decision != "reject" {
		return nil, nil, fmt.Errorf("decision %q: want approve or reject", in.Decision)
	}
	var via []client.AnswerOption
	if !t.who.Admin && (!t.who.SeeAll || t.who.Answer != nil) {
		q, err := t.s.c.Question(ctx, in.QuestionID)
		if errors.Is(err, client.ErrNotFound) {
			return nil, nil, fmt.Errorf("no question %s: agora_questions lists them", in.QuestionID)
		} else if err != nil {
			return nil, nil, t.explain(err)
		}
		if err := t.seeQuestion(ctx, &q); err != nil {
			return nil, nil, err
		}
		if !t.who.MayAnswer(q.Route) {
			return nil, nil, fmt.Errorf("principal %s may not answer question %s: it is on route %s, and its answer scope is %v (AGORA_PRINCIPALS_FILE)", t.who.Name, in.QuestionID, q.Route, t.who.Answer)
		}
		if t.who.Answer != nil {
			// Through the route's door: the router refuses the answer
			// if the question moved off the route meanwhile.
			via = append(via, client.AnswerVia(q.Route))
		}
	}
	rep, err := t.s.c.Answer(ctx, in.QuestionID, lifecycle.Answer{Answer: in.Answer, Decision: in.Decision, Comment: in.Comment, AnsweredBy: t.answeredBy()}, via...)
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

// QuestionsArgs are agora_questions' arguments.
type QuestionsArgs struct {
	Route    string `json:"route,omitempty" jsonschema:"only questions on this route"`
	Status   string `json:"status,omitempty" jsonschema:"asked (default), joined, answered, expired, withdrawn or all"`
	ThreadID string `json:"thread_id,omitempty" jsonschema:"only this thread's questions"`
	Limit    int    `json:"limit,omitempty" jsonschema:"waiting questions per page: 1-1000, default 100"`
	Cursor   string `json:"cursor,omitempty" jsonschema:"next_cursor of the previous page of waiting questions"`
}

// QuestionList is agora_questions' result.
type QuestionList struct {
	Questions []QuestionItem `json:"questions"`
	// Count is how many waiting questions match, on every page (status
	// asked only).
	Count int `json:"count,omitempty"`
	// NextCursor continues a list of waiting questions; absent on the
	// last page.
	NextCursor string `json:"next_cursor,omitempty"`
}

// QuestionItem is one question in a QuestionList.
type QuestionItem struct {
	QuestionID string   `json:"question_id"`
	Status     string   `json:"status"`
	Route      string   `json:"route"`
	Kind       string   `json:"kind,omitempty"`
	Question   string   `json:"question"`
	Options    []string `json:"options,omitempty"`
	Context    string   `json:"context,omitempty"`
	Subagent   string   `json:"subagent"`
	ThreadID   string   `json:"thread_id"`
	Round      int      `json:"round"`
	AskedAt    string   `json:"asked_at"`
	Answer     string   `json:"answer,omitempty"`
	AnsweredBy string   `json:"answered_by,omitempty"`
	// The question asked once (docs/router.md, "Ask once").
	ThreadsWaiting int             `json:"threads_waiting,omitempty" jsonschema:"an asked question: how many threads wait on it; one answer resumes them all"`
	WaitingThreads []WaitingThread `json:"waiting_threads,omitempty" jsonschema:"the threads waiting on it, the asking thread first; absent when only the asking thread waits"`
	JoinedTo       string          `json:"joined_to,omitempty" jsonschema:"a joined question: the question it waits on and is answered with"`
	Suggestion     *SuggestionItem `json:"suggestion,omitempty" jsonschema:"an answerer's suggested answer"`
	Reused         *ReusedItem     `json:"reused,omitempty" jsonschema:"the remembered decision that answered it"`
}

// WaitingThread is one thread waiting on a question.
type WaitingThread struct {
	QuestionID string `json:"question_id" jsonschema:"the thread's own question (joined to this one, or this one)"`
	ThreadID   string `json:"thread_id"`
	DispatchID string `json:"dispatch_id"`
	Subagent   string `json:"subagent,omitempty"`
	AskedAt    string `json:"asked_at"`
}

// SuggestionItem is an answerer's suggested answer.
type SuggestionItem struct {
	Answer     string  `json:"answer"`
	Decision   string  `json:"decision,omitempty"`
	Confidence float64 `json:"confidence" jsonschema:"0 to 1"`
	Rationale  string  `json:"rationale,omitempty"`
	By         string  `json:"by" jsonschema:"the answerer that suggested it"`
	Accepted   bool    `json:"accepted" jsonschema:"true: it answered the question (its confidence reached the route's auto_accept); false: it waits for a person to confirm or override"`
}

// ReusedItem names the remembered decision that answered a question.
type ReusedItem struct {
	QuestionID string `json:"question_id" jsonschema:"the question whose answer was remembered"`
	AnsweredBy string `json:"answered_by"`
	AnsweredAt string `json:"answered_at"`
}

func suggestionOf(s *lifecycle.Suggestion) *SuggestionItem {
	if s == nil {
		return nil
	}
	return &SuggestionItem{Answer: s.Answer, Decision: s.Decision, Confidence: s.Confidence, Rationale: clip.String(s.Rationale, 2000), By: s.By, Accepted: s.Accepted}
}

func questionItem(q lifecycle.Question) QuestionItem {
	it := QuestionItem{QuestionID: q.QuestionID, Status: q.Status, Route: q.Route, Kind: q.Kind,
		Question: q.Question, Options: q.Options, Context: clip.String(q.Context, 2000), Subagent: q.Subagent, ThreadID: q.ThreadID,
		Round: q.Round, AskedAt: q.AskedAt.UTC().Format(time.RFC3339), Answer: cmp.Or(q.Answer, q.Decision), AnsweredBy: q.AnsweredBy,
		JoinedTo: q.JoinedTo, Suggestion: suggestionOf(q.Suggestion)}
	if q.Status == "asked" {
		it.ThreadsWaiting = max(1, len(q.WaitingThreads))
	}
	for _, w := range q.WaitingThreads {
		it.WaitingThreads = append(it.WaitingThreads, WaitingThread{QuestionID: w.QuestionID, ThreadID: w.ThreadID, DispatchID: w.DispatchID,
			Subagent: w.Subagent, AskedAt: w.AskedAt.UTC().Format(time.RFC3339)})
	}
	if r := q.Reused; r != nil {
		it.Reused = &ReusedItem{QuestionID: r.QuestionID, AnsweredBy: r.AnsweredBy, AnsweredAt: r.AnsweredAt.UTC().Format(time.RFC3339)}
	}
	return it
}

func (t *tools) questions(ctx context.Context, _ *mcp.CallToolRequest, in QuestionsArgs) (*mcp.CallToolResult, *QuestionList, error) {
	f := client.QuestionFilter{Route: in.Route, Status: in.Status, ThreadID: in.ThreadID}
	switch in.Status {
	case "":
		f.Status = "asked"
	case "all":
		f.Status = ""
	case "asked", lifecycle.StatusJoined, "answered", "expired", "withdrawn":
	default:
		return nil, nil, fmt.Errorf("status %q: want asked, joined, answered, expired, withdrawn or all", in.Status)
	}
	if in.Limit < 0 || in.Limit > client.MaxWaitingLimit {
		return nil, nil, fmt.Errorf("limit %d: want 1 to %d (default %d)", in.Limit, client.MaxWaitingLimit, client.DefaultWaitingLimit)
	}
	if f.Status != "asked" && (in.Cursor != "" || in.Limit != 0) {
		return nil, nil, fmt.Errorf("limit and cursor page waiting questions (status asked), not status %q", in.Status)
	}
	own := !t.who.Admin && !t.who.SeeAll
	if own && (in.Cursor != "" || in.Limit != 0) {
		return nil, nil, fmt.Errorf("principal %s lists the questions of its own threads whole: leave out limit and cursor", t.who.Name)
	}
	out := &QuestionList{Questions: []QuestionItem{}}
	var qs []lifecycle.Question
	var err error
	if f.Status == "asked" && !own {
		// A page at a time from the router's index of waiting questions
		// (docs/mcp.md); the bucket whole only when no router answers.
		var p *client.WaitingPage
		if p, err = t.s.c.Waiting(ctx, f, in.Limit, in.Cursor); err == nil {
			qs, out.Count, out.NextCursor = p.Questions, p.Count, p.NextCursor
		} else if errors.Is(err, client.ErrUnavailable) && in.Cursor == "" {
			qs, err = t.s.c.Questions(ctx, f)
			out.Count = len(qs)
		}
	} else {
		qs, err = t.s.c.Questions(ctx, f)
	}
	if err != nil {
		return nil, nil, t.explain(err)
	}
	if own {
		if qs, err = t.filterQuestions(ctx, qs); err != nil {
			return nil, nil, err
		}
		out.Count = len(qs)
	}
	for _, q := range qs {
		out.Questions = append(out.Questions, questionItem(q))
	}
	return nil, out, nil
}

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

// EventsArgs are agora_events' arguments.
type EventsArgs struct {
	ThreadID string `json:"thread_id" jsonschema:"the thread"`
	Since    string `json:"since,omitempty" jsonschema:"only events after the event with this id (from an earlier call)"`
}

// EventList is agora_events' result.
type EventList struct {
	Events []EventItem `json:"events"`
}

// EventItem is one lifecycle event.
type EventItem struct {
	ID         string `json:"id"`
	Kind       string `json:"kind"`
	Time       string `json:"time"`
	DispatchID string `json:"dispatch_id"`
	Round      int    `json:"round"`
	Summary    string `json:"summary,omitempty"`
}

func (t *tools) events(ctx context.Context, _ *mcp.CallToolRequest, in EventsArgs) (*mcp.CallToolResult, *EventList, error) {
	if err := lifecycle.ValidToken(in.ThreadID); err != nil || in.ThreadID == "" {
		return nil, nil, fmt.Errorf("thread_id %q is not a thread id", in.ThreadID)
	}
	th, err := t.s.c.Thread(ctx, in.ThreadID)
	if err != nil {
		return nil, nil, t.explainTarget(err, "thread", in.ThreadID)
	}
	if err := t.seeRead(th); err != nil {
		return nil, nil, err
	}
	var all []EventItem
	for _, rd := range th.Rounds {
		for _, e := range rd.Events {
			d, err := lifecycle.Parse(e)
			if err != nil {
				continue
			}
			l, ok := d.(lifecycle.Lifecycle)
			if !ok {
				continue
			}
			all = append(all, EventItem{ID: e.ID(), Kind: string(l.LifecycleKind()), Time: e.Time().UTC().Format(time.RFC3339Nano),
				DispatchID: rd.DispatchID, Round: rd.Round, Summary: summary(d)})
		}
	}
	if in.Since != "" {
		i := slices.IndexFunc(all, func(e EventItem) bool { return e.ID == in.Since })
		if i < 0 {
			return nil, nil, fmt.Errorf("since %q is not an event of thread %s", in.Since, in.ThreadID)
		}
		all = all[i+1:]
	}
	if all == nil {
		all = []EventItem{}
	}
	return nil, &EventList{Events: all}, nil
}

// SubagentList is agora_subagents' result.
type SubagentList struct {
	Subagents []SubagentItem `json:"subagents"`
}

// SubagentItem is one sub-agent definition, as an orchestrator needs it.
type SubagentItem struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	Runtime     string `json:"runtime"`
	Timeout     string `json:"timeout"`
	MaxRounds   int    `json:"max_rounds"`
}

func (t *tools) subagents(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, *SubagentList, error) {
	all, err := t.s.c.Subagents(ctx)
	var ue *client.UndecodableError
	if err != nil && !errors.As(err, &ue) {
		return nil, nil, t.explain(err)
	}
	out := &SubagentList{Subagents: []SubagentItem{}}
	for _, sa := range all {
		d := sa.Definition
		out.Subagents = append(out.Subagents, SubagentItem{Name: sa.Name, Description: d.Description, Runtime: d.Runtime,
			Timeout: d.TimeoutDuration().String(), MaxRounds: d.Rounds()})
	}
	return nil, out, nil
}

// explain turns an Agora error into a tool error that says what to do.
func (t *tools) explain(err error) error {
	var p *client.Problem
	var de *client.DispatchError
	switch {
	case errors.As(err, &p) && len(p.Errors) > 0:
		var parts []string
		for _, fe := range p.Errors {
			parts = append(parts, fe.Field+": "+fe.Message)
		}
		msg := "refused: " + strings.Join(parts, "; ")
		if p.Field("subagent") != "" {
			msg += " (agora_subagents lists the sub-agents that exist)"
		}
		return errors.New(msg)
	case errors.As(err, &de) && errors.Is(err, client.ErrUnavailable):
		return fmt.Errorf("Agora could not take the dispatch just now (%v); it may have been recorded as %s: call agora_status with dispatch_id %q before dispatching again", de.Err, de.DispatchID, de.DispatchID)
	case errors.As(err, &de) && de.Unanswered:
		return fmt.Errorf("Agora did not answer the dispatch in time (%v); it may have been accepted as %s: call agora_status with dispatch_id %q before dispatching again", de.Err, de.DispatchID, de.DispatchID)
	case errors.Is(err, client.ErrUnavailable), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("Agora is not reachable right now (%v): is agora dev (or the dispatcher and router) running? Try again shortly", err)
	}
	return err
}

func (t *tools) explainTarget(err error, what, id string) error {
	if errors.Is(err, client.ErrNotFound) {
		return fmt.Errorf("no %s %q: agora_questions or agora_status with a known id shows what exists", what, id)
	}
	return t.explain(err)
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

// summary is a one-line account of an event.
func summary(d lifecycle.Data) string {
	switch v := d.(type) {
	case *lifecycle.Started:
		return fmt.Sprintf("attempt %d on %s", v.Attempt, v.WorkerID)
	case *lifecycle.NeedsInput:
		return "asked " + clip.String(v.Question, 200)
	case *lifecycle.Finished:
		return fmt.Sprintf("exit %d in %dms", v.ExitCode, v.DurationMS)
	case *lifecycle.Failed:
		return string(v.Reason) + ": " + clip.String(v.Detail, 200)
	case *lifecycle.Cancelled:
		return strings.TrimSpace("by " + v.By + " " + v.Reason)
	}
	return ""
}

func rawToAny(b json.RawMessage) any {
	if len(b) == 0 || string(b) == "null" {
		return nil
	}
	var v any
	if json.Unmarshal(b, &v) != nil {
		return string(b)
	}
	return v
}
