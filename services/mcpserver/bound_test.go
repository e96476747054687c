package mcpserver_test

import (
	"context"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/mcptest"
	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/services/mcpserver"
)

// boundTo reports whether question qid's record says its answer was
// bound to digest, and came through the door MCP names.
func boundTo(t *testing.T, js jetstream.JetStream, qid, digest string) bool {
	t.Helper()
	e, err := natstest.KeyValue(t, js, lifecycle.BucketQuestions).Get(t.Context(), qid)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Contains(string(e.Value()), `"bound_digest":"`+digest+`"`) && strings.Contains(string(e.Value()), `"named_door":"mcp"`)
}

// TestInputRequiredBound: the requestState of an input-required result
// carries what the form showed. The question asked anew reworded before
// the client answers, the retry answers nothing: the client is asked
// again, told why, with the question as it stands; that answer is taken,
// bound to what it showed.
func TestInputRequiredBound(t *testing.T) {
	e := newEnv(t, mcpserver.Config{})
	js, err := jetstream.New(e.sys.Server.Conn(t))
	if err != nil {
		t.Fatal(err)
	}
	cs := e.connect(t, "alice", (&recorder{}).handle, "", true)
	ctx := t.Context()
	call := func(qid, state string) *mcp.CallToolResult {
		t.Helper()
		p := &mcp.CallToolParams{Name: "agora_dispatch", Arguments: map[string]any{"subagent": "chooser"}, RequestState: state}
		if qid != "" {
			p.InputResponses = mcp.InputResponseMap{qid: &mcp.ElicitResult{Action: "accept", Content: map[string]any{"answer": "A"}}}
		}
		r, err := cs.CallTool(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	res := call("", "")
	if !res.NeedsInput() {
		t.Fatalf("want an input-required result, got %+v", res)
	}
	var qid string
	for id := range res.InputRequests {
		qid = id
	}
	now := natstest.RewordQuestion(t, js, qid, " Or neither?")

	again := call(qid, res.RequestState)
	if !again.NeedsInput() || again.RequestState == "" {
		t.Fatalf("the retry after the question changed: %+v, want asked again", again)
	}
	msg := again.InputRequests[qid].(*mcp.ElicitParams).Message
	if !strings.Contains(msg, "the question changed") || !strings.Contains(msg, "Or neither?") {
		t.Errorf("asked again with %q, want why and the question as it stands", msg)
	}
	if q := question(t, e.sys.Client, strings.TrimPrefix(qid, "q-")); q.Status != "asked" {
		t.Fatalf("after the stale answer the question is %s, want asked", q.Status)
	}
	if out := mcptest.Structured(t, call(qid, again.RequestState)); out["status"] != "finished" || out["output"].(map[string]any)["chose"] != "A" {
		t.Fatalf("the answer to the question as it stands: %v", out)
	}
	if !boundTo(t, js, qid, now) {
		t.Errorf("the record does not say the answer was bound to %s", now)
	}
}

// TestElicitationBound: the same through elicitation within the call (an
// older protocol): the question reworded while the form is open, the
// answer is refused and the person asked again with the question as it
// stands.
func TestElicitationBound(t *testing.T) {
	e := newEnv(t, mcpserver.Config{})
	js, err := jetstream.New(e.sys.Server.Conn(t))
	if err != nil {
		t.Fatal(err)
	}
	thread := regexp.MustCompile(`thread (\S+), round`)
	var (
		mu    sync.Mutex
		asked []string
		now   string
	)
	handle := func(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, req.Params.Message)
		if len(asked) == 1 {
			// Asked anew reworded while the form is open.
			m := thread.FindStringSubmatch(req.Params.Message)
			if m == nil {
				t.Errorf("no thread in %q", req.Params.Message)
				return &mcp.ElicitResult{Action: "decline"}, nil
			}
			now = natstest.RewordQuestion(t, js, lifecycle.QuestionID(m[1]), " Or neither?")
		}
		return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"answer": "B"}}, nil
	}
	cs := e.connect(t, "carol", handle, "2025-11-25", false)
	out := mcptest.Structured(t, mcptest.Call(t, cs, "agora_dispatch", map[string]any{"subagent": "chooser"}))
	mu.Lock()
	defer mu.Unlock()
	if out["status"] != "finished" || out["output"].(map[string]any)["chose"] != "B" || len(asked) != 2 {
		t.Fatalf("result = %v, asked %d times, want finished after two", out, len(asked))
	}
	if !strings.Contains(asked[1], "the question changed") || !strings.Contains(asked[1], "Or neither?") {
		t.Errorf("asked again with %q, want why and the question as it stands", asked[1])
	}
	if !boundTo(t, js, lifecycle.QuestionID(out["thread_id"].(string)), now) {
		t.Errorf("the record does not say the answer was bound to %s", now)
	}
}
