package slack_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

const routes = `routes:
  - name: ops
    match: {subagent: "ask-*"}
    fallback: people
  - name: approvals
    match: {kind: approval}
  - name: timed
    match: {subagent: "slow-*"}
    deadline: 2s
  - name: people
`

const settings = `routes:
  ops:
    channel: C0OPS
  approvals:
    channel: C0APPROVE
    allow: [U0ALICE]
  timed:
    channel: C0TIMED
`

const choice = `{"question":"Rewrite function A or B?","options":["A","B"],"context":"Both keep the signature; B is shorter.","kind":"decision"}`

// TestClickAnswers: a question becomes a message with one button per
// option; a signed click answers it (answered_by slack:<team>/<user>),
// the thread resumes and finishes, and the message is updated without
// buttons.
func TestClickAnswers(t *testing.T) {
	w := startWorld(t, worldOptions{routes: routes, settings: settings})
	w.asks("ask-choice", choice)
	d, m := w.dispatch(t, "ask-choice", "C0OPS", nil)

	blockID, els := m.actions()
	if len(els) != 2 || els[0]["type"] != "button" || els[1]["value"] != "1" {
		t.Fatalf("actions %s = %+v", blockID, els)
	}
	q := w.question(t, d.ThreadID)
	for _, want := range []string{"Rewrite function A or B?", "Both keep the signature", "ask-choice", d.ThreadID, "https://agora.example.com/inbox/questions/" + q.QuestionID} {
		if !strings.Contains(m.all(), want) {
			t.Errorf("message lacks %q: %s", want, m.all())
		}
	}
	if m.Text == "" {
		t.Error("message without notification text")
	}

	code, _ := newInteraction(click(m, "U0BOB", els[1]), signingSecret, time.Now()).send(t, w.http.URL)
	if code != http.StatusOK {
		t.Fatalf("click: HTTP %d", code)
	}
	fin, ok := waitThread(t, w.Client, d.ThreadID).(*lifecycle.Finished)
	if !ok || fin.Round != 1 {
		t.Fatalf("thread ended %+v", fin)
	}
	var in map[string]any
	_ = json.Unmarshal(fin.Output, &in)
	if in["answer"] != "B" || in["answered_by"] != "slack:"+team+"/U0BOB" {
		t.Errorf("round 1 input = %s", fin.Output)
	}
	m = w.updated(t, "C0OPS", "the message")
	if _, els := m.actions(); els != nil {
		t.Errorf("the answered message keeps its buttons: %s", m.all())
	}
	if !strings.Contains(m.all(), "Answered *B* by <@U0BOB> at <!date^") {
		t.Errorf("updated message = %s", m.all())
	}
	if n := len(w.slack.callsOf("chat.postEphemeral")); n != 0 {
		t.Errorf("%d ephemeral messages for an accepted answer", n)
	}
}

// TestAnsweredElsewhere: a question answered through the client first
// has its message updated (by whom), and a later click is told it was
// already answered, changing nothing.
func TestAnsweredElsewhere(t *testing.T) {
	w := startWorld(t, worldOptions{routes: routes, settings: settings})
	w.asks("ask-choice", choice)
	d, m := w.dispatch(t, "ask-choice", "C0OPS", nil)
	q := w.question(t, d.ThreadID)
	if _, err := w.Client.Answer(t.Context(), q.QuestionID, lifecycle.Answer{Answer: "A", AnsweredBy: "alice"}); err != nil {
		t.Fatal(err)
	}
	now := w.updated(t, "C0OPS", "the message")
	if _, els := now.actions(); els != nil || !strings.Contains(now.all(), "Answered *A* by *alice*") {
		t.Errorf("updated message = %s", now.all())
	}
	// A click on the copy someone still had open.
	_, els := m.actions()
	if code, _ := newInteraction(click(m, "U0BOB", els[1]), signingSecret, time.Now()).send(t, w.http.URL); code != http.StatusOK {
		t.Fatalf("click: HTTP %d", code)
	}
	testkit.Eventually(t, 30*time.Second, "an ephemeral reply", func() bool { return len(w.slack.callsOf("chat.postEphemeral")) == 1 })
	e := w.slack.callsOf("chat.postEphemeral")[0].Form
	if e.Get("user") != "U0BOB" || e.Get("channel") != "C0OPS" || !strings.Contains(e.Get("text"), "Already answered by *alice* at <!date^") {
		t.Errorf("ephemeral = %v", e)
	}
	if got := w.question(t, d.ThreadID); got.Answer != "A" || got.AnsweredBy != "alice" {
		t.Errorf("question = %+v", got)
	}
	waitThread(t, w.Client, d.ThreadID)
}

// TestSignatures: forged, stale and replayed requests get 401 and answer
// nothing; the first of the replayed pair is the real one.
func TestSignatures(t *testing.T) {
	w := startWorld(t, worldOptions{routes: routes, settings: settings})
	w.asks("ask-choice", choice)
	d, m := w.dispatch(t, "ask-choice", "C0OPS", nil)
	_, els := m.actions()
	payload := click(m, "U0BOB", els[0])

	forged := newInteraction(payload, "not-the-secret", time.Now())
	stale := newInteraction(payload, signingSecret, time.Now().Add(-6*time.Minute))
	future := newInteraction(payload, signingSecret, time.Now().Add(6*time.Minute))
	tampered := newInteraction(payload, signingSecret, time.Now())
	tampered.body = append(tampered.body, []byte("&x=1")...)
	unsigned := newInteraction(payload, signingSecret, time.Now())
	unsigned.signature = ""
	for name, it := range map[string]interaction{"forged": forged, "stale": stale, "future": future, "tampered": tampered, "unsigned": unsigned} {
		if code, _ := it.send(t, w.http.URL); code != http.StatusUnauthorized {
			t.Errorf("%s: HTTP %d, want 401", name, code)
		}
	}
	time.Sleep(300 * time.Millisecond)
	if q := w.question(t, d.ThreadID); q.Status != "asked" {
		t.Fatalf("a refused request answered: %+v", q)
	}
	if n := testkit.Counter(t, w.reg, "agora_slack_requests_refused_total", nil); n != 5 {
		t.Errorf("refused requests counted %v, want 5", n)
	}

	good := newInteraction(payload, signingSecret, time.Now())
	if code, _ := good.send(t, w.http.URL); code != http.StatusOK {
		t.Fatalf("genuine click: HTTP %d", code)
	}
	if code, _ := good.send(t, w.http.URL); code != http.StatusUnauthorized {
		t.Errorf("replay: HTTP %d, want 401", code)
	}
	if n := testkit.Counter(t, w.reg, "agora_slack_requests_refused_total", map[string]string{"reason": "replay"}); n != 1 {
		t.Errorf("replays counted %v", n)
	}
	waitThread(t, w.Client, d.ThreadID)
	if q := w.question(t, d.ThreadID); q.Answer != "A" {
		t.Errorf("question = %+v", q)
	}
}

// TestSlackDown: chat.postMessage answering 429 (Retry-After honoured)
// and then 500s past the attempts declines the question to the route's
// fallback, logged and counted; a person answers it there.
func TestSlackDown(t *testing.T) {
	w := startWorld(t, worldOptions{routes: routes, settings: settings, attempts: 3, beforeRun: func(f *fakeSlack) {
		f.fail("chat.postMessage", http.StatusTooManyRequests, http.StatusInternalServerError, http.StatusInternalServerError)
	}})
	w.asks("ask-choice", choice)
	d, err := w.Client.Dispatch(t.Context(), lifecycle.Request{Subagent: "ask-choice", Input: json.RawMessage(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	var q lifecycle.Question
	testkit.Eventually(t, time.Minute, "the question to reach the fallback route", func() bool {
		qs, err := w.Client.Questions(t.Context(), client.QuestionFilter{ThreadID: d.ThreadID, Route: "people"})
		if err == nil && len(qs) == 1 {
			q = qs[0]
			return true
		}
		return false
	})
	if !strings.Contains(q.Detail, "ops") || !strings.Contains(q.Detail, "slack: the message could not be posted: slack server error: 500") {
		t.Errorf("detail = %q", q.Detail)
	}
	calls := w.slack.callsOf("chat.postMessage")
	if len(calls) != 3 {
		t.Fatalf("%d posts, want 3 attempts", len(calls))
	}
	if gap := calls[1].At.Sub(calls[0].At); gap < 900*time.Millisecond {
		t.Errorf("retried %s after a 429 with Retry-After: 1", gap)
	}
	if n := testkit.Counter(t, w.reg, "agora_slack_post_failures_total", map[string]string{"route": "ops", "reason": "api"}); n != 1 {
		t.Errorf("post failures counted %v", n)
	}
	if n := testkit.Counter(t, w.reg, "agora_slack_api_calls_total", map[string]string{"method": "chat.postMessage", "result": "rate_limited"}); n != 1 {
		t.Errorf("rate-limited calls counted %v", n)
	}
	if _, err := w.Client.Answer(t.Context(), q.QuestionID, lifecycle.Answer{Answer: "B", AnsweredBy: "carol"}); err != nil {
		t.Fatal(err)
	}
	waitThread(t, w.Client, d.ThreadID)
}

// TestWithdrawnAndExpired: a question whose thread is cancelled, and one
// that passes its route's deadline, have their messages updated.
func TestWithdrawnAndExpired(t *testing.T) {
	w := startWorld(t, worldOptions{routes: routes, settings: settings})
	w.asks("ask-choice", choice)
	w.asks("slow-choice", choice)
	d, _ := w.dispatch(t, "ask-choice", "C0OPS", nil)
	if _, err := w.Client.CancelThread(t.Context(), d.ThreadID, client.CancelBy("bob", "not needed")); err != nil {
		t.Fatal(err)
	}
	m := w.updated(t, "C0OPS", "the withdrawn question's message")
	if _, els := m.actions(); els != nil || !strings.Contains(m.all(), "Withdrawn") {
		t.Errorf("withdrawn message = %s", m.all())
	}

	slow, m := w.dispatch(t, "slow-choice", "C0TIMED", nil)
	if !strings.Contains(m.all(), "answer by <!date^") || !strings.Contains(m.all(), "left)") {
		t.Errorf("the message does not say the time left: %s", m.all())
	}
	m = w.updated(t, "C0TIMED", "the expired question's message")
	if _, els := m.actions(); els != nil || !strings.Contains(m.all(), "Expired") {
		t.Errorf("expired message = %s", m.all())
	}
	if _, ok := waitThread(t, w.Client, slow.ThreadID).(*lifecycle.Failed); !ok {
		t.Error("the expired thread did not fail")
	}
}

// TestApprovalAndAllowList: on a route with an allow-list, a stranger's
// click is refused with an ephemeral message and answers nothing; an
// allowed person's reject opens a modal whose comment reaches the
// sub-agent.
func TestApprovalAndAllowList(t *testing.T) {
	w := startWorld(t, worldOptions{routes: routes, settings: settings})
	w.asks("deployer", `{"question":"Deploy to production?","kind":"approval"}`)
	d, m := w.dispatch(t, "deployer", "C0APPROVE", nil)
	_, els := m.actions()
	if len(els) != 2 || els[0]["action_id"] != "approve" || els[1]["action_id"] != "reject" {
		t.Fatalf("approval actions = %+v", els)
	}
	if code, _ := newInteraction(click(m, "U0MALLORY", els[0]), signingSecret, time.Now()).send(t, w.http.URL); code != http.StatusOK {
		t.Fatalf("click: HTTP %d", code)
	}
	testkit.Eventually(t, 30*time.Second, "an ephemeral refusal", func() bool { return len(w.slack.callsOf("chat.postEphemeral")) == 1 })
	if e := w.slack.callsOf("chat.postEphemeral")[0].Form; e.Get("user") != "U0MALLORY" || !strings.Contains(e.Get("text"), "not on the list") {
		t.Errorf("ephemeral = %v", e)
	}
	if q := w.question(t, d.ThreadID); q.Status != "asked" {
		t.Fatalf("a stranger answered: %+v", q)
	}

	if code, _ := newInteraction(click(m, "U0ALICE", els[1]), signingSecret, time.Now()).send(t, w.http.URL); code != http.StatusOK {
		t.Fatalf("reject click: HTTP %d", code)
	}
	testkit.Eventually(t, 30*time.Second, "the reject modal", func() bool { return len(w.slack.callsOf("views.open")) == 1 })
	view := w.slack.callsOf("views.open")[0].JSON
	// A stranger cannot send the form either.
	code, body := newInteraction(submission(view, "U0MALLORY", "no"), signingSecret, time.Now()).send(t, w.http.URL)
	if code != http.StatusOK || !strings.Contains(body, `"response_action":"errors"`) {
		t.Errorf("stranger's submission: HTTP %d %s", code, body)
	}
	code, body = newInteraction(submission(view, "U0ALICE", "the change window is closed"), signingSecret, time.Now()).send(t, w.http.URL)
	if code != http.StatusOK || strings.TrimSpace(body) != "" {
		t.Fatalf("submission: HTTP %d %q", code, body)
	}
	fin, ok := waitThread(t, w.Client, d.ThreadID).(*lifecycle.Finished)
	if !ok {
		t.Fatalf("thread ended %+v", fin)
	}
	var in map[string]any
	_ = json.Unmarshal(fin.Output, &in)
	if in["decision"] != "reject" || in["comment"] != "the change window is closed" || in["answered_by"] != "slack:"+team+"/U0ALICE" {
		t.Errorf("round 1 input = %s", fin.Output)
	}
	m = w.updated(t, "C0APPROVE", "the message")
	if !strings.Contains(m.all(), "Answered *reject*") {
		t.Errorf("updated message = %s", m.all())
	}
}

// TestFreeTextAndManyOptions: a question without options gets "Answer…"
// and a modal; one with more than five options gets a static select;
// a direct message goes to the Slack user the label names.
func TestFreeTextAndManyOptions(t *testing.T) {
	w := startWorld(t, worldOptions{routes: routes + "", settings: `routes:
  ops:
    direct:
      label: assignee
      users: {alice: U0ALICE}
    channel: C0OPS
`})
	w.asks("ask-free", `{"question":"Which region?"}`)
	d, m := w.dispatch(t, "ask-free", "D0ALICE", map[string]string{"assignee": "alice"})
	_, els := m.actions()
	if len(els) != 1 || els[0]["action_id"] != "answer" {
		t.Fatalf("free-text actions = %+v", els)
	}
	if code, _ := newInteraction(click(m, "U0ALICE", els[0]), signingSecret, time.Now()).send(t, w.http.URL); code != http.StatusOK {
		t.Fatalf("click: HTTP %d", code)
	}
	testkit.Eventually(t, 30*time.Second, "the answer modal", func() bool { return len(w.slack.callsOf("views.open")) == 1 })
	view := w.slack.callsOf("views.open")[0].JSON
	if code, body := newInteraction(submission(view, "U0ALICE", "eu-west-1"), signingSecret, time.Now()).send(t, w.http.URL); code != http.StatusOK || strings.TrimSpace(body) != "" {
		t.Fatalf("submission: HTTP %d %q", code, body)
	}
	fin, ok := waitThread(t, w.Client, d.ThreadID).(*lifecycle.Finished)
	if !ok || !strings.Contains(string(fin.Output), `"answer":"eu-west-1"`) {
		t.Fatalf("thread ended %+v", fin)
	}

	opts := []string{"one", "two", "three", "four", "five", "six", strings.TrimSpace(strings.Repeat("long ", 30))}
	b, _ := json.Marshal(map[string]any{"question": "Pick one", "options": opts, "context": strings.Repeat("x", 2000)})
	w.asks("ask-many", string(b))
	d, m = w.dispatch(t, "ask-many", "C0OPS", map[string]string{"assignee": "zed"}) // no Slack user: the channel
	_, els = m.actions()
	if len(els) != 1 || els[0]["type"] != "static_select" {
		t.Fatalf("many-option actions = %+v", els)
	}
	if !strings.Contains(m.all(), "Open in inbox (full context)") {
		t.Errorf("cut context without a link to it: %s", m.all())
	}
	if code, _ := newInteraction(selectClick(m, "U0BOB", "6"), signingSecret, time.Now()).send(t, w.http.URL); code != http.StatusOK {
		t.Fatalf("select: HTTP %d", code)
	}
	fin, ok = waitThread(t, w.Client, d.ThreadID).(*lifecycle.Finished)
	if !ok || !strings.Contains(string(fin.Output), `"answer":"`+opts[6]+`"`) {
		t.Fatalf("thread ended %+v", fin)
	}
}

// TestRestartAndEscalation: the message of an open question is
// remembered across a restart: a question that escalates to another
// route while no answerer runs has its message updated by the next one.
func TestRestartAndEscalation(t *testing.T) {
	w := startWorld(t, worldOptions{routes: `routes:
  - name: esc
    match: {subagent: "esc-*"}
    deadline: 1m
    escalate: [{after: 3s, to: people}]
  - name: people
`, settings: `routes:
  esc:
    channel: C0ESC
`, manual: true})
	w.asks("esc-choice", choice)
	first, _ := w.newAnswerer(t)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- first.Run(ctx) }()
	w.ready(t, first)
	d, m := w.dispatch(t, "esc-choice", "C0ESC", nil)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	t.Log("first answerer stopped")
	testkit.Eventually(t, 30*time.Second, "the escalation", func() bool { return w.question(t, d.ThreadID).Route == "people" })
	// A new process knows the message only from the bucket.
	second, _ := w.newAnswerer(t)
	w.Go("second answerer", second.Run)
	w.ready(t, second)
	m = w.updated(t, "C0ESC", "the message")
	if _, els := m.actions(); els != nil || !strings.Contains(m.all(), "Moved to route *people*") {
		t.Errorf("escalated message = %s", m.all())
	}
	if n := len(w.slack.callsOf("chat.postMessage")); n != 1 {
		t.Errorf("%d messages posted for one question", n)
	}
}

// TestSocketMode: with an app-level token the same click arrives over
// Socket Mode, is acknowledged, and answers the question.
func TestSocketMode(t *testing.T) {
	w := startWorld(t, worldOptions{routes: routes, settings: settings, appToken: appToken})
	w.asks("ask-choice", choice)
	d, m := w.dispatch(t, "ask-choice", "C0OPS", nil)
	_, els := m.actions()
	env, _ := json.Marshal(map[string]any{
		"envelope_id": "env-1", "type": "interactive", "accepts_response_payload": true,
		"payload": click(m, "U0BOB", els[0]),
	})
	w.slack.envelopes <- env
	select {
	case ack := <-w.slack.acks:
		if ack["envelope_id"] != "env-1" {
			t.Errorf("ack = %v", ack)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the envelope was not acknowledged")
	}
	fin, ok := waitThread(t, w.Client, d.ThreadID).(*lifecycle.Finished)
	if !ok || !strings.Contains(string(fin.Output), `"answered_by":"slack:`+team+`/U0BOB"`) || !strings.Contains(string(fin.Output), `"answer":"A"`) {
		t.Fatalf("thread ended %+v", fin)
	}
}
