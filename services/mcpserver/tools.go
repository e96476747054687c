package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agora-dispatch/agora/internal/principal"
	"github.com/agora-dispatch/agora/pkg/client"
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
