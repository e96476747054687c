package slack_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/answerer"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// rewrite changes question qid's record in the agora_questions bucket by
// compare-and-set, as the router does when threads join or leave it.
func (w *world) rewrite(t *testing.T, qid string, change func(rec map[string]any)) {
	t.Helper()
	kv := natstest.KeyValue(t, w.Server.JetStream(t), lifecycle.BucketQuestions)
	for attempt := 0; ; attempt++ {
		e, err := kv.Get(t.Context(), qid)
		if err != nil {
			t.Fatalf("record %s: %v", qid, err)
		}
		var rec map[string]any
		if err := json.Unmarshal(e.Value(), &rec); err != nil {
			t.Fatal(err)
		}
		change(rec)
		b, _ := json.Marshal(rec)
		if _, err = kv.Update(t.Context(), qid, b, e.Revision()); err == nil {
			return
		}
		if attempt == 5 {
			t.Fatalf("update %s: %v", qid, err)
		}
	}
}

// threads is a waiting_threads list of the question's own thread and n-1
// others.
func threads(q lifecycle.Question, n int) []any {
	out := []any{map[string]any{"question_id": q.QuestionID, "dispatch_id": q.DispatchID, "thread_id": q.ThreadID, "subagent": q.Subagent, "asked_at": q.AskedAt}}
	for i := 1; i < n; i++ {
		id := q.DispatchID + "-" + string(rune('a'+i))
		out = append(out, map[string]any{"question_id": "q-" + id, "dispatch_id": id, "thread_id": id, "subagent": q.Subagent, "asked_at": q.AskedAt})
	}
	return out
}

// TestThreadsCount: a question that more threads wait on says so in its
// message ("asked by 3 threads"), which is updated, buttons kept, each
// time threads join or leave, and loses the count when the asking thread
// waits alone again.
func TestThreadsCount(t *testing.T) {
	w := startWorld(t, worldOptions{routes: routes, settings: settings})
	w.asks("ask-choice", choice)
	d, m := w.dispatch(t, "ask-choice", "C0OPS", nil)
	if strings.Contains(m.all(), "asked by") {
		t.Errorf("a question one thread asked shows a count: %s", m.all())
	}
	q := w.question(t, d.ThreadID)
	step := func(n int, want string) postedMessage {
		t.Helper()
		updates := m.Updates
		w.rewrite(t, q.QuestionID, func(rec map[string]any) {
			if n == 1 {
				delete(rec, "waiting_threads")
			} else {
				rec["waiting_threads"] = threads(q, n)
			}
		})
		testkit.Eventually(t, 30*time.Second, "the message to say "+want, func() bool {
			m, _ = w.slack.messageIn("C0OPS")
			return m.Updates > updates && (want == "" || strings.Contains(m.all(), want))
		})
		if _, els := m.actions(); len(els) != 2 {
			t.Errorf("the updated message lost its buttons: %s", m.all())
		}
		return m
	}
	step(3, ":busts_in_silhouette: *asked by 3 threads*")
	step(2, "*asked by 2 threads*")
	if m = step(1, ""); strings.Contains(m.all(), "asked by") {
		t.Errorf("alone again, the message still counts: %s", m.all())
	}
	if n := len(w.slack.callsOf("chat.update")); n != 3 {
		t.Errorf("%d updates for 3 changes of the threads waiting", n)
	}
	// A change that leaves the count as it is changes nothing in Slack.
	w.rewrite(t, q.QuestionID, func(rec map[string]any) { rec["context"] = "Both keep the signature; B is shorter (edited)." })
	if _, err := w.Client.Answer(t.Context(), q.QuestionID, lifecycle.Answer{Answer: "A", AnsweredBy: "alice"}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, "the answered message", func() bool {
		m, _ = w.slack.messageIn("C0OPS")
		return strings.Contains(m.all(), "Answered *A* by *alice*")
	})
	if n := len(w.slack.callsOf("chat.update")); n != 4 {
		t.Errorf("%d updates in all, want the 3 counts and the answer", n)
	}
}

// TestSuggestionShown: a question that reaches Slack with an answerer's
// suggestion below the route's auto_accept shows it — by whom, the
// confidence, the rationale — with its button the primary one.
func TestSuggestionShown(t *testing.T) {
	w := startWorld(t, worldOptions{routes: routes, settings: settings, manual: true})
	w.asks("ask-choice", choice)
	w.asks("approver", `{"question":"Deploy to production?","kind":"approval"}`)
	suggest := func(name, answer string) {
		d, err := w.Client.Dispatch(t.Context(), lifecycle.Request{Subagent: name, Input: json.RawMessage(`{"task":"t"}`)})
		if err != nil {
			t.Fatal(err)
		}
		var qid string
		testkit.Eventually(t, time.Minute, "the question of "+name, func() bool {
			qs, err := w.Client.Questions(t.Context(), client.QuestionFilter{ThreadID: d.ThreadID})
			if err == nil && len(qs) == 1 {
				qid = qs[0].QuestionID
			}
			return qid != ""
		})
		w.rewrite(t, qid, func(rec map[string]any) {
			rec["suggestion"] = map[string]any{"answer": answer, "confidence": 0.72, "rationale": "B is shorter\nand keeps the signature",
				"by": "agent", "at": time.Now().UTC(), "accepted": false}
		})
	}
	suggest("ask-choice", "B")
	suggest("approver", "reject")
	s, _ := w.newAnswerer(t)
	w.Go("slack answerer", s.Run)
	w.ready(t, s)

	var m postedMessage
	testkit.Eventually(t, time.Minute, "the messages", func() bool {
		var ok1, ok2 bool
		m, ok1 = w.slack.messageIn("C0OPS")
		_, ok2 = w.slack.messageIn("C0APPROVE")
		return ok1 && ok2
	})
	if !strings.Contains(m.all(), `:bulb: Suggested by *agent*: *B* · confidence *72%*\n>B is shorter\n>and keeps the signature`) {
		t.Errorf("message = %s", m.all())
	}
	_, els := m.actions()
	if len(els) != 2 || els[1]["style"] != "primary" || els[0]["style"] != nil {
		t.Errorf("buttons = %+v", els)
	}
	a, _ := w.slack.messageIn("C0APPROVE")
	_, els = a.actions()
	if len(els) != 2 || els[0]["action_id"] != "approve" || els[0]["style"] != nil || els[1]["style"] != "primary" {
		t.Errorf("approval buttons = %+v", els)
	}
}

// TestThirtyThreadsOneMessage is asking once end to end, against the real
// router: 30 threads ask the same question and Slack gets one message,
// whose count follows them as they join ("asked by 30 threads") and as
// one is cancelled (29); one click answers it, every thread still waiting
// finishes with that answer, and the message says so.
func TestThirtyThreadsOneMessage(t *testing.T) {
	w := startWorld(t, worldOptions{routes: routes, settings: settings})
	w.asks("ask-choice", choice)
	const n = 30
	var ds []*client.Dispatch
	for range n {
		d, err := w.Client.Dispatch(t.Context(), lifecycle.Request{Subagent: "ask-choice", Input: json.RawMessage(`{"task":"t"}`)})
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, d)
	}
	var m postedMessage
	testkit.Eventually(t, time.Minute, "the message to say asked by 30 threads", func() bool {
		m, _ = w.slack.messageIn("C0OPS")
		return strings.Contains(m.all(), "*asked by 30 threads*")
	})
	if k := len(w.slack.callsOf("chat.postMessage")); k != 1 {
		t.Errorf("%d messages posted for one question", k)
	}
	// The last thread is cancelled: it leaves the question.
	if _, err := w.Client.CancelThread(t.Context(), ds[n-1].ThreadID); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, time.Minute, "the message to say asked by 29 threads", func() bool {
		m, _ = w.slack.messageIn("C0OPS")
		return strings.Contains(m.all(), "*asked by 29 threads*")
	})
	_, els := m.actions()
	if code, _ := newInteraction(click(m, "U0BOB", els[1]), signingSecret, time.Now()).send(t, w.http.URL); code != 200 {
		t.Fatalf("click: HTTP %d", code)
	}
	for i, d := range ds {
		end := waitThread(t, w.Client, d.ThreadID)
		if i == n-1 {
			if _, ok := end.(*lifecycle.Cancelled); !ok {
				t.Errorf("the cancelled thread ended %T", end)
			}
			continue
		}
		fin, ok := end.(*lifecycle.Finished)
		var in map[string]any
		if ok {
			_ = json.Unmarshal(fin.Output, &in)
		}
		if !ok || fin.Round != 1 || in["answer"] != "B" || in["answered_by"] != "slack:"+team+"/U0BOB" {
			t.Errorf("thread %d ended %T %+v", i, end, in)
		}
	}
	testkit.Eventually(t, 30*time.Second, "the answered message", func() bool {
		m, _ = w.slack.messageIn("C0OPS")
		return strings.Contains(m.all(), "Answered *B* by <@U0BOB>")
	})
	if !strings.Contains(m.all(), ", for the 29 threads waiting") {
		t.Errorf("the answered message does not say how many threads it answered: %s", m.all())
	}
	if _, els := m.actions(); els != nil {
		t.Errorf("the answered message keeps its buttons: %s", m.all())
	}
}

// suggestRoutes adds to the test routes a route whose answerer suggests,
// taken at 0.9 and sent to ops (Slack) below.
const suggestRoutes = `routes:
  - name: bots
    match: {subagent: "bot-*"}
    answerer: bot
    auto_accept: 0.9
    fallback: ops
  - name: ops
    match: {subagent: "ask-*"}
  - name: people
`

// TestSuggestionFromAnswerer, against the real router: an answerer's
// suggestion below the route's auto_accept sends the question to the
// Slack route preselected (its button primary, confidence and rationale
// shown); a click on another option is the answer.
func TestSuggestionFromAnswerer(t *testing.T) {
	w := startWorld(t, worldOptions{routes: suggestRoutes, settings: settings})
	w.Go("bot answerer", func(ctx context.Context) error {
		return answerer.Serve(ctx, w.Server.Conn(t), "bots", answerer.HandlerFunc(func(context.Context, lifecycle.Question) (answerer.Reply, error) {
			return answerer.Suggest("B", 0.72, "B is shorter"), nil
		}), answerer.WithAnsweredBy("bot"))
	})
	w.asks("bot-choice", choice)
	d, m := w.dispatch(t, "bot-choice", "C0OPS", nil)
	if !strings.Contains(m.all(), "Suggested by *bot*: *B* · confidence *72%*") || !strings.Contains(m.all(), ">B is shorter") {
		t.Errorf("message = %s", m.all())
	}
	_, els := m.actions()
	if len(els) != 2 || els[1]["style"] != "primary" || els[0]["style"] != nil {
		t.Fatalf("buttons = %+v", els)
	}
	if code, _ := newInteraction(click(m, "U0BOB", els[0]), signingSecret, time.Now()).send(t, w.http.URL); code != 200 {
		t.Fatalf("click: HTTP %d", code)
	}
	fin, ok := waitThread(t, w.Client, d.ThreadID).(*lifecycle.Finished)
	var in map[string]any
	if ok {
		_ = json.Unmarshal(fin.Output, &in)
	}
	if !ok || in["answer"] != "A" || in["answered_by"] != "slack:"+team+"/U0BOB" {
		t.Errorf("thread ended %+v", in)
	}
}
