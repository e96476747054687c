package slack_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// TestClickBound: a message's buttons carry what it showed. Asked anew
// reworded, the question refuses a signed click on the message as it was
// (nothing answered, an ephemeral says to look again) and the message is
// updated to the question as it stands; a click on that answers it,
// bound to what it shows.
func TestClickBound(t *testing.T) {
	w := startWorld(t, worldOptions{routes: routes, settings: settings})
	w.asks("ask-choice", choice)
	d, m := w.dispatch(t, "ask-choice", "C0OPS", nil)
	q := w.question(t, d.ThreadID)
	if blockID, _ := m.actions(); !strings.HasSuffix(blockID, "|"+q.ShownDigest) || q.ShownDigest == "" {
		t.Fatalf("block_id %q does not carry the question's shown digest %q", blockID, q.ShownDigest)
	}

	js, err := jetstream.New(w.Server.Conn(t))
	if err != nil {
		t.Fatal(err)
	}
	now := natstest.RewordQuestion(t, js, q.QuestionID, " (and delete B's tests)")
	_, els := m.actions()
	if code, _ := newInteraction(click(m, "U0BOB", els[1]), signingSecret, time.Now()).send(t, w.http.URL); code != http.StatusOK {
		t.Fatalf("click: HTTP %d", code)
	}
	testkit.Eventually(t, 30*time.Second, "an ephemeral reply", func() bool { return len(w.slack.callsOf("chat.postEphemeral")) == 1 })
	if e := w.slack.callsOf("chat.postEphemeral")[0].Form; e.Get("user") != "U0BOB" || !strings.Contains(e.Get("text"), "this question changed") {
		t.Errorf("ephemeral = %v", e)
	}
	if got := w.question(t, d.ThreadID); got.Status != "asked" {
		t.Fatalf("after the stale click the question is %s, want asked", got.Status)
	}

	var fresh postedMessage
	testkit.Eventually(t, 30*time.Second, "the message showing the question as it stands", func() bool {
		fresh, _ = w.slack.messageIn("C0OPS")
		id, _ := fresh.actions()
		return strings.HasSuffix(id, "|"+now)
	})
	if !strings.Contains(fresh.all(), "delete B's tests") {
		t.Errorf("the updated message does not show the question as it stands: %s", fresh.all())
	}
	_, els = fresh.actions()
	if code, _ := newInteraction(click(fresh, "U0BOB", els[1]), signingSecret, time.Now()).send(t, w.http.URL); code != http.StatusOK {
		t.Fatalf("click: HTTP %d", code)
	}
	if _, ok := waitThread(t, w.Client, d.ThreadID).(*lifecycle.Finished); !ok {
		t.Fatal("the thread did not finish after the click on the message as it stands")
	}
	e, err := natstest.KeyValue(t, js, lifecycle.BucketQuestions).Get(t.Context(), q.QuestionID)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(e.Value()), `"bound_digest":"`+now+`"`) {
		t.Errorf("the record does not say the click was bound to %s: %s", now, e.Value())
	}
	if !strings.Contains(string(e.Value()), `"named_door":"slack"`) {
		t.Errorf("the record does not say the click came through Slack: %s", e.Value())
	}
}

// TestModalBound: the modal "Answer…" opens carries the message's digest.
// The question asked anew reworded while the modal is open, its
// submission is refused in the modal itself and nothing is answered;
// "Answer…" on the message that still shows the old words opens no
// modal and says the question changed.
func TestModalBound(t *testing.T) {
	w := startWorld(t, worldOptions{routes: routes, settings: settings})
	w.asks("ask-free", `{"question":"Which region?"}`)
	d, m := w.dispatch(t, "ask-free", "C0OPS", nil)
	_, els := m.actions()
	if code, _ := newInteraction(click(m, "U0ALICE", els[0]), signingSecret, time.Now()).send(t, w.http.URL); code != http.StatusOK {
		t.Fatalf("click: HTTP %d", code)
	}
	testkit.Eventually(t, 30*time.Second, "the answer modal", func() bool { return len(w.slack.callsOf("views.open")) == 1 })
	view := w.slack.callsOf("views.open")[0].JSON

	js, err := jetstream.New(w.Server.Conn(t))
	if err != nil {
		t.Fatal(err)
	}
	q := w.question(t, d.ThreadID)
	natstest.RewordQuestion(t, js, q.QuestionID, " (the one for the new customers)")
	code, body := newInteraction(submission(view, "U0ALICE", "eu-west-1"), signingSecret, time.Now()).send(t, w.http.URL)
	if code != http.StatusOK || !strings.Contains(body, `"response_action":"errors"`) || !strings.Contains(body, "this question changed") {
		t.Fatalf("the modal's submission after the question changed: HTTP %d %s, want its errors saying so", code, body)
	}
	if got := w.question(t, d.ThreadID); got.Status != "asked" {
		t.Fatalf("after the stale modal the question is %s, want asked", got.Status)
	}

	// The message as it was: no modal, an ephemeral instead.
	if code, _ := newInteraction(click(m, "U0BOB", els[0]), signingSecret, time.Now()).send(t, w.http.URL); code != http.StatusOK {
		t.Fatalf("click: HTTP %d", code)
	}
	testkit.Eventually(t, 30*time.Second, "an ephemeral reply", func() bool { return len(w.slack.callsOf("chat.postEphemeral")) == 1 })
	if e := w.slack.callsOf("chat.postEphemeral")[0].Form; e.Get("user") != "U0BOB" || !strings.Contains(e.Get("text"), "this question changed") {
		t.Errorf("ephemeral = %v", e)
	}
	if n := len(w.slack.callsOf("views.open")); n != 1 {
		t.Errorf("%d modals opened, want none for the message that shows the old words", n-1)
	}
}
