package mcpserver_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/internal/testkit"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agora-dispatch/agora/harness/systemtest"
	"github.com/agora-dispatch/agora/internal/mcptest"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/services/mcpserver"
)

// A sub-agent that asks which of A or B on round 0 and writes its choice
// on round 1.
const chooser = `if grep -q '"answer"' "$AGORA_INPUT_FILE"; then
  sed -n 's/.*"answer": *"\([^"]*\)".*/{"chose":"\1"}/p' "$AGORA_INPUT_FILE" > "$AGORA_OUTPUT_FILE"
else
  echo '{"question":"Rewrite A or B?","options":["A","B"],"kind":"decision","context":"Same signature.","partial_state":{"seen":2}}' > "$AGORA_NEEDS_INPUT_FILE"
fi`

// Asks a decision on round 0, an approval on round 1, finishes on round 2.
const twoQuestions = `case "$AGORA_ROUND" in
0) echo '{"question":"Which region?","options":["eu","us"],"kind":"decision"}' > "$AGORA_NEEDS_INPUT_FILE" ;;
1) echo '{"question":"Deploy now?","kind":"approval"}' > "$AGORA_NEEDS_INPUT_FILE" ;;
*) cp "$AGORA_INPUT_FILE" "$AGORA_OUTPUT_FILE" ;;
esac`

type env struct {
	sys *systemtest.System
	svc *mcpserver.Service
}

func newEnv(t *testing.T, cfg mcpserver.Config) *env {
	t.Helper()
	sys := systemtest.Start(t, systemtest.Options{})
	sys.Shell("chooser", chooser)
	sys.Shell("two-questions", twoQuestions)
	sys.Shell("sleeper", "sleep 3; echo '{\"slept\":true}' > \"$AGORA_OUTPUT_FILE\"")
	svc, err := mcpserver.New(t.Context(), cfg, mcpserver.Deps{Client: sys.Client, Logger: systemtest.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	return &env{sys: sys, svc: svc}
}

// connect opens an MCP client session as principal. elicit, when set, is
// the client's elicitation handler; version, when set, the protocol
// version it asks for; noMRTR turns off the SDK's automatic retries.
func (e *env) connect(t *testing.T, principal string, elicit func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error), version string, noMRTR bool) *mcp.ClientSession {
	t.Helper()
	st, ct := mcp.NewInMemoryTransports()
	if _, err := e.svc.Serve(t.Context(), st, principal); err != nil {
		t.Fatal(err)
	}
	opts := &mcp.ClientOptions{ElicitationHandler: elicit}
	if noMRTR {
		opts.MultiRoundTrip = &mcp.MultiRoundTripOptions{Disabled: true}
	}
	c := mcp.NewClient(&mcp.Implementation{Name: "test-orchestrator", Version: "1"}, opts)
	cs, err := c.Connect(t.Context(), ct, &mcp.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

// progressNotes are the messages of the progress notifications a session
// received; safe for concurrent use.
type progressNotes struct {
	mu   sync.Mutex
	msgs []string
}

func (p *progressNotes) add(m string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.msgs = append(p.msgs, m)
}

// list returns the messages received so far.
func (p *progressNotes) list() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.msgs)
}

// dispatchWithProgress opens a session as principal that keeps its
// progress notifications, and calls agora_dispatch with args and a
// progress token. The session is closed when the test ends.
func (e *env) dispatchWithProgress(t *testing.T, principal string, args map[string]any) (*mcp.ClientSession, *mcp.CallToolResult, *progressNotes) {
	t.Helper()
	progress := &progressNotes{}
	st, ct := mcp.NewInMemoryTransports()
	if _, err := e.svc.Serve(t.Context(), st, principal); err != nil {
		t.Fatal(err)
	}
	c := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
			progress.add(r.Params.Message)
		}})
	cs, err := c.Connect(t.Context(), ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	params := &mcp.CallToolParams{Name: "agora_dispatch", Arguments: args}
	params.SetProgressToken("p")
	res, err := cs.CallTool(t.Context(), params)
	if err != nil {
		t.Fatal(err)
	}
	return cs, res, progress
}

// recorder is an elicitation handler that answers from a script and
// keeps what it was asked.
type recorder struct {
	mu      sync.Mutex
	asked   []*mcp.ElicitParams
	answers []map[string]any
}

func (r *recorder) handle(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.asked = append(r.asked, req.Params)
	if len(r.answers) == 0 {
		return &mcp.ElicitResult{Action: "decline"}, nil
	}
	a := r.answers[0]
	r.answers = r.answers[1:]
	return &mcp.ElicitResult{Action: "accept", Content: a}, nil
}

// schemaOf returns a property of an elicitation's requested schema.
func schemaOf(t *testing.T, p *mcp.ElicitParams, prop string) map[string]any {
	t.Helper()
	b, _ := json.Marshal(p.RequestedSchema)
	var s struct {
		Properties map[string]map[string]any `json:"properties"`
	}
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	return s.Properties[prop]
}

func question(t *testing.T, c *client.Client, threadID string) lifecycle.Question {
	t.Helper()
	qs, err := c.Questions(t.Context(), client.QuestionFilter{ThreadID: threadID})
	if err != nil || len(qs) == 0 {
		t.Fatalf("questions of %s: %v %v", threadID, qs, err)
	}
	return qs[len(qs)-1]
}

func TestDispatchAsksThroughInputRequired(t *testing.T) {
	e := newEnv(t, mcpserver.Config{})
	r := &recorder{answers: []map[string]any{{"answer": "B", "comment": "B is safer"}}}
	cs := e.connect(t, "alice", r.handle, "", false)
	if v := cs.InitializeResult().ProtocolVersion; v != "2026-07-28" {
		t.Fatalf("negotiated %s, want 2026-07-28", v)
	}
	out := mcptest.Structured(t, mcptest.Call(t, cs, "agora_dispatch", map[string]any{"subagent": "chooser", "input": map[string]any{"task": "x"}}))
	if out["status"] != "finished" || out["round"] != float64(1) || out["output"].(map[string]any)["chose"] != "B" {
		t.Fatalf("result = %v", out)
	}
	if len(r.asked) != 1 {
		t.Fatalf("asked %d times", len(r.asked))
	}
	p := r.asked[0]
	if !strings.Contains(p.Message, "Rewrite A or B?") || !strings.Contains(p.Message, "Same signature.") {
		t.Errorf("message = %q", p.Message)
	}
	ans := schemaOf(t, p, "answer")
	one, _ := ans["oneOf"].([]any)
	if ans["type"] != "string" || len(one) != 2 || one[0].(map[string]any)["const"] != "A" || one[1].(map[string]any)["title"] != "B" {
		t.Errorf("answer schema = %v, want a titled single-select of A and B", ans)
	}
	q := question(t, e.sys.Client, out["thread_id"].(string))
	if q.Status != "answered" || q.Answer != "B" || q.AnsweredBy != "mcp:alice" {
		t.Errorf("question = %+v, want answered B by mcp:alice", q)
	}
}

func TestApprovalAndTwoRounds(t *testing.T) {
	e := newEnv(t, mcpserver.Config{})
	r := &recorder{answers: []map[string]any{{"answer": "eu"}, {"decision": "approve", "comment": "go"}}}
	cs := e.connect(t, "alice", r.handle, "", false)
	out := mcptest.Structured(t, mcptest.Call(t, cs, "agora_dispatch", map[string]any{"subagent": "two-questions"}))
	if out["status"] != "finished" || out["round"] != float64(2) {
		t.Fatalf("result = %v", out)
	}
	in := out["output"].(map[string]any)
	if in["answer"] != "approve" || in["decision"] != "approve" || in["comment"] != "go" {
		t.Errorf("round 2 input = %v, want the approval", in)
	}
	if len(r.asked) != 2 {
		t.Fatalf("asked %d times, want 2", len(r.asked))
	}
	dec := schemaOf(t, r.asked[1], "decision")
	if one, _ := dec["oneOf"].([]any); len(one) != 2 || one[0].(map[string]any)["const"] != "approve" {
		t.Errorf("approval schema = %v", dec)
	}
	if c := schemaOf(t, r.asked[1], "comment"); c["type"] != "string" {
		t.Errorf("approval comment schema = %v", c)
	}
}

// A client of an older protocol is asked through elicitation within the
// call, once per question.
func TestOlderProtocolElicitation(t *testing.T) {
	e := newEnv(t, mcpserver.Config{})
	r := &recorder{answers: []map[string]any{{"answer": "us"}, {"decision": "reject", "comment": "not today"}}}
	cs := e.connect(t, "carol", r.handle, "2025-11-25", false)
	if v := cs.InitializeResult().ProtocolVersion; v != "2025-11-25" {
		t.Fatalf("negotiated %s", v)
	}
	out := mcptest.Structured(t, mcptest.Call(t, cs, "agora_dispatch", map[string]any{"subagent": "two-questions"}))
	if out["status"] != "finished" || out["output"].(map[string]any)["decision"] != "reject" || len(r.asked) != 2 {
		t.Fatalf("result = %v, asked %d", out, len(r.asked))
	}
}

// Without elicitation the model gets the question, answers it with
// agora_answer and follows the same thread on.
func TestNoElicitationFallsBackToAgoraAnswer(t *testing.T) {
	e := newEnv(t, mcpserver.Config{})
	cs := e.connect(t, "dave", nil, "", false)
	out := mcptest.Structured(t, mcptest.Call(t, cs, "agora_dispatch", map[string]any{"subagent": "chooser"}))
	if out["status"] != "needs_input" || out["question"] != "Rewrite A or B?" || out["kind"] != "decision" || out["context"] != "Same signature." {
		t.Fatalf("result = %v", out)
	}
	if opts, _ := out["options"].([]any); len(opts) != 2 {
		t.Fatalf("options = %v", out["options"])
	}
	qid, thread := out["question_id"].(string), out["thread_id"].(string)
	if !strings.Contains(out["next"].(string), "agora_answer") {
		t.Errorf("next = %q", out["next"])
	}
	// The waiting question, a page at a time (the router's index learns
	// of it through its watch, a moment after the record).
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		l := mcptest.Structured(t, mcptest.Call(t, cs, "agora_questions", map[string]any{"thread_id": thread, "limit": 1}))
		if qs, _ := l["questions"].([]any); len(qs) == 1 && qs[0].(map[string]any)["question_id"] == qid && l["count"] == float64(1) {
			if _, more := l["next_cursor"]; more {
				t.Errorf("one waiting question, yet a next page: %v", l)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("agora_questions never listed %s: %v", qid, l)
		}
	}
	for _, args := range []map[string]any{{"cursor": "bogus"}, {"status": "answered", "cursor": "1.q-x"}, {"limit": 5000}} {
		if r := mcptest.Call(t, cs, "agora_questions", args); !r.IsError || !strings.Contains(mcptest.Text(r), "cursor") && !strings.Contains(mcptest.Text(r), "limit") {
			t.Errorf("agora_questions %v: error %v, %s", args, r.IsError, mcptest.Text(r))
		}
	}
	bad := mcptest.Call(t, cs, "agora_answer", map[string]any{"question_id": qid, "answer": "C"})
	if !bad.IsError || !strings.Contains(mcptest.Text(bad), "not one of the options: A, B") {
		t.Errorf("an invalid answer: %v %s", bad.IsError, mcptest.Text(bad))
	}
	ok := mcptest.Structured(t, mcptest.Call(t, cs, "agora_answer", map[string]any{"question_id": qid, "answer": "A"}))
	if ok["status"] != "answered" || ok["thread_id"] != thread {
		t.Errorf("answer = %v", ok)
	}
	again := mcptest.Call(t, cs, "agora_answer", map[string]any{"question_id": qid, "answer": "B"})
	if !again.IsError || !strings.Contains(mcptest.Text(again), "answered by mcp:dave") {
		t.Errorf("a second answer: %s", mcptest.Text(again))
	}
	fin := mcptest.Structured(t, mcptest.Call(t, cs, "agora_dispatch", map[string]any{"thread_id": thread}))
	if fin["status"] != "finished" || fin["output"].(map[string]any)["chose"] != "A" {
		t.Fatalf("following on = %v", fin)
	}
	// The status comes from the dispatcher's records, which its status
	// projection keeps current from the lifecycle stream a moment after the
	// event agora_dispatch followed (docs/dispatcher.md).
	var st map[string]any
	testkit.Eventually(t, 10*time.Second, "agora_status to show the thread finished in 2 rounds", func() bool {
		st = mcptest.Structured(t, mcptest.Call(t, cs, "agora_status", map[string]any{"thread_id": thread}))
		rounds, _ := st["rounds"].([]any)
		return st["status"] == "finished" && len(rounds) == 2
	})
	evs := mcptest.Structured(t, mcptest.Call(t, cs, "agora_events", map[string]any{"thread_id": thread}))["events"].([]any)
	var kinds []string
	for _, ev := range evs {
		kinds = append(kinds, ev.(map[string]any)["kind"].(string))
	}
	if want := []string{"accepted", "started", "needs_input", "accepted", "started", "finished"}; !slices.Equal(kinds, want) {
		t.Errorf("events = %v, want %v", kinds, want)
	}
	since := evs[2].(map[string]any)["id"].(string)
	if later := mcptest.Structured(t, mcptest.Call(t, cs, "agora_events", map[string]any{"thread_id": thread, "since": since}))["events"].([]any); len(later) != 3 {
		t.Errorf("events since %s: %d, want 3", since, len(later))
	}
}

// The requestState is sealed, bound to its principal, expiring and
// single-use: every misuse is a tool error and nothing is answered.
func TestRequestStateIsSealedBoundExpiringSingleUse(t *testing.T) {
	e := newEnv(t, mcpserver.Config{})
	alice := e.connect(t, "alice", (&recorder{}).handle, "", true)
	bob := e.connect(t, "bob", (&recorder{}).handle, "", true)
	ctx := t.Context()
	res, err := alice.CallTool(ctx, &mcp.CallToolParams{Name: "agora_dispatch", Arguments: map[string]any{"subagent": "chooser"}})
	if err != nil {
		t.Fatal(err)
	}
	if !res.NeedsInput() || res.RequestState == "" {
		t.Fatalf("want an input-required result, got %+v", res)
	}
	var qid string
	for id := range res.InputRequests {
		qid = id
	}
	thread := strings.TrimPrefix(qid, "q-")
	retry := func(cs *mcp.ClientSession, state string) *mcp.CallToolResult {
		t.Helper()
		r, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "agora_dispatch", Arguments: map[string]any{"subagent": "chooser"},
			InputResponses: mcp.InputResponseMap{qid: &mcp.ElicitResult{Action: "accept", Content: map[string]any{"answer": "A"}}},
			RequestState:   state})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	stillAsked := func(what string) {
		t.Helper()
		if q := question(t, e.sys.Client, thread); q.Status != "asked" {
			t.Fatalf("after %s the question is %s", what, q.Status)
		}
	}
	tampered := []byte(res.RequestState)
	tampered[len(tampered)/2] ^= 1
	expired, err := mcpserver.SealForTest(e.svc, "alice", thread, qid, "decision", time.Now().Add(-time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		cs    *mcp.ClientSession
		state string
		want  string
	}{
		{"tampered", alice, string(tampered), "not one this server issued"},
		{"truncated", alice, res.RequestState[:len(res.RequestState)-4], "not one this server issued"},
		{"foreign principal", bob, res.RequestState, "another principal"},
		{"expired", alice, expired, "expired"},
		{"not sealed", alice, `{"thread_id":"` + thread + `"}`, "not one this server issued"},
	} {
		r := retry(c.cs, c.state)
		if !r.IsError || !strings.Contains(mcptest.Text(r), c.want) {
			t.Errorf("%s: %v %s", c.name, r.IsError, mcptest.Text(r))
		}
		stillAsked(c.name)
	}
	// The real one answers and follows the thread to its end; a replay of
	// it is refused.
	if out := mcptest.Structured(t, retry(alice, res.RequestState)); out["status"] != "finished" || out["output"].(map[string]any)["chose"] != "A" {
		t.Fatalf("answer with the state = %v", out)
	}
	if r := retry(alice, res.RequestState); !r.IsError || !strings.Contains(mcptest.Text(r), "already used") {
		t.Errorf("replay: %v %s", r.IsError, mcptest.Text(r))
	}
	if q := question(t, e.sys.Client, thread); q.Answer != "A" || q.AnsweredBy != "mcp:alice" {
		t.Errorf("question = %+v", q)
	}
}

// Past the wait cap the call returns running; calling again with the
// thread_id follows the same thread, dispatching nothing new.
func TestWaitCapReturnsRunning(t *testing.T) {
	e := newEnv(t, mcpserver.Config{WaitCap: time.Second, ProgressEvery: 200 * time.Millisecond})
	cs, res, progress := e.dispatchWithProgress(t, "erin", map[string]any{"subagent": "sleeper"})
	out := mcptest.Structured(t, res)
	thread, _ := out["thread_id"].(string)
	if out["status"] != "running" || thread == "" || !strings.Contains(out["next"].(string), thread) {
		t.Fatalf("result = %v", out)
	}
	if n := len(progress.list()); n < 2 {
		t.Errorf("%d progress notifications in a 1s wait, want several", n)
	}
	for range 10 {
		out = mcptest.Structured(t, mcptest.Call(t, cs, "agora_dispatch", map[string]any{"thread_id": thread}))
		if out["status"] != "running" {
			break
		}
	}
	if out["status"] != "finished" || out["output"].(map[string]any)["slept"] != true {
		t.Fatalf("following on = %v", out)
	}
	th, err := e.sys.Client.Thread(t.Context(), thread)
	if err != nil || len(th.Rounds) != 1 {
		t.Fatalf("thread = %+v %v, want one dispatch", th, err)
	}
}

func TestToolErrorsSayWhatToDo(t *testing.T) {
	e := newEnv(t, mcpserver.Config{})
	cs := e.connect(t, "frank", nil, "", false)
	for _, c := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{"agora_dispatch", map[string]any{"subagent": "no-such-agent"}, "agora_subagents"},
		{"agora_dispatch", map[string]any{}, "subagent is required"},
		{"agora_dispatch", map[string]any{"subagent": "chooser", "thread_id": "x"}, "not both"},
		{"agora_answer", map[string]any{"question_id": "q-nothing", "answer": "A"}, "no question q-nothing"},
		{"agora_status", map[string]any{"thread_id": "nothing"}, "no thread"},
		{"agora_status", map[string]any{}, "exactly one of thread_id and dispatch_id"},
		{"agora_questions", map[string]any{"status": "bogus"}, "want asked"},
	} {
		r := mcptest.Call(t, cs, c.tool, c.args)
		if !r.IsError || !strings.Contains(mcptest.Text(r), c.want) {
			t.Errorf("%s %v: %v %q, want an error saying %q", c.tool, c.args, r.IsError, mcptest.Text(r), c.want)
		}
	}
	subs := mcptest.Structured(t, mcptest.Call(t, cs, "agora_subagents", map[string]any{}))["subagents"].([]any)
	var names []string
	for _, s := range subs {
		names = append(names, s.(map[string]any)["name"].(string))
	}
	if !slices.Contains(names, "chooser") || !slices.Contains(names, "sleeper") {
		t.Errorf("subagents = %v", names)
	}
	// Every tool has an input schema and a description for the model.
	tools, err := cs.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, tl := range tools.Tools {
		got = append(got, tl.Name)
		if tl.InputSchema == nil || tl.OutputSchema == nil || len(tl.Description) < 80 {
			t.Errorf("tool %s: schemas or description missing", tl.Name)
		}
	}
	want := []string{"agora_answer", "agora_cancel", "agora_decisions", "agora_dispatch", "agora_events", "agora_forget_decision", "agora_questions", "agora_status", "agora_subagents"}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("tools = %v, want %v", got, want)
	}
}

func TestCancelThreadPausedOnAQuestion(t *testing.T) {
	e := newEnv(t, mcpserver.Config{})
	cs := e.connect(t, "gina", nil, "", false)
	out := mcptest.Structured(t, mcptest.Call(t, cs, "agora_dispatch", map[string]any{"subagent": "chooser"}))
	thread := out["thread_id"].(string)
	c := mcptest.Structured(t, mcptest.Call(t, cs, "agora_cancel", map[string]any{"thread_id": thread, "reason": "changed my mind"}))
	if c["thread_id"] != thread {
		t.Fatalf("cancel = %v", c)
	}
	fin := mcptest.Structured(t, mcptest.Call(t, cs, "agora_dispatch", map[string]any{"thread_id": thread}))
	if fin["status"] != "cancelled" || !strings.Contains(fmt.Sprint(fin["detail"]), "mcp:gina") {
		t.Errorf("after cancel = %v", fin)
	}
}

// bearer adds a bearer token to every request.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// Over HTTP the API's bearer tokens are required, the principal comes from
// the token, and a listener other hosts reach needs tokens.
func TestHTTPNeedsATokenAndRecordsItsPrincipal(t *testing.T) {
	e := newEnv(t, mcpserver.Config{APITokens: []string{"s3cret"}})
	srv := httptest.NewServer(e.svc.Handler())
	defer srv.Close()

	resp, err := http.Post(srv.URL, "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("WWW-Authenticate") == "" {
		t.Fatalf("without a token: %s", resp.Status)
	}
	for _, tok := range []string{"wrong", "s3cret"} {
		c := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, nil)
		cs, err := c.Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: srv.URL,
			HTTPClient: &http.Client{Transport: bearer{tok, http.DefaultTransport}}, MaxRetries: -1}, nil)
		if tok == "wrong" {
			if err == nil {
				cs.Close()
				t.Fatal("a wrong token connected")
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		out := mcptest.Structured(t, mcptest.Call(t, cs, "agora_dispatch", map[string]any{"subagent": "chooser"}))
		mcptest.Structured(t, mcptest.Call(t, cs, "agora_answer", map[string]any{"question_id": out["question_id"], "answer": "B"}))
		sum := sha256.Sum256([]byte("s3cret"))
		if q := question(t, e.sys.Client, out["thread_id"].(string)); q.AnsweredBy != "mcp:token-"+hex.EncodeToString(sum[:4]) {
			t.Errorf("answered_by = %q", q.AnsweredBy)
		}
		cs.Close()
	}
	for _, c := range []struct {
		cfg  mcpserver.Config
		want string
	}{
		{mcpserver.Config{HTTPAddr: "0.0.0.0:8090"}, "reachable from other hosts"},
		{mcpserver.Config{StateKey: "c2hvcnQ="}, "want 32"},
		{mcpserver.Config{StateTTL: time.Second}, "want 1m to 24h"},
	} {
		if err := c.cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate(%+v) = %v, want %q", c.cfg, err, c.want)
		}
	}
	if err := (mcpserver.Config{HTTPAddr: "0.0.0.0:8090", APITokens: []string{"x"}}).Validate(); err != nil {
		t.Errorf("with tokens: %v", err)
	}
}

// A finished thread lists its artifacts as resource links, readable with
// resources/read; the sub-agents' progress reports reach the client as
// progress notifications.
func TestArtifactLinksAndProgress(t *testing.T) {
	e := newEnv(t, mcpserver.Config{})
	e.sys.Shell("artist", `echo '{"message":"drawing","percent":50}' >> "$AGORA_PROGRESS_FILE"; sleep 0.5
printf -- '--- a\n+++ b\n' > "$AGORA_ARTIFACTS_DIR/fix.diff"; mkdir -p "$AGORA_ARTIFACTS_DIR/img"; printf '\211PNG\r\n\032\n' > "$AGORA_ARTIFACTS_DIR/img/dot.png"`)
	cs, res, progress := e.dispatchWithProgress(t, "ivy", map[string]any{"subagent": "artist"})
	out := mcptest.Structured(t, res)
	if out["status"] != "finished" || len(out["artifacts"].([]any)) != 2 {
		t.Fatalf("result = %v", out)
	}
	var links []*mcp.ResourceLink
	for _, c := range res.Content {
		if l, ok := c.(*mcp.ResourceLink); ok {
			links = append(links, l)
		}
	}
	if len(links) != 2 {
		t.Fatalf("%d resource links, want 2: %+v", len(links), res.Content)
	}
	for _, l := range links {
		rr, err := cs.ReadResource(t.Context(), &mcp.ReadResourceParams{URI: l.URI})
		if err != nil {
			t.Fatalf("read %s: %v", l.URI, err)
		}
		got := rr.Contents[0]
		switch l.Name {
		case "fix.diff":
			if got.Text != "--- a\n+++ b\n" || !strings.HasPrefix(got.MIMEType, "text/x-diff") {
				t.Errorf("fix.diff = %+v", got)
			}
		case "img/dot.png":
			if string(got.Blob) != "\x89PNG\r\n\x1a\n" || got.MIMEType != "image/png" {
				t.Errorf("img/dot.png = %+v", got)
			}
		default:
			t.Errorf("unexpected link %s", l.Name)
		}
	}
	if _, err := cs.ReadResource(t.Context(), &mcp.ReadResourceParams{URI: "agora://artifacts/" + out["dispatch_id"].(string) + "/nope"}); err == nil {
		t.Error("an unknown artifact was read")
	}
	if notes := progress.list(); !slices.ContainsFunc(notes, func(n string) bool { return strings.Contains(n, "50% drawing") }) {
		t.Errorf("progress notifications = %q, want the sub-agent's report", notes)
	}
}
