package mcpserver_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/harness/systemtest"
	"github.com/agora-dispatch/agora/internal/mcptest"
	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/answerer"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/services/mcpserver"
)

// newEnvRoutes is newEnv with a routing file.
func newEnvRoutes(t *testing.T, routes string) *env {
	t.Helper()
	sys := systemtest.Start(t, systemtest.Options{Routes: routes})
	sys.Shell("chooser", chooser)
	svc, err := mcpserver.New(t.Context(), mcpserver.Config{}, mcpserver.Deps{Client: sys.Client, Logger: systemtest.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	return &env{sys: sys, svc: svc}
}

// dispatchQueued starts n chooser threads without following them.
func (e *env) dispatchQueued(t *testing.T, n int) []string {
	t.Helper()
	var threads []string
	for range n {
		d, err := e.sys.Client.Dispatch(t.Context(), lifecycle.Request{Subagent: "chooser", Input: []byte(`{}`)})
		if err != nil {
			t.Fatal(err)
		}
		threads = append(threads, d.ThreadID)
	}
	return threads
}

// finishedWith waits for thread to finish and returns its output.
func (e *env) finishedWith(t *testing.T, thread string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	end, err := e.sys.Client.Follow(ctx, thread, nil)
	if err != nil {
		t.Fatalf("follow %s: %v", thread, err)
	}
	fin, ok := end.Data.(*lifecycle.Finished)
	if !ok {
		t.Fatalf("thread %s ended %T %+v", thread, end.Data, end.Data)
	}
	return string(fin.Output)
}

// Three threads asking the same question wait on one: agora_questions
// lists it once with threads_waiting 3 and the threads, and following
// any of the threads asks that one question, whose answer resumes all.
func TestQuestionsAskedOnceForThreeThreads(t *testing.T) {
	e := newEnvRoutes(t, "")
	threads := e.dispatchQueued(t, 3)
	cs := e.connect(t, "alice", nil, "", false)
	var q map[string]any
	testkit.Eventually(t, 30*time.Second, "one question for three threads", func() bool {
		l := mcptest.Structured(t, mcptest.Call(t, cs, "agora_questions", map[string]any{}))
		qs, _ := l["questions"].([]any)
		if len(qs) != 1 {
			return false
		}
		q = qs[0].(map[string]any)
		return q["threads_waiting"] == float64(3)
	})
	wt, _ := q["waiting_threads"].([]any)
	if len(wt) != 3 {
		t.Fatalf("waiting_threads = %v", q["waiting_threads"])
	}
	seen := map[string]bool{}
	for _, w := range wt {
		m := w.(map[string]any)
		seen[m["thread_id"].(string)] = true
		if m["dispatch_id"] == "" || !strings.HasPrefix(m["question_id"].(string), "q-") {
			t.Errorf("waiting thread %v", m)
		}
	}
	for _, th := range threads {
		if !seen[th] {
			t.Errorf("thread %s is not among the waiting threads %v", th, wt)
		}
	}
	asked := q["question_id"].(string)
	// A joined question names the question it waits on.
	jl := mcptest.Structured(t, mcptest.Call(t, cs, "agora_questions", map[string]any{"status": "joined"}))
	if js, _ := jl["questions"].([]any); len(js) != 2 || js[0].(map[string]any)["joined_to"] != asked || js[1].(map[string]any)["joined_to"] != asked {
		t.Errorf("joined questions = %v", jl)
	}

	// Following a thread whose question joined asks the asked one.
	var other string
	for _, th := range threads {
		if "q-"+th != asked {
			other = th
			break
		}
	}
	// agora_status of that thread names the question it waits on (the
	// dispatcher's record follows the stream a moment behind).
	testkit.Eventually(t, 10*time.Second, "agora_status of "+other+" waits on "+asked, func() bool {
		rounds, _ := mcptest.Structured(t, mcptest.Call(t, cs, "agora_status", map[string]any{"thread_id": other}))["rounds"].([]any)
		return len(rounds) == 1 && rounds[0].(map[string]any)["waits_on"] == asked
	})
	if rounds, _ := mcptest.Structured(t, mcptest.Call(t, cs, "agora_status", map[string]any{"thread_id": strings.TrimPrefix(asked, "q-")}))["rounds"].([]any); len(rounds) != 1 || rounds[0].(map[string]any)["waits_on"] != nil {
		t.Errorf("agora_status of the asking thread: %v", rounds)
	}

	r := &recorder{answers: []map[string]any{{"answer": "B"}}}
	ecs := e.connect(t, "bob", r.handle, "", false)
	out := mcptest.Structured(t, mcptest.Call(t, ecs, "agora_dispatch", map[string]any{"thread_id": other}))
	if out["status"] != "finished" || !strings.Contains(e.finishedWith(t, other), `"chose":"B"`) {
		t.Fatalf("following %s: %v", other, out)
	}
	if len(r.asked) != 1 || !strings.Contains(r.asked[0].Message, "3 threads asked this question") {
		t.Fatalf("asked %d times: %+v", len(r.asked), r.asked)
	}
	for _, th := range threads {
		if o := e.finishedWith(t, th); !strings.Contains(o, `"chose":"B"`) {
			t.Errorf("thread %s finished with %s", th, o)
		}
	}
}

// suggestRoutes send chooser's questions to a bot that suggests, and
// below auto_accept to people.
const suggestRoutes = `routes:
  - name: bots
    match: {subagent: chooser}
    answerer: bot
    auto_accept: 0.9
    fallback: people
  - name: people
    answerer: human
`

// A suggestion below the route's auto_accept waits on the fallback route:
// agora_questions shows it, and the elicitation preselects it.
func TestSuggestionIsShownAndPreselected(t *testing.T) {
	e := newEnvRoutes(t, suggestRoutes)
	conn := e.sys.Server.Conn(t)
	e.sys.Go("bot", func(ctx context.Context) error {
		return answerer.Serve(ctx, conn, "bots", answerer.HandlerFunc(func(context.Context, lifecycle.Question) (answerer.Reply, error) {
			return answerer.Suggest("B", 0.72, "B keeps the API"), nil
		}), answerer.WithLogger(systemtest.Logger()))
	})
	thread := e.dispatchQueued(t, 1)[0]
	cs := e.connect(t, "alice", nil, "", false)
	var q map[string]any
	testkit.Eventually(t, 30*time.Second, "the question on people with the suggestion", func() bool {
		l := mcptest.Structured(t, mcptest.Call(t, cs, "agora_questions", map[string]any{"thread_id": thread, "route": "people"}))
		qs, _ := l["questions"].([]any)
		if len(qs) != 1 {
			return false
		}
		q = qs[0].(map[string]any)
		return q["suggestion"] != nil
	})
	s := q["suggestion"].(map[string]any)
	if s["answer"] != "B" || s["confidence"] != 0.72 || s["rationale"] != "B keeps the API" || s["accepted"] != false || !strings.Contains(s["by"].(string), "bots") {
		t.Errorf("suggestion = %v", s)
	}

	r := &recorder{answers: []map[string]any{{"answer": "A"}}}
	ecs := e.connect(t, "bob", r.handle, "", false)
	out := mcptest.Structured(t, mcptest.Call(t, ecs, "agora_dispatch", map[string]any{"thread_id": thread}))
	if out["status"] != "finished" || !strings.Contains(e.finishedWith(t, thread), `"chose":"A"`) {
		t.Fatalf("result = %v", out)
	}
	if len(r.asked) != 1 {
		t.Fatalf("asked %d times", len(r.asked))
	}
	if ans := schemaOf(t, r.asked[0], "answer"); ans["default"] != "B" {
		t.Errorf("answer schema = %v, want the suggestion B as its default", ans)
	}
	if m := r.asked[0].Message; !strings.Contains(m, "Suggested by") || !strings.Contains(m, "B (confidence 0.72): B keeps the API") {
		t.Errorf("message = %q", m)
	}
}

// A route that remembers answers the same question again at once;
// agora_decisions lists the decision and agora_forget_decision forgets it,
// after which the question is asked again.
func TestDecisionsListedAndForgotten(t *testing.T) {
	e := newEnvRoutes(t, "routes:\n  - name: default\n    answerer: human\n    remember: 720h\n")
	cs := e.connect(t, "dave", nil, "", false)
	out := mcptest.Structured(t, mcptest.Call(t, cs, "agora_dispatch", map[string]any{"subagent": "chooser"}))
	if out["status"] != "needs_input" {
		t.Fatalf("first dispatch: %v", out)
	}
	qid, thread := out["question_id"].(string), out["thread_id"].(string)
	mcptest.Structured(t, mcptest.Call(t, cs, "agora_answer", map[string]any{"question_id": qid, "answer": "B"}))
	e.finishedWith(t, thread)

	var d map[string]any
	testkit.Eventually(t, 10*time.Second, "the decision remembered", func() bool {
		ds, _ := mcptest.Structured(t, mcptest.Call(t, cs, "agora_decisions", map[string]any{"route": "default"}))["decisions"].([]any)
		if len(ds) != 1 {
			return false
		}
		d = ds[0].(map[string]any)
		return true
	})
	if d["answer"] != "B" || d["question_id"] != qid || d["route"] != "default" || d["answered_by"] != "mcp:dave" || d["subagent"] != "chooser" || d["expires_at"] == "" {
		t.Errorf("decision = %v", d)
	}

	// The same question again is answered from memory, with provenance.
	out = mcptest.Structured(t, mcptest.Call(t, cs, "agora_dispatch", map[string]any{"subagent": "chooser"}))
	if out["status"] != "finished" || out["output"].(map[string]any)["chose"] != "B" {
		t.Fatalf("second dispatch: %v", out)
	}
	second := out["thread_id"].(string)
	l := mcptest.Structured(t, mcptest.Call(t, cs, "agora_questions", map[string]any{"thread_id": second, "status": "answered"}))
	qs, _ := l["questions"].([]any)
	if len(qs) != 1 {
		t.Fatalf("the second thread's questions: %v", l)
	}
	q := qs[0].(map[string]any)
	if q["answered_by"] != "memory:"+qid || q["reused"] == nil || q["reused"].(map[string]any)["question_id"] != qid || q["reused"].(map[string]any)["answered_by"] != "mcp:dave" {
		t.Errorf("the reused question = %v", q)
	}

	f := mcptest.Structured(t, mcptest.Call(t, cs, "agora_forget_decision", map[string]any{"id": d["id"]}))
	if f["forgotten"].(map[string]any)["id"] != d["id"] || !strings.Contains(f["note"].(string), "asked again") {
		t.Errorf("forget = %v", f)
	}
	if res := mcptest.Call(t, cs, "agora_forget_decision", map[string]any{"id": d["id"]}); !res.IsError || !strings.Contains(mcptest.Text(res), "agora_decisions lists them") {
		t.Errorf("forgetting it again: %s", mcptest.Text(res))
	}
	if res := mcptest.Call(t, cs, "agora_forget_decision", map[string]any{"id": "no such/id"}); !res.IsError || !strings.Contains(mcptest.Text(res), "not a decision id") {
		t.Errorf("a bad id: %s", mcptest.Text(res))
	}
	if ds, _ := mcptest.Structured(t, mcptest.Call(t, cs, "agora_decisions", map[string]any{}))["decisions"].([]any); len(ds) != 0 {
		t.Errorf("decisions after forgetting = %v", ds)
	}
	out = mcptest.Structured(t, mcptest.Call(t, cs, "agora_dispatch", map[string]any{"subagent": "chooser"}))
	if out["status"] != "needs_input" {
		t.Errorf("after forgetting, the question is asked again: %v", out)
	}
}
