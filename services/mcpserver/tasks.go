package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// The MCP Tasks extension (SEP-2663), served by hand beside the SDK's
// handlers, which do not know it (docs/mcp.md, "Tasks"). A task is an
// Agora thread: its id is the thread id, and its state is read from the
// thread's records and its question's record at every tasks/get, so it
// outlives the connection and the server that made it. A task is its
// principal's alone; to anyone else it does not exist.

// tasksExtension names the extension in capabilities.
const tasksExtension = "io.modelcontextprotocol/tasks"

// The extension's methods.
const (
	methodTasksGet    = "tasks/get"
	methodTasksUpdate = "tasks/update"
	methodTasksCancel = "tasks/cancel"
)

// taskPollInterval is the pollIntervalMs every task suggests.
const taskPollInterval = 2 * time.Second

// The task statuses (SEP-2663, "Task Status").
const (
	taskWorking       = "working"
	taskInputRequired = "input_required"
	taskCompleted     = "completed"
	taskCancelled     = "cancelled"
)

// task is the extension's DetailedTask: the Task with the fields of its
// status. As a CreateTaskResult its resultType is "task", as a
// GetTaskResult "complete".
type task struct {
	ResultType     string              `json:"resultType"`
	TaskID         string              `json:"taskId"`
	Status         string              `json:"status"`
	StatusMessage  string              `json:"statusMessage,omitempty"`
	CreatedAt      string              `json:"createdAt"`
	LastUpdatedAt  string              `json:"lastUpdatedAt"`
	TTLMs          *int64              `json:"ttlMs"` // null while the thread runs: it does not expire
	PollIntervalMs int64               `json:"pollIntervalMs,omitempty"`
	InputRequests  mcp.InputRequestMap `json:"inputRequests,omitempty"`
	Result         *mcp.CallToolResult `json:"result,omitempty"`

	// asked is the question an input_required task waits on.
	asked *lifecycle.Question
}

// ack is the empty result of tasks/update and tasks/cancel.
type ack struct {
	ResultType string `json:"resultType"`
}

func newAck() ack { return ack{ResultType: "complete"} }

// taskCall reports whether the extension serves req rather than the SDK:
// tasks/get, tasks/update and tasks/cancel, and an agora_dispatch call
// from a client that declares the extension on it (a call answering an
// input-required result stays the SDK's).
func taskCall(req *jsonrpc.Request) bool {
	if !req.IsCall() {
		return false
	}
	switch req.Method {
	case methodTasksGet, methodTasksUpdate, methodTasksCancel:
		return true
	case "tools/call":
		var p struct {
			Name         string `json:"name"`
			RequestState string `json:"requestState"`
		}
		return json.Unmarshal(req.Params, &p) == nil && p.Name == "agora_dispatch" && p.RequestState == "" && declaresTasks(req.Params)
	}
	return false
}

// declaresTasks reports whether a request's params declare the extension
// in their per-request client capabilities (_meta).
func declaresTasks(params json.RawMessage) bool {
	var p struct {
		Meta map[string]json.RawMessage `json:"_meta"`
	}
	if json.Unmarshal(params, &p) != nil {
		return false
	}
	var caps struct {
		Extensions map[string]json.RawMessage `json:"extensions"`
	}
	if json.Unmarshal(p.Meta[mcp.MetaKeyClientCapabilities], &caps) != nil {
		return false
	}
	v := bytes.TrimSpace(caps.Extensions[tasksExtension])
	return len(v) > 0 && v[0] == '{'
}

// respond serves req, one taskCall, and returns its response: the
// method's result, or the JSON-RPC error it ends in.
func (t *tools) respond(ctx context.Context, req *jsonrpc.Request) *jsonrpc.Response {
	res, err := t.serveTask(ctx, req.Method, req.Params)
	if err == nil {
		var b []byte
		if b, err = json.Marshal(res); err == nil {
			return &jsonrpc.Response{ID: req.ID, Result: b}
		}
	}
	var we *jsonrpc.Error
	if !errors.As(err, &we) {
		we = &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: err.Error()}
	}
	return &jsonrpc.Response{ID: req.ID, Error: we}
}

func (t *tools) serveTask(ctx context.Context, method string, params json.RawMessage) (any, error) {
	if !declaresTasks(params) {
		data, _ := json.Marshal(map[string]any{"requiredCapabilities": map[string]any{"extensions": map[string]any{tasksExtension: map[string]any{}}}})
		return nil, &jsonrpc.Error{Code: mcp.CodeMissingRequiredClientCapabilities, Data: data,
			Message: fmt.Sprintf("Missing required client capability: %s needs the %s extension in the request's _meta %s", method, tasksExtension, mcp.MetaKeyClientCapabilities)}
	}
	switch method {
	case "tools/call":
		return t.createTask(ctx, params)
	case methodTasksGet:
		return t.getTask(ctx, params)
	case methodTasksUpdate:
		return t.updateTask(ctx, params)
	case methodTasksCancel:
		return t.cancelTask(ctx, params)
	}
	return nil, &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: "method not found: " + method}
}

// invalidParams is the protocol's error for bad params.
func invalidParams(format string, args ...any) error {
	return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf(format, args...)}
}

// internalError is the protocol's error for Agora failing to answer.
func internalError(err error) error {
	return &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: err.Error()}
}

// taskNotFound is the error for a task that does not exist, has expired
// or is another principal's: the same in every case, so that it tells
// nothing of other principals' tasks.
func taskNotFound(verb, id string) error {
	return invalidParams("Failed to %s task: Task not found (%q is no task of yours: unknown, expired with its thread's records, or not yours)", verb, id)
}

// createTask dispatches (or picks up, with thread_id) the thread of an
// agora_dispatch call and returns its task at once. Bad arguments are
// tool errors, as the call without the extension answers them.
func (t *tools) createTask(ctx context.Context, params json.RawMessage) (any, error) {
	var p struct {
		Arguments json.RawMessage `json:"arguments"`
	}
	if err := json.Unmarshal(params, &p); err != nil {
		return nil, invalidParams("tools/call: params: %v", err)
	}
	var in DispatchArgs
	if len(p.Arguments) > 0 {
		dec := json.NewDecoder(bytes.NewReader(p.Arguments))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&in); err != nil {
			return toolError(fmt.Errorf("arguments: %v", err)), nil
		}
	}
	threadID, err := t.begin(ctx, in)
	if err != nil {
		return toolError(err), nil
	}
	th, err := t.taskThread(ctx, "create", threadID)
	if err != nil && in.ThreadID != "" {
		return toolError(t.explainTarget(client.ErrNotFound, "thread", threadID)), nil
	}
	if err != nil {
		// The dispatcher records a thread before it answers the dispatch;
		// the handle goes out only once tasks/get finds it, as the
		// extension asks.
		if th, err = t.settled(ctx, threadID); err != nil {
			return nil, err
		}
	}
	tk, err := t.taskOf(ctx, th)
	if err != nil {
		return nil, internalError(t.explain(err))
	}
	tk.ResultType = "task"
	t.s.log.Info("mcp task", "thread_id", threadID, "principal", t.principal, "status", tk.Status)
	return tk, nil
}

// settled reads the thread of a task just created until its records are
// found, for at most questionGrace.
func (t *tools) settled(ctx context.Context, id string) (*client.Thread, error) {
	deadline := time.Now().Add(questionGrace)
	for {
		th, err := t.taskThread(ctx, "create", id)
		if err == nil || time.Now().After(deadline) {
			return th, err
		}
		select {
		case <-ctx.Done():
			return nil, internalError(ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// toolError is the result of a tool call that failed.
func toolError(err error) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: err.Error()}}, IsError: true}
}

// taskParams are the params of tasks/get, tasks/update and tasks/cancel.
type taskParams struct {
	TaskID         string               `json:"taskId"`
	InputResponses mcp.InputResponseMap `json:"inputResponses"`
}

// readTask decodes params and reads the thread of their task.
func (t *tools) readTask(ctx context.Context, method, verb string, params json.RawMessage) (taskParams, *client.Thread, error) {
	var p taskParams
	if err := json.Unmarshal(params, &p); err != nil {
		return p, nil, invalidParams("%s: params: %v", method, err)
	}
	if p.TaskID == "" {
		return p, nil, invalidParams("%s: params.taskId is required (the taskId of the CreateTaskResult)", method)
	}
	th, err := t.taskThread(ctx, verb, p.TaskID)
	return p, th, err
}

func (t *tools) getTask(ctx context.Context, params json.RawMessage) (any, error) {
	_, th, err := t.readTask(ctx, methodTasksGet, "retrieve", params)
	if err != nil {
		return nil, err
	}
	tk, err := t.taskOf(ctx, th)
	if err != nil {
		return nil, internalError(t.explain(err))
	}
	return tk, nil
}

// taskThread reads the thread of task id: the not-found error when there
// is none or it is not the caller's. On a server that authenticates its
// callers a task is its dispatcher's alone; on one that does not (stdio,
// or HTTP without tokens) the caller holds the NATS credentials already
// and sees what its scope sees.
func (t *tools) taskThread(ctx context.Context, verb, id string) (*client.Thread, error) {
	if lifecycle.ValidToken(id) != nil {
		return nil, taskNotFound(verb, id)
	}
	th, err := t.s.c.Thread(ctx, id)
	switch {
	case errors.Is(err, client.ErrNotFound):
		return nil, taskNotFound(verb, id)
	case err != nil:
		return nil, internalError(t.explain(err))
	case th.ThreadID != id || len(th.Rounds) == 0 || th.Rounds[0].Round != 0:
		return nil, taskNotFound(verb, id)
	}
	owner := th.Rounds[0].Principal
	if t.owned && owner != t.principal || !t.owned && !t.who.MaySee(owner) {
		return nil, taskNotFound(verb, id)
	}
	return th, nil
}
