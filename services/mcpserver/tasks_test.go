package mcpserver_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agora-dispatch/agora/harness/systemtest"
	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/services/mcpserver"
)

// These tests speak the MCP Tasks extension (SEP-2663) as its text has
// it, by hand: a tools/call whose _meta declares the extension may
// answer with a task (resultType "task"); tasks/get reads it, tasks/update
// sends inputResponses keyed as its inputRequests, tasks/cancel cancels.

const tasksExt = "io.modelcontextprotocol/tasks"

// gatedChooser is chooser that asks only once the test opens its gate, a
// file named for its thread in dir: until then its task is working.
func gatedChooser(dir string) string {
	return fmt.Sprintf(`if grep -q '"answer"' "$AGORA_INPUT_FILE"; then
  sed -n 's/.*"answer": *"\([^"]*\)".*/{"chose":"\1"}/p' "$AGORA_INPUT_FILE" > "$AGORA_OUTPUT_FILE"
else
  while [ ! -e '%s'/"$AGORA_THREAD_ID" ]; do sleep 0.05; done
  echo '{"question":"Rewrite A or B?","options":["A","B"],"kind":"decision","context":"Same signature.","partial_state":{"seen":"partial-state-secret"}}' > "$AGORA_NEEDS_INPUT_FILE"
fi`, dir)
}

// taskEnv is an Agora with the gated chooser, whose gates are in gates.
type taskEnv struct {
	sys   *systemtest.System
	gates string
}

func newTaskEnv(t *testing.T) *taskEnv {
	t.Helper()
	sys := systemtest.Start(t, systemtest.Options{})
	e := &taskEnv{sys: sys, gates: t.TempDir()}
	d := subagent.Definition{Name: "gated", Runtime: subagent.RuntimeExec, Command: []string{"sh", "-c", gatedChooser(e.gates)}, Timeout: "1m",
		Sandbox: subagent.Sandbox{ReadPaths: []string{e.gates}}}
	if _, err := sys.Client.ApplySubagent(t.Context(), d); err != nil {
		t.Fatal(err)
	}
	return e
}

// open lets the gated chooser of thread ask.
func (e *taskEnv) open(t *testing.T, thread string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(e.gates, thread), nil, 0o600); err != nil {
		t.Fatal(err)
	}
}

// mcp starts an MCP server with its own NATS connection, as a process of
// its own would, serving HTTP; stop ends both.
func (e *taskEnv) mcp(t *testing.T, cfg mcpserver.Config) (url string, stop func()) {
	t.Helper()
	cfg.NATSURL = e.sys.Server.URL
	svc, err := mcpserver.New(t.Context(), cfg, mcpserver.Deps{Logger: systemtest.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(svc.Handler())
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			srv.Close()
			svc.Close()
		}
	}
	t.Cleanup(stop)
	return srv.URL, stop
}

// taskClient sends a request of a client that declares the Tasks
// extension on it and returns the response.
type taskClient func(method string, params map[string]any) rpcMsg

// declared is the per-request client capabilities of a client that can
// elicit and declares the Tasks extension.
func declared() map[string]any {
	return map[string]any{"elicitation": map[string]any{"form": map[string]any{}}, "extensions": map[string]any{tasksExt: map[string]any{}}}
}

// tasksMeta is the _meta of every request of a protocol 2026-07-28
// client that can elicit and declares the Tasks extension.
func tasksMeta() map[string]any {
	meta := newMeta()
	meta["io.modelcontextprotocol/clientCapabilities"] = declared()
	return meta
}

// sessionless is a client of protocol 2026-07-28 over HTTP.
func sessionless(t *testing.T, url, token string) taskClient {
	c := &rawClient{t: t, url: url, token: token, version: "2026-07-28", meta: tasksMeta()}
	return func(method string, params map[string]any) rpcMsg {
		m, _ := c.call(method, params, nil)
		return m
	}
}

// withSession is a client of protocol 2025-11-25 over HTTP, on a session.
func withSession(t *testing.T, url, token string) taskClient {
	c := &rawClient{t: t, url: url, token: token}
	res, h := c.call("initialize", map[string]any{"protocolVersion": "2025-11-25", "capabilities": map[string]any{"elicitation": map[string]any{}},
		"clientInfo": map[string]any{"name": "raw-http-test", "version": "1"}}, nil)
	result(t, res)
	if c.session = h.Get("Mcp-Session-Id"); c.session == "" {
		t.Fatal("initialize gave no Mcp-Session-Id")
	}
	c.version = "2025-11-25"
	c.notify("notifications/initialized")
	return func(method string, params map[string]any) rpcMsg {
		params["_meta"] = map[string]any{"io.modelcontextprotocol/clientCapabilities": declared()}
		m, _ := c.call(method, params, nil)
		return m
	}
}

// inProcess is a client of protocol 2025-11-25 on the transport agora mcp
// serves over stdio, written as JSON-RPC messages by hand.
func inProcess(t *testing.T, svc *mcpserver.Service, principal string) taskClient {
	st, ct := mcp.NewInMemoryTransports()
	if _, err := svc.Serve(t.Context(), st, principal); err != nil {
		t.Fatal(err)
	}
	conn, err := ct.Connect(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	n := 0
	send := func(method string, params map[string]any, call bool) rpcMsg {
		t.Helper()
		b, _ := json.Marshal(params)
		req := &jsonrpc.Request{Method: method, Params: b}
		if call {
			n++
			req.ID, _ = jsonrpc.MakeID(float64(n))
		}
		wire, _ := jsonrpc.EncodeMessage(req)
		t.Logf("→ %s", wire)
		if err := conn.Write(t.Context(), req); err != nil {
			t.Fatal(err)
		}
		for call {
			msg, err := conn.Read(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			wire, _ := jsonrpc.EncodeMessage(msg)
			t.Logf("← %s", clipped(wire))
			if resp, ok := msg.(*jsonrpc.Response); ok && resp.ID == req.ID {
				var m rpcMsg
				if err := json.Unmarshal(wire, &m); err != nil {
					t.Fatal(err)
				}
				return m
			}
		}
		return rpcMsg{}
	}
	result(t, send("initialize", map[string]any{"protocolVersion": "2025-11-25", "capabilities": map[string]any{},
		"clientInfo": map[string]any{"name": "raw-stdio-test", "version": "1"}}, true))
	send("notifications/initialized", map[string]any{}, false)
	return func(method string, params map[string]any) rpcMsg {
		params["_meta"] = map[string]any{"io.modelcontextprotocol/clientCapabilities": declared()}
		return send(method, params, true)
	}
}

// rpcError wants a JSON-RPC error of code, and returns its message.
func rpcError(t *testing.T, what string, m rpcMsg, code int) string {
	t.Helper()
	if m.Error == nil {
		t.Fatalf("%s: result %s, want JSON-RPC error %d", what, m.Result, code)
	}
	if m.Error.Code != code {
		t.Fatalf("%s: error %d %q, want code %d", what, m.Error.Code, m.Error.Message, code)
	}
	return m.Error.Message
}

// dispatchTask calls agora_dispatch on the gated chooser and wants a task
// at once, working; it returns the task id.
func dispatchTask(t *testing.T, tc taskClient) string {
	t.Helper()
	r := result(t, tc("tools/call", map[string]any{"name": "agora_dispatch",
		"arguments": map[string]any{"subagent": "gated", "input": map[string]any{"task": "x"}}}))
	id, _ := r["taskId"].(string)
	if r["resultType"] != "task" || id == "" || r["status"] != "working" {
		t.Fatalf("agora_dispatch with the Tasks extension: %v, want a task (resultType task) that is working", r)
	}
	if ttl, ok := r["ttlMs"]; !ok || ttl != nil {
		t.Errorf("ttlMs = %v (present %v), want null while the thread runs", ttl, ok)
	}
	if r["pollIntervalMs"] != float64(2000) || r["createdAt"] == nil || r["lastUpdatedAt"] == nil {
		t.Errorf("task %v: want pollIntervalMs 2000, createdAt and lastUpdatedAt", r)
	}
	return id
}

// getTask reads a task and wants it readable.
func getTask(t *testing.T, tc taskClient, id string) map[string]any {
	t.Helper()
	r := result(t, tc("tasks/get", map[string]any{"taskId": id}))
	if r["resultType"] != "complete" || r["taskId"] != id {
		t.Fatalf("tasks/get %s: %v, want resultType complete and the task", id, r)
	}
	return r
}

// pollTask reads a task until its status is want, as a client honouring
// pollIntervalMs would (faster, for the test).
func pollTask(t *testing.T, tc taskClient, id, want string) map[string]any {
	t.Helper()
	var r map[string]any
	testkit.Eventually(t, 30*time.Second, "task "+id+" "+want, func() bool {
		r = getTask(t, tc, id)
		return r["status"] == want
	})
	return r
}

// askedOf checks an input_required task asks the chooser's question as
// agora_dispatch's elicitation does (a titled single-select of the
// options), keyed by its question id, which it returns.
func askedOf(t *testing.T, r map[string]any) string {
	t.Helper()
	reqs, _ := r["inputRequests"].(map[string]any)
	if len(reqs) != 1 {
		t.Fatalf("inputRequests = %v, want one", r["inputRequests"])
	}
	for qid, ir := range reqs {
		ir := ir.(map[string]any)
		p, _ := ir["params"].(map[string]any)
		msg, _ := p["message"].(string)
		schema, _ := p["requestedSchema"].(map[string]any)
		answer, _ := schema["properties"].(map[string]any)["answer"].(map[string]any)
		var consts []string
		for _, o := range answer["oneOf"].([]any) {
			consts = append(consts, o.(map[string]any)["const"].(string))
		}
		if ir["method"] != "elicitation/create" || p["mode"] != "form" || !strings.Contains(msg, "Rewrite A or B?") || !slices.Equal(consts, []string{"A", "B"}) {
			t.Fatalf("inputRequests[%s] = %v, want the question as a form choosing A or B", qid, ir)
		}
		if !strings.HasPrefix(qid, "q-") {
			t.Errorf("key %q, want the question id", qid)
		}
		return qid
	}
	return ""
}

func choose(qid, answer string) map[string]any {
	return map[string]any{qid: map[string]any{"action": "accept", "content": map[string]any{"answer": answer}}}
}

// runTask drives one task of the gated chooser through tc: created at
// once, working until its gate opens, input_required with the question,
// answered with tasks/update, completed with the sub-agent's output and
// answered as answeredBy. between, when set, runs between the question
// and the answer and returns the client to go on with.
func runTask(t *testing.T, e *taskEnv, tc taskClient, answeredBy string, between func(id string) taskClient) {
	id := dispatchTask(t, tc)
	if rec, err := e.sys.Client.Status(t.Context(), id); err != nil || rec.ThreadID != id || rec.Round != 0 {
		t.Fatalf("the task's thread: %+v %v, want the task id to be the thread id", rec, err)
	}
	if r := getTask(t, tc, id); r["status"] != "working" || r["inputRequests"] != nil {
		t.Fatalf("tasks/get before the sub-agent asks: %v, want working", r)
	}
	e.open(t, id)
	qid := askedOf(t, pollTask(t, tc, id, "input_required"))
	if between != nil {
		tc = between(id)
		if got := askedOf(t, pollTask(t, tc, id, "input_required")); got != qid {
			t.Fatalf("after the restart the task asks %s, want %s", got, qid)
		}
	}
	msg := rpcError(t, "an answer not among the options", tc("tasks/update", map[string]any{"taskId": id, "inputResponses": choose(qid, "C")}), -32602)
	if !strings.Contains(msg, `"C" is not one of the options: A, B`) {
		t.Errorf("refusal %q, want it to list the options", msg)
	}
	if r := result(t, tc("tasks/update", map[string]any{"taskId": id, "inputResponses": choose(qid, "B")})); len(r) != 1 || r["resultType"] != "complete" {
		t.Fatalf("tasks/update: %v, want the empty acknowledgement", r)
	}
	done := pollTask(t, tc, id, "completed")
	res, _ := done["result"].(map[string]any)
	sc, _ := res["structuredContent"].(map[string]any)
	out, _ := sc["output"].(map[string]any)
	if sc["status"] != "finished" || out["chose"] != "B" || sc["thread_id"] != id || res["isError"] == true {
		t.Fatalf("completed task: %v, want agora_dispatch's finished result with the sub-agent's output", done)
	}
	if content, _ := res["content"].([]any); len(content) == 0 {
		t.Errorf("result %v has no content", res)
	}
	// Once the dispatcher has its records' expiry, the task has a TTL.
	testkit.Eventually(t, 10*time.Second, "the ended task's ttlMs", func() bool { return getTask(t, tc, id)["ttlMs"] != nil })
	if q := question(t, e.sys.Client, id); q.QuestionID != qid || q.Answer != "B" || q.AnsweredBy != answeredBy {
		t.Errorf("question = %+v, want %s answered B by %s", q, qid, answeredBy)
	}
}

// A task is its thread, whose records the server reads at every
// tasks/get: it outlives the MCP server that made it (stopped between
// the question and the answer, and a new one started), and the NATS
// server too (restarted on its file store, as agora dev runs it).
func TestTaskSurvivesRestarts(t *testing.T) {
	e := newTaskEnv(t)
	cfg := mcpserver.Config{APITokens: []string{"s3cret"}}
	url, stop := e.mcp(t, cfg)
	tc := sessionless(t, url, "s3cret")
	disc := result(t, tc("server/discover", map[string]any{}))
	if ext, _ := disc["capabilities"].(map[string]any)["extensions"].(map[string]any); ext[tasksExt] == nil {
		t.Fatalf("server/discover capabilities = %v, want the %s extension", disc["capabilities"], tasksExt)
	}
	runTask(t, e, tc, "mcp:token-"+hashOf("s3cret")[:8], func(id string) taskClient {
		stop()
		e.sys.Server.Restart(t)
		testkit.Eventually(t, 30*time.Second, "the dispatcher and the router answering again", func() bool {
			_, err := e.sys.Client.Status(t.Context(), id)
			_, err2 := e.sys.Client.Waiting(t.Context(), client.QuestionFilter{Status: "asked"}, 1, "")
			return err == nil && err2 == nil
		})
		url, _ := e.mcp(t, cfg)
		return sessionless(t, url, "s3cret")
	})
}

// The same task on the older protocol generation: over HTTP on a session,
// and on the transport agora mcp serves on stdio.
func TestTaskOnSessions(t *testing.T) {
	e := newTaskEnv(t)
	t.Run("http", func(t *testing.T) {
		url, _ := e.mcp(t, mcpserver.Config{APITokens: []string{"s3cret"}})
		runTask(t, e, withSession(t, url, "s3cret"), "mcp:token-"+hashOf("s3cret")[:8], nil)
	})
	t.Run("stdio", func(t *testing.T) {
		svc, err := mcpserver.New(t.Context(), mcpserver.Config{}, mcpserver.Deps{Client: e.sys.Client, Logger: systemtest.Logger()})
		if err != nil {
			t.Fatal(err)
		}
		runTask(t, e, inProcess(t, svc, "alice"), "mcp:alice", nil)
	})
}

// tasks/cancel cancels the thread, running or paused on its question
// (which is withdrawn); the ack comes at once and the task ends
// cancelled.
func TestTaskCancel(t *testing.T) {
	e := newTaskEnv(t)
	url, _ := e.mcp(t, mcpserver.Config{APITokens: []string{"s3cret"}})
	tc := sessionless(t, url, "s3cret")
	cancel := func(id string) {
		t.Helper()
		if r := result(t, tc("tasks/cancel", map[string]any{"taskId": id})); len(r) != 1 || r["resultType"] != "complete" {
			t.Fatalf("tasks/cancel: %v, want the empty acknowledgement", r)
		}
		r := pollTask(t, tc, id, "cancelled")
		if r["result"] != nil || r["inputRequests"] != nil || !strings.Contains(fmt.Sprint(r["statusMessage"]), "tasks/cancel") {
			t.Errorf("cancelled task %v: want no result, and who cancelled why", r)
		}
	}
	working := dispatchTask(t, tc)
	testkit.Eventually(t, 30*time.Second, "the sub-agent running", func() bool {
		rec, err := e.sys.Client.Status(t.Context(), working)
		return err == nil && rec.Status == lifecycle.KindStarted
	})
	cancel(working)

	paused := dispatchTask(t, tc)
	e.open(t, paused)
	qid := askedOf(t, pollTask(t, tc, paused, "input_required"))
	cancel(paused)
	testkit.Eventually(t, 30*time.Second, "the question withdrawn", func() bool {
		q, err := e.sys.Client.Question(t.Context(), qid)
		return err == nil && q.Status == "withdrawn"
	})
	// A cancelled task is no longer answered.
	if r := result(t, tc("tasks/update", map[string]any{"taskId": paused, "inputResponses": choose(qid, "A")})); r["resultType"] != "complete" {
		t.Errorf("tasks/update of a cancelled task: %v, want it acknowledged and ignored", r)
	}
	if q, _ := e.sys.Client.Question(t.Context(), qid); q.Answer != "" {
		t.Errorf("the withdrawn question was answered: %+v", q)
	}
}

// A task is its principal's: to another principal, every tasks/ method
// on it fails as on a task that does not exist, and tells nothing of its
// question or partial state; the task goes on untouched.
func TestTaskOfAnotherPrincipal(t *testing.T) {
	f := filepath.Join(t.TempDir(), "principals.yaml")
	body := fmt.Sprintf("principals:\n  - {name: alice, token_sha256: %s}\n  - {name: bob, token_sha256: %s}\n", hashOf("alice-token"), hashOf("bob-token"))
	if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	e := newTaskEnv(t)
	url, _ := e.mcp(t, mcpserver.Config{PrincipalsFile: f})
	alice, bob := sessionless(t, url, "alice-token"), sessionless(t, url, "bob-token")
	id := dispatchTask(t, alice)
	e.open(t, id)
	qid := askedOf(t, pollTask(t, alice, id, "input_required"))

	unknown := lifecycle.NewID()
	for _, c := range []struct {
		method string
		params func(id string) map[string]any
	}{
		{"tasks/get", func(id string) map[string]any { return map[string]any{"taskId": id} }},
		{"tasks/update", func(id string) map[string]any {
			return map[string]any{"taskId": id, "inputResponses": choose(qid, "A")}
		}},
		{"tasks/cancel", func(id string) map[string]any { return map[string]any{"taskId": id} }},
	} {
		theirs := bob(c.method, c.params(id))
		none := bob(c.method, c.params(unknown))
		msg := rpcError(t, "bob's "+c.method+" of alice's task", theirs, -32602)
		if want := strings.ReplaceAll(rpcError(t, c.method+" of no task", none, -32602), unknown, id); msg != want || !strings.Contains(msg, "Task not found") {
			t.Errorf("bob's %s of alice's task: %q, want what a task that does not exist gets: %q", c.method, msg, want)
		}
		if b, _ := json.Marshal(theirs); strings.Contains(string(b), "Rewrite") || strings.Contains(string(b), "partial-state-secret") {
			t.Errorf("bob's %s learnt of alice's question: %s", c.method, b)
		}
	}
	// Following it as a task is refused as an unknown thread is.
	r := result(t, bob("tools/call", map[string]any{"name": "agora_dispatch", "arguments": map[string]any{"thread_id": id}}))
	if r["isError"] != true || r["taskId"] != nil || !strings.Contains(fmt.Sprint(r["content"]), "no thread") {
		t.Errorf("bob following alice's thread as a task: %v, want the tool error of an unknown thread", r)
	}
	if got := askedOf(t, getTask(t, alice, id)); got != qid {
		t.Fatalf("alice's task after bob: asks %s, want %s", got, qid)
	}
	if q, _ := e.sys.Client.Question(t.Context(), qid); q.Status != "asked" {
		t.Errorf("alice's question after bob: %+v, want it still asked", q)
	}
}

// Bad requests get the protocol's errors, saying what is wrong; a client
// that does not declare the extension gets none of it.
func TestTaskBadRequests(t *testing.T) {
	e := newTaskEnv(t)
	url, _ := e.mcp(t, mcpserver.Config{APITokens: []string{"s3cret"}})
	tc := sessionless(t, url, "s3cret")
	id := dispatchTask(t, tc)
	e.open(t, id)
	qid := askedOf(t, pollTask(t, tc, id, "input_required"))

	for _, c := range []struct {
		name   string
		method string
		params map[string]any
		code   int
		want   string
	}{
		{"no taskId", "tasks/get", map[string]any{}, -32602, "params.taskId is required"},
		{"a taskId not a string", "tasks/get", map[string]any{"taskId": 7}, -32602, "tasks/get: params"},
		{"an unknown task", "tasks/get", map[string]any{"taskId": "d-nope"}, -32602, "Failed to retrieve task: Task not found"},
		{"no inputResponses", "tasks/update", map[string]any{"taskId": id}, -32602, "params.inputResponses is required"},
		{"a response of no known shape", "tasks/update", map[string]any{"taskId": id, "inputResponses": map[string]any{qid: map[string]any{"answer": "A"}}}, -32602, "cannot determine InputResponse type"},
		{"a declined question", "tasks/update", map[string]any{"taskId": id, "inputResponses": map[string]any{qid: map[string]any{"action": "decline"}}}, -32602, "the question stays open"},
		{"an unknown task cancelled", "tasks/cancel", map[string]any{"taskId": "d-nope"}, -32602, "Failed to cancel task: Task not found"},
	} {
		if msg := rpcError(t, c.name, tc(c.method, c.params), c.code); !strings.Contains(msg, c.want) {
			t.Errorf("%s: %q, want it to say %q", c.name, msg, c.want)
		}
	}
	// tasks/result is not of the extension: the SDK answers it, as any
	// unknown method.
	meta := tasksMeta()
	resp := (&rawClient{t: t, url: url, token: "s3cret", version: "2026-07-28", meta: meta}).post(map[string]any{"jsonrpc": "2.0", "id": 1,
		"method": "tasks/result", "params": map[string]any{"taskId": id, "_meta": meta}})
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	t.Logf("← %s %s", resp.Status, b)
	if !strings.Contains(string(b), "-32601") {
		t.Errorf("tasks/result: %s %s, want -32601 (method not found)", resp.Status, b)
	}
	// A response keyed by no outstanding request is ignored.
	if r := result(t, tc("tasks/update", map[string]any{"taskId": id, "inputResponses": choose("q-other", "A")})); r["resultType"] != "complete" {
		t.Errorf("a response to no request: %v, want it acknowledged", r)
	}
	// Bad arguments are the tool's errors, as without the extension.
	r := result(t, tc("tools/call", map[string]any{"name": "agora_dispatch", "arguments": map[string]any{"subagent": "nosuch"}}))
	if r["isError"] != true || r["taskId"] != nil || !strings.Contains(fmt.Sprint(r["content"]), "agora_subagents") {
		t.Errorf("dispatching an unknown sub-agent as a task: %v, want a tool error pointing at agora_subagents", r)
	}

	// Without the extension declared: -32021, naming it.
	plain := &rawClient{t: t, url: url, token: "s3cret", version: "2026-07-28", meta: newMeta()}
	m, _ := plain.call("tasks/get", map[string]any{"taskId": id}, nil)
	rpcError(t, "tasks/get of a client without the extension", m, -32021)
	var data struct {
		RequiredCapabilities struct {
			Extensions map[string]any `json:"extensions"`
		} `json:"requiredCapabilities"`
	}
	if err := json.Unmarshal(m.Error.Data, &data); err != nil || data.RequiredCapabilities.Extensions[tasksExt] == nil {
		t.Errorf("error data %s, want requiredCapabilities naming %s", m.Error.Data, tasksExt)
	}
	// Mcp-Name must name the task.
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": map[string]any{"taskId": id, "_meta": meta}})
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, url, bytes.NewReader(body))
	for k, v := range map[string]string{"Authorization": "Bearer s3cret", "Content-Type": "application/json", "Accept": "application/json, text/event-stream",
		"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tasks/get", "Mcp-Name": "d-other"} {
		req.Header.Set(k, v)
	}
	t.Logf("→ POST [Mcp-Method: tasks/get; Mcp-Name: d-other] %s", body)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	t.Logf("← %s %s", resp.Status, b)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "-32020") {
		t.Errorf("tasks/get whose Mcp-Name is not its taskId: %s %s, want 400 with -32020", resp.Status, b)
	}
	if q, _ := e.sys.Client.Question(t.Context(), qid); q.Status != "asked" {
		t.Errorf("after the bad requests the question is %+v, want it still asked", q)
	}
}

// A task asks its question with the very form agora_dispatch's
// input-required result asks it with.
func TestTaskAsksAsAgoraDispatchAsks(t *testing.T) {
	e := newTaskEnv(t)
	// Two sub-agents, lest the second question join the first.
	e.sys.Shell("chooser", chooser)
	e.sys.Shell("chooser-too", chooser)
	url, _ := e.mcp(t, mcpserver.Config{APITokens: []string{"s3cret"}})
	plain := &rawClient{t: t, url: url, token: "s3cret", version: "2026-07-28", meta: newMeta()}
	args := map[string]any{"subagent": "chooser", "input": map[string]any{"task": "x"}}
	m, _ := plain.call("tools/call", map[string]any{"name": "agora_dispatch", "arguments": args}, nil)
	ir := result(t, m)
	if ir["resultType"] != "input_required" {
		t.Fatalf("agora_dispatch without the extension: %v, want today's input-required result", ir)
	}
	tc := sessionless(t, url, "s3cret")
	args["subagent"] = "chooser-too"
	r := result(t, tc("tools/call", map[string]any{"name": "agora_dispatch", "arguments": args}))
	id, _ := r["taskId"].(string)
	tk := pollTask(t, tc, id, "input_required")
	// The same form, but for the thread's own ids.
	form := func(reqs any) string {
		var qid string
		for k := range reqs.(map[string]any) {
			qid = k
		}
		b, _ := json.Marshal(reqs.(map[string]any)[qid])
		return strings.ReplaceAll(string(b), strings.TrimPrefix(qid, "q-"), "<thread>")
	}
	got := strings.ReplaceAll(form(tk["inputRequests"]), "chooser-too", "chooser")
	if want := form(ir["inputRequests"]); got != want {
		t.Errorf("the task asks\n%s\nagora_dispatch asks\n%s", got, want)
	}
}
