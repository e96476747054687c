package router_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/services/dispatcher"
	"github.com/agora-dispatch/agora/services/worker"
)

// startServices runs the real dispatcher and worker next to the router.
func (e *env) startServices() *client.Client {
	e.t.Helper()
	dconn, wconn := e.srv.Conn(e.t), e.srv.Conn(e.t)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	e.t.Cleanup(func() { cancel(); wg.Wait() })
	d, err := dispatcher.New(dispatcher.Config{ShutdownTimeout: 5 * time.Second}, dispatcher.Deps{Conn: dconn, Logger: quietLogger()})
	if err != nil {
		e.t.Fatal(err)
	}
	w, err := worker.New(worker.Config{WorkspaceRoot: e.t.TempDir(), Concurrency: 2, PullExpiry: 500 * time.Millisecond, ShutdownTimeout: 5 * time.Second},
		worker.Deps{Conn: wconn, Logger: quietLogger()})
	if err != nil {
		e.t.Fatal(err)
	}
	for name, run := range map[string]func(context.Context) error{"dispatcher": d.Run, "worker": w.Run} {
		wg.Go(func() {
			if err := run(ctx); err != nil {
				e.t.Errorf("%s: %v", name, err)
			}
		})
	}
	<-d.Ready()
	c, err := client.New(dconn)
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

func (e *env) define(name, script string) {
	e.t.Helper()
	kv, err := e.js.KeyValue(e.t.Context(), lifecycle.BucketSubagents)
	if err != nil {
		e.t.Fatal(err)
	}
	b, _ := json.Marshal(subagent.Definition{Name: name, Runtime: subagent.RuntimeExec, Command: []string{"sh", "-c", script}, Timeout: "1m"})
	if _, err := kv.Put(e.t.Context(), name, b); err != nil {
		e.t.Fatal(err)
	}
}

// asker asks in round 0 and copies its input to its output when resumed.
const asker = `if [ "$AGORA_ROUND" = "0" ]; then
  printf '{"question":"A or B?","options":["A","B"],"partial_state":{"step":1}}' > "$AGORA_NEEDS_INPUT_FILE"
else
  cp "$AGORA_INPUT_FILE" "$AGORA_OUTPUT_FILE"
fi`

// TestThroughDispatcher: with the real dispatcher and worker, an answer
// resumes the thread in round 1 with the answer and the partial state, and
// CancelThread on a thread paused on its question withdraws the question.
func TestThroughDispatcher(t *testing.T) {
	e := newEnv(t, "")
	e.startRouter(e.config())
	c := e.startServices()
	e.define("asker", asker)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	waitQuestion := func(thread string) lifecycle.Question {
		for {
			qs, err := c.Questions(ctx, client.QuestionFilter{ThreadID: thread, Status: "asked"})
			if err != nil {
				t.Fatal(err)
			}
			if len(qs) == 1 {
				return qs[0]
			}
			select {
			case <-ctx.Done():
				t.Fatal("no question")
			case <-time.After(25 * time.Millisecond):
			}
		}
	}

	// Answered: the thread resumes.
	d, err := c.Dispatch(ctx, lifecycle.Request{Subagent: "asker", Input: json.RawMessage(`{"task":"t"}`), Env: map[string]string{"KEEP": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	q := waitQuestion(d.ThreadID)
	if _, err := c.Answer(ctx, q.QuestionID, lifecycle.Answer{Answer: "B", AnsweredBy: "alice"}); err != nil {
		t.Fatal(err)
	}
	end, err := c.WaitThread(ctx, d.ThreadID, nil)
	if err != nil {
		t.Fatal(err)
	}
	fin, ok := end.Data.(*lifecycle.Finished)
	if !ok || fin.Round != 1 || fin.ParentID != d.ID {
		t.Fatalf("thread ended %+v", end.Data)
	}
	var in map[string]json.RawMessage
	if err := json.Unmarshal(fin.Output, &in); err != nil {
		t.Fatal(err)
	}
	if string(in["answer"]) != `"B"` || string(in["partial_state"]) != `{"step":1}` || string(in["task"]) != `"t"` {
		t.Errorf("round 1 input = %s", fin.Output)
	}
	rec, err := c.Status(ctx, fin.DispatchID)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Request == nil || rec.Request.Env["KEEP"] != "1" || rec.Request.QuestionID != q.QuestionID {
		t.Errorf("round 1 request = %+v", rec.Request)
	}

	// Cancelled while paused: the question is withdrawn, answers refused.
	d2, err := c.Dispatch(ctx, lifecycle.Request{Subagent: "asker"})
	if err != nil {
		t.Fatal(err)
	}
	q2 := waitQuestion(d2.ThreadID)
	// The dispatcher asks the router to withdraw only once its record of
	// the paused dispatch says needs_input (its projection may lag).
	for {
		rec, err := c.Status(ctx, d2.ID)
		if err != nil {
			t.Fatal(err)
		}
		if rec.Status == lifecycle.KindNeedsInput {
			break
		}
		time.Sleep(25 * time.Millisecond)
	}
	if _, err := c.CancelThread(ctx, d2.ThreadID, client.CancelBy("alice", "changed my mind")); err != nil {
		t.Fatal(err)
	}
	r := e.waitStatus(q2.QuestionID, "withdrawn")
	if !strings.Contains(r.Detail, "cancelled by alice: changed my mind") {
		t.Errorf("detail = %q", r.Detail)
	}
	var ae *client.AnswerError
	if _, err := c.Answer(ctx, q2.QuestionID, lifecycle.Answer{Answer: "A", AnsweredBy: "bob"}); !errors.Is(err, client.ErrAlreadyAnswered) || !errors.As(err, &ae) || !strings.Contains(ae.Reply.Reason, "withdrawn") {
		t.Errorf("answer after the cancel = %v, want already answered (withdrawn)", err)
	}
}
