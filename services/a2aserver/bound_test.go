package a2aserver_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// TestAnswerBound: with a2a-go's client, the input-required message
// carries the question's shown_digest in its metadata and an answer that
// echoes it is bound to it. Asked anew reworded, the question refuses an
// answer echoing the old digest (invalid params, saying it changed; the
// task still waits); the task as it stands carries the new digest, and
// an answer echoing that completes it.
func TestAnswerBound(t *testing.T) {
	e := newEnv(t)
	js, err := jetstream.New(e.sys.Server.Conn(t))
	if err != nil {
		t.Fatal(err)
	}
	c := e.connect(t, "token-a", a2a.TransportProtocolJSONRPC)
	task := send(t, c, start("chooser", "pick one"))
	qid := checkQuestion(t, task)
	shown, _ := task.Status.Message.Metadata["shown_digest"].(string)
	if !strings.HasPrefix(shown, "sha256:") {
		t.Fatalf("input-required metadata %v lacks shown_digest", task.Status.Message.Metadata)
	}
	now := natstest.RewordQuestion(t, js, qid, " Or C?")

	answer := func(task *a2a.Task, digest string) (a2a.SendMessageResult, error) {
		m := a2a.NewMessageForTask(a2a.MessageRoleUser, task, a2a.NewTextPart("B"))
		m.Metadata = map[string]any{"question_id": qid, "shown_digest": digest}
		return c.SendMessage(t.Context(), &a2a.SendMessageRequest{Message: m})
	}
	if _, err := answer(task, shown); !errors.Is(err, a2a.ErrInvalidParams) || !strings.Contains(err.Error(), "no longer shows") {
		t.Fatalf("an answer echoing the digest of the question as it was: %v, want invalid params saying it changed", err)
	}
	if q, err := e.sys.Client.Question(t.Context(), qid); err != nil || q.Status != "asked" {
		t.Fatalf("after the stale answer: %+v %v, want still asked", q, err)
	}

	got, err := c.GetTask(t.Context(), &a2a.GetTaskRequest{ID: task.ID})
	if err != nil || got.Status.Message == nil {
		t.Fatalf("tasks/get: %v %v", got, err)
	}
	if d := got.Status.Message.Metadata["shown_digest"]; d != now || !strings.Contains(got.Status.Message.Parts[0].Text(), "Or C?") {
		t.Fatalf("the task as it stands: shown_digest %v, question %q; want %s and the new words", d, got.Status.Message.Parts[0].Text(), now)
	}
	res, err := answer(got, now)
	if err != nil {
		t.Fatal(err)
	}
	if done, ok := res.(*a2a.Task); !ok || done.Status.State != a2a.TaskStateCompleted {
		t.Fatalf("the answer echoing the question as it stands: %+v, want completed", res)
	}
	e2, err := natstest.KeyValue(t, js, lifecycle.BucketQuestions).Get(t.Context(), qid)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(e2.Value()), `"bound_digest":"`+now+`"`) {
		t.Errorf("the record does not say the answer was bound to %s: %s", now, e2.Value())
	}
	if !strings.Contains(string(e2.Value()), `"named_door":"a2a"`) {
		t.Errorf("the record does not say the answer came through A2A: %s", e2.Value())
	}
}
