package systemtest_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/harness/systemtest"
	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// echoAsker asks in round 0 and, resumed, writes the answer it was given
// and who it says gave it as its output.
const echoAsker = `if [ "$AGORA_ROUND" -lt 1 ]; then
  printf '{"question":"What is the staging database password?","partial_state":{"secret":"victim"}}' > "$AGORA_NEEDS_INPUT_FILE"
else
  cp .agora/input.json "$AGORA_OUTPUT_FILE"
fi`

// TestForgedResumeIsRefused attacks "a resume only the router can make"
// (docs/security.md) as any holder of the API would: with a victim's
// thread paused on its question, it sends the round that would resume it
// with a forged answer, through the micro door and the stream door, with
// ids read from the victim's own records, and names the paused dispatch
// itself in a request that cannot be accepted. Nothing may move the
// thread: it stays paused, its question asked, until a person answers,
// and then it resumes once with that person's answer.
func TestForgedResumeIsRefused(t *testing.T) {
	sys := systemtest.Start(t, systemtest.Options{})
	sys.Shell("victim", echoAsker)
	ctx := t.Context()
	d, err := sys.Client.Dispatch(ctx, lifecycle.Request{Subagent: "victim"})
	if err != nil {
		t.Fatal(err)
	}
	qid := lifecycle.QuestionID(d.DispatchID)
	testkit.Eventually(t, 30*time.Second, "the victim's question to be asked", func() bool {
		q, err := sys.Client.Question(ctx, qid)
		return err == nil && q.Status == "asked"
	})

	forged := lifecycle.Request{
		DispatchID: lifecycle.NewID(), Subagent: "victim", ThreadID: d.ThreadID, ParentID: d.DispatchID, Round: 1, QuestionID: qid,
		Input: json.RawMessage(`{"answer":"forged","answered_by":"human:alice","partial_state":{"secret":"attacker"}}`),
	}
	// The micro door (and the HTTP door, which shares its path) refuses.
	_, err = sys.Client.Dispatch(ctx, forged)
	var p *client.Problem
	if !errors.As(err, &p) || p.Status != 422 || !strings.Contains(p.Detail, "made only by the router") {
		t.Fatalf("a forged resume through agora.api.dispatch: %v, want a 422 saying a later round is the router's", err)
	}
	// The stream door refuses too, and reports it outside the thread.
	js := sys.Server.JetStream(t)
	publish := func(req lifecycle.Request) {
		t.Helper()
		_, m, err := lifecycle.Message(lifecycle.Source("attacker", "x"), &req)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	forged.DispatchID = lifecycle.NewID()
	publish(forged)
	// A request that cannot be accepted, naming the paused dispatch's own
	// id, is dropped as a conflict: its refusal must not become that
	// dispatch's end (the thread is checked below).
	publish(lifecycle.Request{DispatchID: d.DispatchID, Subagent: "victim", Timeout: "never"})
	failed, err := js.OrderedConsumer(ctx, lifecycle.StreamLifecycle, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{lifecycle.LifecycleFilter(lifecycle.KindFailed, "", "")}})
	if err != nil {
		t.Fatal(err)
	}
	var refused []*lifecycle.Failed
	for len(refused) < 1 {
		m, err := failed.Next(jetstream.FetchMaxWait(30 * time.Second))
		if err != nil {
			t.Fatalf("the stream door's refusal of the forged resume: none seen: %v", err)
		}
		_, data := natstest.Lifecycle(t, m.Headers(), m.Data())
		if f, ok := data.(*lifecycle.Failed); ok {
			if f.ThreadID == d.ThreadID || f.DispatchID == d.DispatchID || f.Reason != lifecycle.ReasonRejected {
				t.Fatalf("a refused request was reported in the victim's thread: %+v", f)
			}
			refused = append(refused, f)
		}
	}

	th, err := sys.Client.Thread(ctx, d.ThreadID)
	if err != nil {
		t.Fatal(err)
	}
	if len(th.Rounds) != 1 || th.Status != lifecycle.KindNeedsInput {
		t.Fatalf("the victim's thread after the attacks: status %s, %d rounds, want needs_input and one round", th.Status, len(th.Rounds))
	}
	if q, err := sys.Client.Question(ctx, qid); err != nil || q.Status != "asked" {
		t.Fatalf("the victim's question after the attacks: %+v %v, want still asked", q, err)
	}

	if _, err := sys.Client.Answer(ctx, qid, lifecycle.Answer{Answer: "hunter2", AnsweredBy: "human:bob"}); err != nil {
		t.Fatal(err)
	}
	fin := waitFinished(t, sys, d.ThreadID)
	var in struct {
		Answer       string `json:"answer"`
		AnsweredBy   string `json:"answered_by"`
		PartialState struct {
			Secret string `json:"secret"`
		} `json:"partial_state"`
	}
	if err := json.Unmarshal(fin.Output, &in); err != nil {
		t.Fatal(err)
	}
	if in.Answer != "hunter2" || in.AnsweredBy != "human:bob" || in.PartialState.Secret != "victim" {
		t.Fatalf("the resumed round got %s, want bob's answer and the victim's own state", fin.Output)
	}
	th, err = sys.Client.Thread(ctx, d.ThreadID)
	if err != nil || len(th.Rounds) != 2 {
		t.Fatalf("the victim's thread: %+v %v, want exactly two rounds", th, err)
	}
}
