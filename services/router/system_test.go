package router_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/internal/testkit"
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
	b, _ := json.Marshal(subagent.Definition{Name: name, Runtime: subagent.RuntimeExec, Command: []string{"sh", "-c", script}, Timeout: "1m", EnvAllow: []string{"KEEP"}})
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

// newAskerSystem starts a router, the dispatcher and a worker on a new
// env with the sub-agent asker defined; it returns them with a context
// that bounds the test to two minutes.
func newAskerSystem(t *testing.T) (*env, *running, *client.Client, context.Context) {
	t.Helper()
	e := newEnv(t, "")
	rt := e.startRouter(e.config())
	c := e.startServices()
	e.define("asker", asker)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	t.Cleanup(cancel)
	return e, rt, c, ctx
}

// TestThroughDispatcher: with the real dispatcher and worker, an answer
// resumes the thread in round 1 with the answer and the partial state, and
// CancelThread on a thread paused on its question withdraws the question.
func TestThroughDispatcher(t *testing.T) {
	e, _, c, ctx := newAskerSystem(t)

	waitQuestion := func(thread string) lifecycle.Question { return waitAsked(ctx, t, c, thread) }

	// Answered: the thread resumes.
	d, err := c.Dispatch(ctx, lifecycle.Request{Subagent: "asker", Input: json.RawMessage(`{"task":"t"}`), Env: map[string]string{"KEEP": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	q := waitQuestion(d.ThreadID)
	if _, err := c.Answer(ctx, q.QuestionID, lifecycle.Answer{Answer: "B", AnsweredBy: "alice"}); err != nil {
		t.Fatal(err)
	}
	end, err := c.Follow(ctx, d.ThreadID, nil)
	if err != nil {
		t.Fatal(err)
	}
	fin, ok := end.Data.(*lifecycle.Finished)
	if !ok || fin.Round != 1 || fin.ParentID != d.DispatchID {
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

// waitAsked waits for the thread's asked question.
func waitAsked(ctx context.Context, t *testing.T, c *client.Client, thread string) lifecycle.Question {
	t.Helper()
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

// checkThreadCancelled checks, with the real services, how a thread
// cancelled by by while paused on question q ends: Follow returns
// cancelled (by, reason) on the thread's next dispatch, the question is
// withdrawn, a later answer is refused, and no dispatch of the thread has
// more than one terminal event.
func (e *env) checkThreadCancelled(ctx context.Context, c *client.Client, d *client.Dispatch, q lifecycle.Question, by, reason string) {
	t := e.t
	t.Helper()
	end, err := c.Follow(ctx, d.ThreadID, nil)
	if err != nil {
		t.Fatal(err)
	}
	cd, ok := end.Data.(*lifecycle.Cancelled)
	if !ok || cd.By != by || cd.Reason != reason || cd.Round != 1 || cd.ParentID != d.DispatchID || cd.ThreadID != d.ThreadID {
		t.Fatalf("thread ended %s %+v, want cancelled by %s", end.Kind(), end.Data, by)
	}
	r := e.waitStatus(q.QuestionID, "withdrawn")
	if r.NextDispatchID != cd.DispatchID || r.Outcome != "withdrawn" || !strings.Contains(r.Detail, "cancelled by "+by) {
		t.Errorf("question record: next %s outcome %s detail %q", r.NextDispatchID, r.Outcome, r.Detail)
	}
	var ae *client.AnswerError
	_, err = c.Answer(ctx, q.QuestionID, lifecycle.Answer{Answer: "A", AnsweredBy: "bob"})
	if !errors.Is(err, client.ErrAlreadyAnswered) || !errors.As(err, &ae) || !strings.Contains(ae.Reply.Reason, "withdrawn") || !strings.Contains(ae.Reply.Reason, "cancelled by "+by) {
		t.Errorf("answer after the cancel = %v, want refused: withdrawn, cancelled by %s", err, by)
	}
	// The dispatcher's view: the paused round and the round that ends the
	// thread, nothing re-dispatched.
	var th *client.Thread
	testkit.Eventually(t, time.Minute, "the thread's second round", func() bool {
		if th, err = c.Thread(ctx, d.ThreadID); err != nil {
			t.Fatal(err)
		}
		return len(th.Rounds) == 2
	})
	if th.Status != lifecycle.KindCancelled || len(th.Rounds) != 2 || th.Rounds[0].Status != lifecycle.KindNeedsInput ||
		th.Rounds[1].DispatchID != cd.DispatchID || th.Rounds[1].Request != nil || th.Rounds[1].Result == nil || th.Rounds[1].Result.By != by {
		t.Errorf("thread: %s, %d rounds", th.Status, len(th.Rounds))
	}
	terminal := map[string]int{}
	for _, ev := range e.streamEvents(lifecycle.StreamLifecycle, lifecycle.LifecycleFilter("", d.ThreadID, "")) {
		l := ev.Data.(lifecycle.Lifecycle)
		if l.LifecycleKind() == lifecycle.KindAccepted && l.Base().Round > 0 {
			t.Errorf("round %d accepted: the withdrawn question was re-dispatched", l.Base().Round)
		}
		if l.LifecycleKind().Terminal() {
			terminal[l.Base().DispatchID]++
		}
	}
	if len(terminal) != 2 || terminal[d.DispatchID] != 1 || terminal[cd.DispatchID] != 1 {
		t.Errorf("terminal events by dispatch: %v", terminal)
	}
}

// TestCancelPausedThreadEndToEnd: a sub-agent asks; the thread is
// cancelled through the dispatcher once the question exists; the thread
// ends cancelled, visibly, with the canceller's name. With the
// dispatcher's projection paused from the start, the cancel still finds
// the dispatch paused: its status is read from the chain.
func TestCancelPausedThreadEndToEnd(t *testing.T) {
	for _, lagging := range []bool{false, true} {
		name := "projection current"
		if lagging {
			name = "projection lagging"
		}
		t.Run(name, func(t *testing.T) {
			e, _, c, ctx := newAskerSystem(t)

			resume := func() {}
			if lagging {
				if _, err := e.js.PauseConsumer(ctx, lifecycle.StreamLifecycle, provision.ConsumerProjection, time.Now().Add(time.Hour)); err != nil {
					t.Fatal(err)
				}
				resume = func() {
					if _, err := e.js.ResumeConsumer(ctx, lifecycle.StreamLifecycle, provision.ConsumerProjection); err != nil {
						t.Fatal(err)
					}
				}
			}
			d, err := c.Dispatch(ctx, lifecycle.Request{Subagent: "asker"})
			if err != nil {
				t.Fatal(err)
			}
			q := waitAsked(ctx, t, c, d.ThreadID)
			if lagging {
				// The projection lags; the status is the chain's all the same.
				if rec, err := c.Status(ctx, d.DispatchID); err != nil || rec.Status != lifecycle.KindNeedsInput {
					t.Fatalf("status %v (%v) while the projection is paused, want the chain's needs_input", rec, err)
				}
			} else {
				testkit.Eventually(t, time.Minute, "the dispatch's record to show it paused (needs_input)", func() bool {
					rec, err := c.Status(ctx, d.DispatchID)
					if err != nil {
						t.Fatal(err)
					}
					return rec.Status == lifecycle.KindNeedsInput
				})
			}
			if _, err := c.CancelThread(ctx, d.ThreadID, client.CancelBy("carol", "wrong repository")); err != nil {
				t.Fatal(err)
			}
			resume()
			e.checkThreadCancelled(ctx, c, d, q, "carol", "wrong repository")
		})
	}
}

// TestCancelWhileTheRouterIsDown: the thread is cancelled while no router
// runs; the router started later withdraws the question from the mark the
// dispatcher left, refuses the answer and re-dispatches nothing.
func TestCancelWhileTheRouterIsDown(t *testing.T) {
	e, rt, c, ctx := newAskerSystem(t)

	d, err := c.Dispatch(ctx, lifecycle.Request{Subagent: "asker"})
	if err != nil {
		t.Fatal(err)
	}
	q := waitAsked(ctx, t, c, d.ThreadID)
	rt.stop()
	if _, err := c.CancelThread(ctx, d.ThreadID, client.CancelBy("dave", "")); err != nil {
		t.Fatal(err)
	}
	rec, err := c.Status(ctx, d.DispatchID)
	if err != nil {
		t.Fatal(err)
	}
	if m := rec.CancelRequested; m == nil || m.By != "dave" || m.DispatchID != d.DispatchID || m.ThreadID != d.ThreadID || m.At.IsZero() {
		t.Fatalf("no cancel mark on the paused dispatch: %+v", m)
	}
	if r, _ := e.record(q.QuestionID); r.Status != "asked" {
		t.Fatalf("question %s with no router running", r.Status)
	}
	e.startRouter(e.config())
	e.checkThreadCancelled(ctx, c, d, q, "dave", "")
}
