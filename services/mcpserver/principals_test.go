package mcpserver_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/mcptest"
	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/services/mcpserver"
)

func hashOf(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// httpSession connects an MCP client over HTTP with token.
func httpSession(t *testing.T, url, token string) *mcp.ClientSession {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, nil)
	cs, err := c.Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: url,
		HTTPClient: &http.Client{Transport: bearer{token, http.DefaultTransport}}, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

// mustFail calls tool and wants a tool error containing want.
func mustFail(t *testing.T, cs *mcp.ClientSession, who, tool string, args map[string]any, want string) {
	t.Helper()
	res := mcptest.Call(t, cs, tool, args)
	if !res.IsError || !strings.Contains(mcptest.Text(res), want) {
		t.Errorf("%s %s(%v): %s, want an error with %q", who, tool, args, mcptest.Text(res), want)
	}
	if strings.Contains(mcptest.Text(res), "team-a") && who == "team-b" {
		t.Errorf("%s %s names the owner: %s", who, tool, mcptest.Text(res))
	}
}

// Over MCP as over /v1, a principal of the principals file owns the
// threads it dispatches: a second team holding its own token neither
// reads, follows, answers nor cancels them, and is told what it would be
// told of a thread that does not exist; a principal that sees all reads
// without cancelling; decisions, which answer everyone's threads, need
// see: all to list and admin to forget.
func TestMCPPrincipalsOwnTheirThreads(t *testing.T) {
	f := filepath.Join(t.TempDir(), "principals.yaml")
	body := fmt.Sprintf("principals:\n  - {name: team-a, token_sha256: %s}\n  - {name: team-b, token_sha256: %s, dispatch: [sleeper]}\n  - {name: audit, token_sha256: %s, see: all}\n  - {name: opsdesk, token_sha256: %s, see: all, answer: [ops]}\n  - {name: desk, token_sha256: %s, see: all, answer: [human]}\n",
		hashOf("token-a"), hashOf("token-b"), hashOf("token-audit"), hashOf("token-ops"), hashOf("token-desk"))
	if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, mcpserver.Config{PrincipalsFile: f})
	srv := httptest.NewServer(e.svc.Handler())
	defer srv.Close()
	a, b, audit := httpSession(t, srv.URL, "token-a"), httpSession(t, srv.URL, "token-b"), httpSession(t, srv.URL, "token-audit")

	out := mcptest.Structured(t, mcptest.Call(t, a, "agora_dispatch", map[string]any{"subagent": "chooser", "wait": false}))
	thread := out["thread_id"].(string)
	if rec, err := e.sys.Client.Status(t.Context(), thread); err != nil || rec.Principal != "team-a" {
		t.Fatalf("the thread's record: %+v %v, want principal team-a", rec, err)
	}
	var qid string
	testkit.Eventually(t, 30*time.Second, "team-a's question listed to team-a", func() bool {
		qs, _ := mcptest.Structured(t, mcptest.Call(t, a, "agora_questions", map[string]any{}))["questions"].([]any)
		if len(qs) == 1 {
			qid = qs[0].(map[string]any)["question_id"].(string)
		}
		return qid != ""
	})

	// team-b: nothing of team-a's thread.
	if qs, _ := mcptest.Structured(t, mcptest.Call(t, b, "agora_questions", map[string]any{}))["questions"].([]any); len(qs) != 0 {
		t.Errorf("team-b lists %v", qs)
	}
	if qs, _ := mcptest.Structured(t, mcptest.Call(t, b, "agora_questions", map[string]any{"status": "all"}))["questions"].([]any); len(qs) != 0 {
		t.Errorf("team-b lists (all) %v", qs)
	}
	mustFail(t, b, "team-b", "agora_status", map[string]any{"thread_id": thread}, "no thread")
	mustFail(t, b, "team-b", "agora_status", map[string]any{"dispatch_id": thread}, "no dispatch")
	mustFail(t, b, "team-b", "agora_events", map[string]any{"thread_id": thread}, "no thread")
	mustFail(t, b, "team-b", "agora_dispatch", map[string]any{"thread_id": thread}, "no thread")
	mustFail(t, b, "team-b", "agora_cancel", map[string]any{"thread_id": thread}, "no thread")
	mustFail(t, b, "team-b", "agora_cancel", map[string]any{"dispatch_id": thread}, "no dispatch")
	mustFail(t, b, "team-b", "agora_answer", map[string]any{"question_id": qid, "answer": "A"}, "no question")
	mustFail(t, b, "team-b", "agora_dispatch", map[string]any{"subagent": "chooser"}, "may not dispatch")
	mustFail(t, b, "team-b", "agora_decisions", map[string]any{}, "see: all")
	mustFail(t, b, "team-b", "agora_forget_decision", map[string]any{"id": "x"}, "admin")
	if q := question(t, e.sys.Client, thread); q.Status != "asked" {
		t.Fatalf("team-b's tries changed the question: %+v", q)
	}

	// audit reads it and cancels nothing.
	if st := mcptest.Structured(t, mcptest.Call(t, audit, "agora_status", map[string]any{"thread_id": thread})); st["status"] != "needs_input" {
		t.Errorf("audit status: %v", st)
	}
	mustFail(t, audit, "audit", "agora_cancel", map[string]any{"thread_id": thread}, "not cancel")
	// opsdesk sees every thread but answers only route ops: not this one.
	opsdesk := httpSession(t, srv.URL, "token-ops")
	mustFail(t, opsdesk, "opsdesk", "agora_answer", map[string]any{"question_id": qid, "answer": "A"}, "answer scope is [ops]")
	if q := question(t, e.sys.Client, thread); q.Status != "asked" {
		t.Fatalf("opsdesk's try changed the question: %+v", q)
	}

	// team-a answers its own question; the thread finishes with it.
	mcptest.Structured(t, mcptest.Call(t, a, "agora_answer", map[string]any{"question_id": qid, "answer": "B"}))
	if o := e.finishedWith(t, thread); !strings.Contains(o, `"chose":"B"`) {
		t.Errorf("the thread finished with %s", o)
	}
	if q := question(t, e.sys.Client, thread); q.AnsweredBy != "mcp:team-a" {
		t.Errorf("answered_by = %q", q.AnsweredBy)
	}

	// desk answers route human's questions of any thread: through the
	// route's door (agora.api.answer.human), recorded as such.
	out = mcptest.Structured(t, mcptest.Call(t, a, "agora_dispatch", map[string]any{"subagent": "chooser", "wait": false}))
	second := out["thread_id"].(string)
	var q2 lifecycle.Question
	testkit.Eventually(t, 30*time.Second, "the second question asked", func() bool {
		qs, err := e.sys.Client.Questions(t.Context(), client.QuestionFilter{ThreadID: second})
		if err == nil && len(qs) == 1 && qs[0].Status == "asked" {
			q2 = qs[0]
		}
		return q2.QuestionID != ""
	})
	if q2.Route != "human" {
		t.Fatalf("the question is on route %q, want human", q2.Route)
	}
	desk := httpSession(t, srv.URL, "token-desk")
	mcptest.Structured(t, mcptest.Call(t, desk, "agora_answer", map[string]any{"question_id": q2.QuestionID, "answer": "A"}))
	if o := e.finishedWith(t, second); !strings.Contains(o, `"chose":"A"`) {
		t.Errorf("the second thread finished with %s", o)
	}
	js, err := jetstream.New(e.sys.Client.Conn())
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(t.Context(), lifecycle.BucketQuestions)
	if err != nil {
		t.Fatal(err)
	}
	en, err := kv.Get(t.Context(), q2.QuestionID)
	if err != nil {
		t.Fatal(err)
	}
	var rec struct {
		AnsweredBy string `json:"answered_by"`
		History    []struct{ Door string }
	}
	if err := json.Unmarshal(en.Value(), &rec); err != nil {
		t.Fatal(err)
	}
	if rec.AnsweredBy != "mcp:desk" || len(rec.History) == 0 || rec.History[len(rec.History)-1].Door != "agora.api.answer.human" {
		t.Errorf("answered by %q, history %+v: want mcp:desk through agora.api.answer.human", rec.AnsweredBy, rec.History)
	}
}
