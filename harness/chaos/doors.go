package chaos

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2aclient"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// The doors a thread of the soak goes through (docs/chaos.md, "The
// doors"): the client API (dispatched over NATS, answered through the
// router's answer API), the A2A agent, and the MCP server's Tasks
// extension.
const (
	doorAPI = "api"
	doorA2A = "a2a"
	doorMCP = "mcp"
)

// doorOf is the door thread i of the soak goes through: one in five
// through A2A, one in five through MCP Tasks, the rest through the API.
func doorOf(i int) string {
	switch i % 5 {
	case 1:
		return doorA2A
	case 3:
		return doorMCP
	}
	return doorAPI
}

// doorCall bounds one request to a door: a door killed while it holds
// one never answers it.
const doorCall = 10 * time.Second

// freeAddr is a loopback address nobody listens on, for a door's
// process: it keeps it across its restarts.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// errRefused is a door's refusal of an answer (A2A InvalidParams, MCP
// -32602): the caller's error, not a door that is down.
var errRefused = errors.New("refused")

// taskEnd is how a door reports a thread's end: its state as the door
// names it, and the output it shows (the finished round's).
type taskEnd struct {
	state  string
	output json.RawMessage
}

// door is a client of one door of the soak's.
type door interface {
	// dispatch starts a chaos thread and returns its id (the task's).
	dispatch(ctx context.Context) (string, error)
	// answer answers question qid of thread (its task) with yes; a
	// refusal wraps errRefused.
	answer(ctx context.Context, thread, qid string) error
	// waiting reports whether the door shows thread waiting on qid.
	waiting(ctx context.Context, thread, qid string) (bool, error)
	// end reads the task of thread as the door reports it.
	end(ctx context.Context, thread string) (taskEnd, error)
}

// a2aDoor drives the A2A agent with a2a-go's client over the JSON-RPC
// binding, as the local principal (the door has no tokens in the soak).
type a2aDoor struct{ c *a2aclient.Client }

func newA2ADoor(ctx context.Context, base string) (*a2aDoor, error) {
	hc := &http.Client{Timeout: doorCall}
	c, err := a2aclient.NewFromEndpoints(ctx, []*a2a.AgentInterface{a2a.NewAgentInterface(base+"/a2a", a2a.TransportProtocolJSONRPC)},
		a2aclient.WithJSONRPCTransport(hc))
	if err != nil {
		return nil, fmt.Errorf("chaos: a2a client: %w", err)
	}
	return &a2aDoor{c: c}, nil
}

func (d *a2aDoor) close() { _ = d.c.Destroy() }

func (d *a2aDoor) dispatch(ctx context.Context) (string, error) {
	m := a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart("go on"))
	m.Metadata = map[string]any{"skill": "chaos"}
	res, err := d.c.SendMessage(ctx, &a2a.SendMessageRequest{Message: m, Config: &a2a.SendMessageConfig{ReturnImmediately: true}})
	if err != nil {
		return "", a2aErr(err)
	}
	t, ok := res.(*a2a.Task)
	if !ok || t.ID == "" {
		return "", fmt.Errorf("SendMessage answered %T, want a task", res)
	}
	return string(t.ID), nil
}

func (d *a2aDoor) answer(ctx context.Context, thread, qid string) error {
	m := a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart("yes"))
	m.TaskID = a2a.TaskID(thread)
	m.Metadata = map[string]any{"question_id": qid}
	_, err := d.c.SendMessage(ctx, &a2a.SendMessageRequest{Message: m, Config: &a2a.SendMessageConfig{ReturnImmediately: true}})
	return a2aErr(err)
}

func (d *a2aDoor) waiting(ctx context.Context, thread, qid string) (bool, error) {
	t, err := d.c.GetTask(ctx, &a2a.GetTaskRequest{ID: a2a.TaskID(thread)})
	if err != nil {
		return false, a2aErr(err)
	}
	m := t.Status.Message
	return t.Status.State == a2a.TaskStateInputRequired && m != nil && m.Metadata["question_id"] == qid, nil
}

func (d *a2aDoor) end(ctx context.Context, thread string) (taskEnd, error) {
	t, err := d.c.GetTask(ctx, &a2a.GetTaskRequest{ID: a2a.TaskID(thread)})
	if err != nil {
		return taskEnd{}, a2aErr(err)
	}
	e := taskEnd{state: string(t.Status.State)}
	if t.Status.State == a2a.TaskStateCompleted {
		e.state = "completed"
	}
	for _, a := range t.Artifacts {
		if strings.HasPrefix(string(a.ID), "output") && len(a.Parts) == 1 {
			e.output, _ = json.Marshal(a.Parts[0].Data())
		}
	}
	return e, nil
}

// a2aErr marks an A2A InvalidParams as a refusal.
func a2aErr(err error) error {
	if err != nil && errors.Is(err, a2a.ErrInvalidParams) {
		return fmt.Errorf("%w: %w", errRefused, err)
	}
	return err
}

// mcpDoor speaks the MCP Tasks extension (SEP-2663) by hand, as
// services/mcpserver serves it: sessionless JSON-RPC requests of protocol
// 2026-07-28 whose _meta declares the extension, as the local principal
// (the server has no tokens in the soak).
type mcpDoor struct {
	url string
	hc  *http.Client
}

const (
	mcpVersion = "2026-07-28"
	tasksExt   = "io.modelcontextprotocol/tasks"
)

func newMCPDoor(base string) *mcpDoor {
	return &mcpDoor{url: base + "/mcp", hc: &http.Client{Timeout: doorCall}}
}

// rpcError is a JSON-RPC error a door answered.
type rpcError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func (e *rpcError) Error() string { return strconv.Itoa(e.Code) + " " + e.Message }

// call sends one request and decodes its result into out.
func (d *mcpDoor) call(ctx context.Context, method, name string, params map[string]any, out any) error {
	params["_meta"] = map[string]any{
		"io.modelcontextprotocol/protocolVersion": mcpVersion,
		"io.modelcontextprotocol/clientInfo":      map[string]any{"name": "agora-chaos", "version": "1"},
		"io.modelcontextprotocol/clientCapabilities": map[string]any{"elicitation": map[string]any{"form": map[string]any{}},
			"extensions": map[string]any{tasksExt: map[string]any{}}},
	}
	body, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("MCP-Protocol-Version", mcpVersion)
	req.Header.Set("Mcp-Method", method)
	req.Header.Set("Mcp-Name", name)
	resp, err := d.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("HTTP %d: %s", resp.StatusCode, lifecycle.Clip(string(b), 200))
	}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		b = lastEvent(b)
	}
	var m struct {
		Result json.RawMessage `json:"result"`
		Error  *rpcError       `json:"error"`
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return fmt.Errorf("%s: %w", method, err)
	}
	if m.Error != nil {
		if m.Error.Code == -32602 {
			return fmt.Errorf("%w: %w", errRefused, m.Error)
		}
		return m.Error
	}
	return json.Unmarshal(m.Result, out)
}

// lastEvent is the data of an SSE stream's last event.
func lastEvent(b []byte) []byte {
	var last, data []byte
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 4<<20)
	for sc.Scan() {
		line := sc.Text()
		if d, ok := strings.CutPrefix(line, "data:"); ok {
			data = append(data, strings.TrimPrefix(d, " ")...)
		} else if line == "" && len(data) > 0 {
			last, data = data, nil
		}
	}
	if len(data) > 0 {
		last = data
	}
	return last
}

func (d *mcpDoor) dispatch(ctx context.Context) (string, error) {
	var r struct {
		ResultType string          `json:"resultType"`
		TaskID     string          `json:"taskId"`
		IsError    bool            `json:"isError"`
		Content    json.RawMessage `json:"content"`
	}
	err := d.call(ctx, "tools/call", "agora_dispatch", map[string]any{"name": "agora_dispatch",
		"arguments": map[string]any{"subagent": "chaos", "input": map[string]any{}}}, &r)
	switch {
	case err != nil:
		return "", err
	case r.IsError:
		return "", fmt.Errorf("tool error: %s", lifecycle.Clip(string(r.Content), 200))
	case r.ResultType != "task" || r.TaskID == "":
		return "", fmt.Errorf("agora_dispatch answered resultType %q, want a task", r.ResultType)
	}
	return r.TaskID, nil
}

func (d *mcpDoor) answer(ctx context.Context, thread, qid string) error {
	var r struct {
		ResultType string `json:"resultType"`
	}
	return d.call(ctx, "tasks/update", thread, map[string]any{"taskId": thread,
		"inputResponses": map[string]any{qid: map[string]any{"action": "accept", "content": map[string]any{"answer": "yes"}}}}, &r)
}

// mcpTask is what tasks/get answers, as far as the soak reads it.
type mcpTask struct {
	Status        string         `json:"status"`
	InputRequests map[string]any `json:"inputRequests"`
	Result        struct {
		StructuredContent struct {
			Status string          `json:"status"`
			Output json.RawMessage `json:"output"`
		} `json:"structuredContent"`
	} `json:"result"`
}

func (d *mcpDoor) get(ctx context.Context, thread string) (mcpTask, error) {
	var t mcpTask
	err := d.call(ctx, "tasks/get", thread, map[string]any{"taskId": thread}, &t)
	return t, err
}

func (d *mcpDoor) waiting(ctx context.Context, thread, qid string) (bool, error) {
	t, err := d.get(ctx, thread)
	if err != nil {
		return false, err
	}
	_, asks := t.InputRequests[qid]
	return t.Status == "input_required" && asks, nil
}

func (d *mcpDoor) end(ctx context.Context, thread string) (taskEnd, error) {
	t, err := d.get(ctx, thread)
	if err != nil {
		return taskEnd{}, err
	}
	e := taskEnd{state: t.Status}
	if t.Status == "completed" && t.Result.StructuredContent.Status != "finished" {
		e.state += " (" + t.Result.StructuredContent.Status + ")"
	}
	e.output = t.Result.StructuredContent.Output
	return e, nil
}

// errStatus names a door's error for the report by its status: the A2A
// error kind or the JSON-RPC code, else what the transport said.
func errStatus(err error) string {
	var re *rpcError
	if errors.As(err, &re) {
		return "JSON-RPC " + strconv.Itoa(re.Code)
	}
	for _, k := range []struct {
		err  error
		name string
	}{{a2a.ErrInvalidParams, "InvalidParams"}, {a2a.ErrTaskNotFound, "TaskNotFound"}, {a2a.ErrInternalError, "InternalError"},
		{a2a.ErrUnauthorized, "Unauthorized"}, {a2a.ErrUnauthenticated, "Unauthenticated"}} {
		if errors.Is(err, k.err) {
			return k.name
		}
	}
	msg := err.Error()
	switch {
	case strings.HasPrefix(msg, "tool error: "):
		return "tool error (isError)"
	case strings.Contains(msg, "connection refused"):
		return "connection refused"
	case errors.Is(err, context.DeadlineExceeded) || strings.Contains(msg, "Timeout exceeded") || strings.Contains(msg, "timeout"):
		return "timeout"
	case strings.Contains(msg, "EOF") || strings.Contains(msg, "connection reset"):
		return "connection lost"
	}
	return lifecycle.Clip(msg, 120)
}

// answerThrough sends n concurrent answers to question q through door d
// (named through) on the task of thread, q's own or one waiting on it,
// telling accepted of each outcome.
// Refusals that lost to another of the answers, or came once the question
// was answered, are no error; every other failure counts by door and
// status (answerErr), and a door that refuses while it shows the task
// waiting on that very question is an anomaly.
func answerThrough(ctx context.Context, through string, d door, c questioner, thread string, q lifecycle.Question, n int,
	accepted func(error), answerErr func(what, status string), anomaly func(string)) {
	errs := make(chan error, n)
	for range n {
		go func() {
			actx, cancel := context.WithTimeout(ctx, doorCall)
			err := d.answer(actx, thread, q.QuestionID)
			cancel()
			accepted(err)
			errs <- err
		}()
	}
	var failed []error
	won := false
	for range n {
		if err := <-errs; err == nil {
			won = true
		} else {
			failed = append(failed, err)
		}
	}
	if ctx.Err() != nil {
		return
	}
	what := through + " answer"
	for _, err := range failed {
		if !errors.Is(err, errRefused) {
			answerErr(what, errStatus(err))
			continue
		}
		if won {
			continue // another of these answers won
		}
		rctx, cancel := context.WithTimeout(ctx, doorCall)
		now, qerr := c.Question(rctx, q.QuestionID)
		// A task the door cannot read now counts as not waiting.
		waits := false
		if qerr == nil && now.Status == "asked" {
			waits, _ = d.waiting(rctx, thread, q.QuestionID)
		}
		cancel()
		switch {
		case qerr == nil && now.Status == "answered":
			// An earlier batch's answer won.
		case waits:
			answerErr(what, "refused a legitimate answer")
			anomaly(fmt.Sprintf("%s refused an answer to question %s on task %s, which it shows waiting on that question: %v", through, q.QuestionID, thread, err))
		default:
			answerErr(what, errStatus(err)+" (the task was not waiting for it)")
		}
	}
}

// questioner reads a question record.
type questioner interface {
	Question(ctx context.Context, questionID string) (lifecycle.Question, error)
}

// readDoorEnds reads, through each door, the task of every thread
// started through it, as a client polls: again while the door is down (a
// door killed last is started again) or does not show it completed yet
// (its records may lag the lifecycle stream), for up to endsWithin in
// all.
func readDoorEnds(ctx context.Context, doors map[string]door, threadDoor map[string]string, doorErr func(string, error)) map[string]taskEnd {
	ends := map[string]taskEnd{}
	give := time.Now().Add(endsWithin)
	for _, thread := range slices.Sorted(maps.Keys(threadDoor)) {
		through := threadDoor[thread]
		for {
			actx, cancel := context.WithTimeout(ctx, doorCall)
			e, err := doors[through].end(actx, thread)
			cancel()
			if err != nil {
				doorErr(through+" read the task's end", err)
				e = taskEnd{state: "unread: " + errStatus(err)}
			}
			ends[thread] = e
			if e.state == "completed" || time.Now().After(give) || ctx.Err() != nil {
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
	return ends
}

// endsWithin bounds the reads of the doors' ends after the soak.
const endsWithin = 30 * time.Second

// auditDoorEnds checks that each door reported the end of every thread
// started through it: completed, with the output the thread finished
// with.
func auditDoorEnds(ctx context.Context, js jetstream.JetStream, threadDoor map[string]string, ends map[string]taskEnd, rep *Report) {
	if len(threadDoor) == 0 {
		return
	}
	out := map[string]json.RawMessage{}
	if err := readAll(ctx, js, lifecycle.StreamLifecycle, func(d lifecycle.Data) {
		if f, ok := d.(*lifecycle.Finished); ok {
			out[f.ThreadID] = f.Output
		}
	}); err != nil {
		rep.Anomalies = append(rep.Anomalies, fmt.Sprintf("cannot read %s for the doors' ends: %v", lifecycle.StreamLifecycle, err))
		return
	}
	for _, thread := range slices.Sorted(maps.Keys(threadDoor)) {
		through, e := threadDoor[thread], ends[thread]
		want, finished := out[thread]
		switch {
		case !finished:
			// The audit reports the thread that did not end.
		case e.state != "completed":
			rep.Anomalies = append(rep.Anomalies, fmt.Sprintf("%s reports task %s %s, want completed: its thread finished", through, thread, e.state))
		case !sameJSON(e.output, want):
			rep.Anomalies = append(rep.Anomalies, fmt.Sprintf("%s reports task %s completed with output %s, want the thread's %s", through, thread,
				lifecycle.Clip(string(e.output), detailLen), lifecycle.Clip(string(want), detailLen)))
		default:
			rep.DoorEnds++
		}
	}
}

// sameJSON reports whether a and b hold the same JSON value.
func sameJSON(a, b json.RawMessage) bool {
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal(b, &y) == nil && reflect.DeepEqual(x, y)
}
