package mcpserver_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/harness/systemtest"
	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/services/mcpserver"
)

// rawClient speaks JSON-RPC to /mcp by hand (net/http and encoding/json,
// no MCP library), so the test sees the wire as any client would. Every
// request and every message it reads is logged.
type rawClient struct {
	t       *testing.T
	url     string
	token   string
	version string // the MCP-Protocol-Version header; empty before initialize
	session string // the Mcp-Session-Id the server gave, if any
	// meta, when set, is the per-request _meta of protocol 2026-07-28; such
	// requests also carry the Mcp-Method (and Mcp-Name) headers.
	meta   map[string]any
	nextID int
}

// rpcMsg is any JSON-RPC message.
type rpcMsg struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id,omitempty"`
	Method  string          `json:"method,omitempty"`
	Params  json.RawMessage `json:"params,omitempty"`
	Result  json.RawMessage `json:"result,omitempty"`
	Error   *struct {
		Code    int             `json:"code"`
		Message string          `json:"message"`
		Data    json.RawMessage `json:"data,omitempty"`
	} `json:"error,omitempty"`
}

// post sends one JSON-RPC message and returns the HTTP response.
func (c *rawClient) post(msg map[string]any) *http.Response {
	c.t.Helper()
	body, err := json.Marshal(msg)
	if err != nil {
		c.t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(c.t.Context(), http.MethodPost, c.url, bytes.NewReader(body))
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	var hdrs []string
	set := func(k, v string) {
		if v != "" {
			req.Header.Set(k, v)
			hdrs = append(hdrs, k+": "+v)
		}
	}
	set("MCP-Protocol-Version", c.version)
	set("Mcp-Session-Id", c.session)
	if m, _ := msg["method"].(string); m != "" && c.meta != nil {
		set("Mcp-Method", m)
		p, _ := msg["params"].(map[string]any)
		switch {
		case m == "tools/call":
			set("Mcp-Name", fmt.Sprint(p["name"]))
		case strings.HasPrefix(m, "tasks/"): // the Tasks extension names the task
			id, _ := p["taskId"].(string)
			set("Mcp-Name", id)
		}
	}
	c.t.Logf("→ POST [%s] %s", strings.Join(hdrs, "; "), body)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	return resp
}

// bodiless sends req, whose answer is read for its status only, and
// returns the status code and line.
func bodiless(t *testing.T, req *http.Request) (int, string) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	t.Logf("← %s", resp.Status)
	return resp.StatusCode, resp.Status
}

// newMeta is the _meta of every request of a protocol 2026-07-28 client
// that can elicit.
func newMeta() map[string]any {
	return map[string]any{
		"io.modelcontextprotocol/protocolVersion":    "2026-07-28",
		"io.modelcontextprotocol/clientInfo":         map[string]any{"name": "raw-http-test", "version": "1"},
		"io.modelcontextprotocol/clientCapabilities": map[string]any{"elicitation": map[string]any{"form": map[string]any{}}},
	}
}

// notify sends a notification; the server accepts it with 202.
func (c *rawClient) notify(method string) {
	c.t.Helper()
	resp := c.post(map[string]any{"jsonrpc": "2.0", "method": method})
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	c.t.Logf("← %s %s", resp.Status, b)
	if resp.StatusCode != http.StatusAccepted {
		c.t.Fatalf("%s: %s %s", method, resp.Status, b)
	}
}

// call sends a request and reads the reply: one JSON body or an SSE
// stream. Requests the server makes on the stream go to serve, whose
// result is posted back; notifications are logged and skipped. It
// returns the response to this request and the HTTP response headers.
func (c *rawClient) call(method string, params map[string]any, serve func(rpcMsg) any) (rpcMsg, http.Header) {
	c.t.Helper()
	if params == nil {
		params = map[string]any{}
	}
	if c.meta != nil {
		params["_meta"] = c.meta
	}
	c.nextID++
	id := c.nextID
	resp := c.post(map[string]any{"jsonrpc": "2.0", "id": id, "method": method, "params": params})
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		c.t.Logf("← %s %s", resp.Status, b)
		c.t.Fatalf("%s: HTTP %s: %s", method, resp.Status, b)
	}
	c.t.Logf("← %s %s%s", resp.Status, resp.Header.Get("Content-Type"), sessionNote(resp.Header))
	handle := func(data []byte) (rpcMsg, bool) {
		c.t.Logf("← %s", clipped(data))
		var m rpcMsg
		if err := json.Unmarshal(data, &m); err != nil {
			c.t.Fatalf("%s: message %s: %v", method, data, err)
		}
		switch {
		case m.Method != "" && m.ID != nil: // a request of the server's
			if serve == nil {
				c.t.Fatalf("%s: the server asked %s, unexpected", method, m.Method)
			}
			r := c.post(map[string]any{"jsonrpc": "2.0", "id": m.ID, "result": serve(m)})
			b, _ := io.ReadAll(r.Body)
			r.Body.Close()
			c.t.Logf("← %s %s", r.Status, b)
			if r.StatusCode != http.StatusAccepted {
				c.t.Fatalf("answering %s: %s %s", m.Method, r.Status, b)
			}
		case m.Method != "": // a notification
		case string(m.ID) == fmt.Sprint(id):
			return m, true
		}
		return m, false
	}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			c.t.Fatal(err)
		}
		if m, ok := handle(b); ok {
			return m, resp.Header
		}
		c.t.Fatalf("%s: no response to id %d", method, id)
	}
	// An SSE stream: events are "data:" lines ended by a blank line.
	r := bufio.NewReader(resp.Body)
	var data []byte
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			c.t.Fatalf("%s: the stream ended before the response to id %d: %v", method, id, err)
		}
		line = strings.TrimRight(line, "\r\n")
		if d, ok := strings.CutPrefix(line, "data:"); ok {
			data = append(data, strings.TrimPrefix(d, " ")...)
			continue
		}
		if line == "" && len(data) > 0 {
			if m, ok := handle(data); ok {
				return m, resp.Header
			}
			data = nil
		}
	}
}

// clipped shortens a long message for the log (tools/list runs to 8 kB).
func clipped(b []byte) string {
	const max = 1200
	if len(b) <= max {
		return string(b)
	}
	return fmt.Sprintf("%s… (%d bytes)", b[:max], len(b))
}

func sessionNote(h http.Header) string {
	if s := h.Get("Mcp-Session-Id"); s != "" {
		return " Mcp-Session-Id: " + s
	}
	return ""
}

// result returns a response's result, failing on a JSON-RPC error.
func result(t *testing.T, m rpcMsg) map[string]any {
	t.Helper()
	if m.Error != nil {
		t.Fatalf("JSON-RPC error %d: %s %s", m.Error.Code, m.Error.Message, m.Error.Data)
	}
	var r map[string]any
	if err := json.Unmarshal(m.Result, &r); err != nil {
		t.Fatalf("result %s: %v", m.Result, err)
	}
	return r
}

// toolNames returns the names a tools/list result lists, sorted.
func toolNames(r map[string]any) []string {
	var names []string
	for _, tl := range r["tools"].([]any) {
		names = append(names, tl.(map[string]any)["name"].(string))
	}
	slices.Sort(names)
	return names
}

var allTools = []string{"agora_answer", "agora_cancel", "agora_decisions", "agora_dispatch", "agora_events", "agora_forget_decision", "agora_questions", "agora_status", "agora_subagents"}

// /mcp serves protocol 2026-07-28 without sessions next to the older
// protocols with sessions (docs/mcp.md, "The orchestrator's server"). A
// client of each generation, written by hand, dispatches a sub-agent that
// asks, answers it and sees the thread finish.
func TestHTTPServesBothProtocolGenerations(t *testing.T) {
	e := newEnv(t, mcpserver.Config{APITokens: []string{"s3cret"}})
	srv := httptest.NewServer(e.svc.Handler())
	defer srv.Close()
	sum := sha256.Sum256([]byte("s3cret"))
	principal := "mcp:token-" + hex.EncodeToString(sum[:4])

	t.Run("2025-11-25 with a session", func(t *testing.T) {
		c := &rawClient{t: t, url: srv.URL, token: "s3cret"}
		res, h := c.call("initialize", map[string]any{"protocolVersion": "2025-11-25",
			"capabilities": map[string]any{"elicitation": map[string]any{}},
			"clientInfo":   map[string]any{"name": "raw-http-test", "version": "1"}}, nil)
		init := result(t, res)
		if init["protocolVersion"] != "2025-11-25" {
			t.Fatalf("negotiated %v, want 2025-11-25", init["protocolVersion"])
		}
		if c.session = h.Get("Mcp-Session-Id"); c.session == "" {
			t.Fatal("initialize gave no Mcp-Session-Id")
		}
		c.version = "2025-11-25"
		c.notify("notifications/initialized")
		res, _ = c.call("tools/list", nil, nil)
		if got := toolNames(result(t, res)); !slices.Equal(got, allTools) {
			t.Fatalf("tools = %v, want %v", got, allTools)
		}
		// The question comes as an elicitation request on the call's stream.
		var asked []string
		res, _ = c.call("tools/call", map[string]any{"name": "agora_dispatch",
			"arguments": map[string]any{"subagent": "chooser", "input": map[string]any{"task": "x"}}},
			func(m rpcMsg) any {
				var p struct {
					Message string `json:"message"`
				}
				_ = json.Unmarshal(m.Params, &p)
				asked = append(asked, m.Method+": "+p.Message)
				return map[string]any{"action": "accept", "content": map[string]any{"answer": "B"}}
			})
		out := result(t, res)
		if len(asked) != 1 || !strings.HasPrefix(asked[0], "elicitation/create: ") || !strings.Contains(asked[0], "Rewrite A or B?") {
			t.Errorf("asked = %q, want one elicitation of the question", asked)
		}
		sc, _ := out["structuredContent"].(map[string]any)
		if sc["status"] != "finished" || sc["output"].(map[string]any)["chose"] != "B" {
			t.Fatalf("result = %v", out)
		}
		if q := question(t, e.sys.Client, sc["thread_id"].(string)); q.Answer != "B" || q.AnsweredBy != principal {
			t.Errorf("question = %+v, want B answered by %s", q, principal)
		}
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodDelete, srv.URL, nil)
		req.Header.Set("Authorization", "Bearer s3cret")
		req.Header.Set("Mcp-Session-Id", c.session)
		t.Logf("→ DELETE [Mcp-Session-Id: %s]", c.session)
		if code, status := bodiless(t, req); code != http.StatusNoContent {
			t.Errorf("ending the session: %s", status)
		}
	})

	t.Run("2026-07-28 without a session", func(t *testing.T) {
		c := &rawClient{t: t, url: srv.URL, token: "s3cret", version: "2026-07-28", meta: newMeta()}
		noSession := func(what string, h http.Header) {
			t.Helper()
			if s := h.Get("Mcp-Session-Id"); s != "" {
				t.Errorf("%s gave Mcp-Session-Id %s; protocol 2026-07-28 has no sessions", what, s)
			}
		}
		res, h := c.call("server/discover", nil, nil)
		noSession("server/discover", h)
		disc := result(t, res)
		var versions []string
		for _, v := range disc["supportedVersions"].([]any) {
			versions = append(versions, v.(string))
		}
		if want := []string{"2026-07-28", "2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"}; !slices.Equal(versions, want) {
			t.Errorf("supportedVersions = %v, want %v", versions, want)
		}
		res, h = c.call("tools/list", nil, nil)
		noSession("tools/list", h)
		if got := toolNames(result(t, res)); !slices.Equal(got, allTools) {
			t.Fatalf("tools = %v, want %v", got, allTools)
		}
		args := map[string]any{"subagent": "chooser", "input": map[string]any{"task": "y"}}
		res, h = c.call("tools/call", map[string]any{"name": "agora_dispatch", "arguments": args}, nil)
		noSession("tools/call", h)
		ir := result(t, res)
		reqs, _ := ir["inputRequests"].(map[string]any)
		st, _ := ir["requestState"].(string)
		if ir["resultType"] != "input_required" || len(reqs) != 1 || !strings.HasPrefix(st, "v1.") {
			t.Fatalf("want an input-required result with one request and a sealed requestState, got %v", ir)
		}
		var qid string
		for id, r := range reqs {
			qid = id
			r := r.(map[string]any)
			msg, _ := r["params"].(map[string]any)["message"].(string)
			if r["method"] != "elicitation/create" || !strings.Contains(msg, "Rewrite A or B?") {
				t.Errorf("input request %s = %v", id, r)
			}
		}
		// The answer goes with the same call, made again: no session ties the
		// two requests, only the sealed state.
		res, h = c.call("tools/call", map[string]any{"name": "agora_dispatch", "arguments": args,
			"inputResponses": map[string]any{qid: map[string]any{"action": "accept", "content": map[string]any{"answer": "A"}}},
			"requestState":   st}, nil)
		noSession("tools/call", h)
		out := result(t, res)
		sc, _ := out["structuredContent"].(map[string]any)
		if sc["status"] != "finished" || sc["output"].(map[string]any)["chose"] != "A" {
			t.Fatalf("result = %v", out)
		}
		if q := question(t, e.sys.Client, sc["thread_id"].(string)); q.QuestionID != qid || q.Answer != "A" || q.AnsweredBy != principal {
			t.Errorf("question = %+v, want %s answered A by %s", q, qid, principal)
		}
		// No session to end, nor a stream to open.
		for _, method := range []string{http.MethodDelete, http.MethodGet} {
			req, _ := http.NewRequestWithContext(t.Context(), method, srv.URL, nil)
			req.Header.Set("Authorization", "Bearer s3cret")
			req.Header.Set("Accept", "text/event-stream")
			req.Header.Set("MCP-Protocol-Version", "2026-07-28")
			t.Logf("→ %s [MCP-Protocol-Version: 2026-07-28]", method)
			if code, status := bodiless(t, req); code != http.StatusMethodNotAllowed {
				t.Errorf("%s: %s, want 405", method, status)
			}
		}
	})
}

// Without a session, a call lives as long as its HTTP request: a client
// that goes away while agora_dispatch follows a thread stops the following
// (the thread itself runs on). The MCP server has a connection of its own
// here, so its NATS subscriptions show whether it still follows.
func TestHTTPSessionlessCallEndsWithItsRequest(t *testing.T) {
	sys := systemtest.Start(t, systemtest.Options{})
	sys.Shell("long", "sleep 60")
	c, err := client.New(sys.Server.Conn(t))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := mcpserver.New(t.Context(), mcpserver.Config{}, mcpserver.Deps{Client: c, Logger: systemtest.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(svc.Handler())
	defer srv.Close()
	d, err := sys.Client.Dispatch(t.Context(), lifecycle.Request{Subagent: "long", Input: json.RawMessage(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = sys.Client.CancelThread(context.WithoutCancel(t.Context()), d.ThreadID) }()
	subs := func() int { return c.Conn().NumSubscriptions() }
	idle := subs()

	ctx, hangUp := context.WithCancel(t.Context())
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": map[string]any{
		"name": "agora_dispatch", "arguments": map[string]any{"thread_id": d.ThreadID}, "_meta": newMeta()}})
	done := make(chan error, 1)
	go func() {
		// Not rawClient: it fails the test, which must not happen off the
		// test's goroutine, and this request is meant to end in an error.
		b := body
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, bytes.NewReader(b))
		for k, v := range map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
			"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": "agora_dispatch"} {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		done <- err
	}()
	t.Logf("→ POST [MCP-Protocol-Version: 2026-07-28; Mcp-Method: tools/call; Mcp-Name: agora_dispatch] %s", body)
	testkit.Eventually(t, 10*time.Second, "agora_dispatch following the thread (a watch subscription)", func() bool { return subs() > idle })
	hangUp()
	t.Logf("the client hangs up: %v", <-done)
	testkit.Eventually(t, 5*time.Second, "the call ending with its request (its watch unsubscribed)", func() bool { return subs() == idle })
	if rec, err := sys.Client.Status(t.Context(), d.ThreadID); err != nil || rec.Status != lifecycle.KindStarted && rec.Status != lifecycle.KindAccepted {
		t.Errorf("the thread after the client left: %+v %v, want it still running", rec, err)
	}
}

// A session belongs to the token that opened it: a request carrying its
// id with another valid token is refused and acts as no one.
func TestHTTPSessionRefusesAnotherToken(t *testing.T) {
	e := newEnv(t, mcpserver.Config{APITokens: []string{"alice-token", "bob-token"}})
	srv := httptest.NewServer(e.svc.Handler())
	defer srv.Close()
	alice := &rawClient{t: t, url: srv.URL, token: "alice-token"}
	_, h := alice.call("initialize", map[string]any{"protocolVersion": "2025-11-25",
		"capabilities": map[string]any{}, "clientInfo": map[string]any{"name": "raw-http-test", "version": "1"}}, nil)
	if alice.session = h.Get("Mcp-Session-Id"); alice.session == "" {
		t.Fatal("initialize gave no Mcp-Session-Id")
	}
	alice.version = "2025-11-25"
	alice.notify("notifications/initialized")

	bob := &rawClient{t: t, url: srv.URL, token: "bob-token", version: alice.version, session: alice.session}
	resp := bob.post(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": map[string]any{}})
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	t.Logf("← %s %s", resp.Status, b)
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("another token on alice's session: %s %s, want 403", resp.Status, b)
	}
	// Alice's own requests still work.
	res, _ := alice.call("tools/list", nil, nil)
	if got := toolNames(result(t, res)); !slices.Equal(got, allTools) {
		t.Fatalf("alice's tools = %v", got)
	}
}

// Sessions are bounded: one principal opens at most AGORA_MCP_MAX_SESSIONS
// at once (the next initialize gets a 429 saying how to free one), and a
// session idle past AGORA_MCP_SESSION_IDLE is closed, which frees its
// place; another principal is not counted with the first.
func TestHTTPSessionsAreBounded(t *testing.T) {
	e := newEnv(t, mcpserver.Config{APITokens: []string{"alice-token", "bob-token"}, MaxSessions: 2, SessionIdle: time.Second})
	srv := httptest.NewServer(e.svc.Handler())
	defer srv.Close()
	initialize := func(token string) (*http.Response, string) {
		c := &rawClient{t: t, url: srv.URL, token: token}
		resp := c.post(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": map[string]any{"protocolVersion": "2025-11-25",
			"capabilities": map[string]any{}, "clientInfo": map[string]any{"name": "raw-http-test", "version": "1"}}})
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	for i := range 2 {
		if resp, b := initialize("alice-token"); resp.StatusCode != http.StatusOK || resp.Header.Get("Mcp-Session-Id") == "" {
			t.Fatalf("alice's session %d: %s %s", i+1, resp.Status, b)
		}
	}
	resp, b := initialize("alice-token")
	if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(b, "AGORA_MCP_MAX_SESSIONS=2") {
		t.Fatalf("alice's third session: %s %s, want 429 naming the cap", resp.Status, b)
	}
	// A session in use outlives the idle timeout many times over.
	bob := &rawClient{t: t, url: srv.URL, token: "bob-token"}
	_, h := bob.call("initialize", map[string]any{"protocolVersion": "2025-11-25",
		"capabilities": map[string]any{}, "clientInfo": map[string]any{"name": "raw-http-test", "version": "1"}}, nil)
	if bob.session = h.Get("Mcp-Session-Id"); bob.session == "" {
		t.Fatal("bob's initialize gave no Mcp-Session-Id")
	}
	bob.version = "2025-11-25"
	bob.notify("notifications/initialized")
	// (An idle timeout shorter than a second closed bob's session between
	// two of his requests on a loaded machine running -race.)
	for start := time.Now(); time.Since(start) < 3*time.Second; time.Sleep(100 * time.Millisecond) {
		if res, _ := bob.call("tools/list", nil, nil); res.Error != nil {
			t.Fatalf("bob's session in use, %s after it opened: %+v", time.Since(start).Round(time.Millisecond), res.Error)
		}
	}
	// Idle past the timeout, alice's sessions close and free her places.
	testkit.Eventually(t, 10*time.Second, "alice's idle sessions closed", func() bool {
		resp, _ := initialize("alice-token")
		return resp.StatusCode == http.StatusOK
	})
}
