package systemtest_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/harness/systemtest"
	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/answerer"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// retentionFor is the retention the tests run with: short, so finished
// work expires within the test.
const retentionFor = 2 * time.Second

// bigAsker asks in round 0 with a partial state too large to travel inline
// (so it is kept as an object), sleeps $SLEEP seconds in round 1, then
// finishes.
const bigAsker = `if [ "$AGORA_ROUND" -lt 1 ]; then
  head -c 70000 /dev/zero | tr '\0' 'x' > big
  printf '{"question":"A or B?","options":["A","B"],"partial_state":{"blob":"%s"}}' "$(cat big)" > "$AGORA_NEEDS_INPUT_FILE"
else
  sleep "${SLEEP:-0}"
  echo '{"done":true}' > "$AGORA_OUTPUT_FILE"
fi`

type buckets struct {
	dispatches, questions jetstream.KeyValue
	state                 jetstream.ObjectStore
}

func openBuckets(t *testing.T, sys *systemtest.System) buckets {
	t.Helper()
	js := sys.Server.JetStream(t)
	var b buckets
	var err error
	if b.dispatches, err = js.KeyValue(t.Context(), lifecycle.BucketDispatches); err != nil {
		t.Fatal(err)
	}
	if b.questions, err = js.KeyValue(t.Context(), lifecycle.BucketQuestions); err != nil {
		t.Fatal(err)
	}
	if b.state, err = js.ObjectStore(t.Context(), lifecycle.BucketState); err != nil {
		t.Fatal(err)
	}
	return b
}

// keys says which of the thread's records are still there.
func (b buckets) keys(t *testing.T, d0, d1 string) map[string]bool {
	t.Helper()
	ctx := t.Context()
	has := func(kv jetstream.KeyValue, key string) bool {
		_, err := kv.Get(ctx, key)
		if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Fatalf("get %s: %v", key, err)
		}
		return err == nil
	}
	_, serr := b.state.GetInfo(ctx, d0)
	out := map[string]bool{
		"dispatch round 0": has(b.dispatches, d0),
		"question":         has(b.questions, lifecycle.QuestionID(d0)),
		"state object":     serr == nil,
	}
	// A thread has an index once it has a second round (docs/dispatcher.md).
	if d1 != "" {
		out["dispatch round 1"] = has(b.dispatches, d1)
		out["thread index"] = has(b.dispatches, "thread."+d0)
	}
	return out
}

func answerWith(sys *systemtest.System, route, answer string, wait <-chan struct{}) {
	sys.Go("answerer", func(ctx context.Context) error {
		return answerer.ServeClient(ctx, sys.Client, route, answerer.HandlerFunc(func(ctx context.Context, q lifecycle.Question) (answerer.Reply, error) {
			select {
			case <-wait:
			case <-ctx.Done():
				return answerer.Reply{}, ctx.Err()
			}
			return answerer.Answer(answer), nil
		}), answerer.WithAnsweredBy("bot"), answerer.WithAckWait(5*time.Second))
	})
}

// waitFinished waits for the thread to end and fails the test unless it
// finished: these threads' sub-agent cannot fail and nothing cancels them.
func waitFinished(t *testing.T, sys *systemtest.System, threadID string) *lifecycle.Finished {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	end, err := sys.Client.Follow(ctx, threadID, nil)
	if err != nil {
		t.Fatal(err)
	}
	switch d := end.Data.(type) {
	case *lifecycle.Finished:
		return d
	case *lifecycle.Failed:
		t.Fatalf("thread %s: dispatch %s failed %s on worker %q, attempt %d: %s", threadID, d.DispatchID, d.Reason, d.WorkerID, d.Attempt, d.Detail)
	case *lifecycle.Cancelled:
		t.Fatalf("thread %s: dispatch %s cancelled by %q (%q)", threadID, d.DispatchID, d.By, d.Reason)
	}
	t.Fatalf("thread %s ended %T %+v", threadID, end.Data, end.Data)
	return nil
}

// eventually polls cond for up to 20 s.

// A question pending longer than the retention survives and is answered;
// the thread resumes (from its state object) and finishes; then, after the
// retention, its dispatch records, thread index, question record and state
// object are gone, and a status read says why.
func TestFinishedThreadExpires(t *testing.T) {
	sys := systemtest.Start(t, systemtest.Options{Retention: retentionFor, Routes: "routes:\n  - name: team\n    answerer: agent\n"})
	sys.Shell("big", bigAsker)
	b := openBuckets(t, sys)
	release := make(chan struct{})
	answerWith(sys, "team", "B", release)

	d, err := sys.Client.Dispatch(t.Context(), lifecycle.Request{Subagent: "big"})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 20*time.Second, "the question asked with its state object", func() bool {
		k := b.keys(t, d.DispatchID, "")
		return k["question"] && k["state object"]
	})
	time.Sleep(2 * retentionFor) // pending for longer than the retention
	for what, ok := range b.keys(t, d.DispatchID, "") {
		if !ok {
			t.Errorf("%s of a waiting thread expired", what)
		}
	}
	close(release)
	last := waitFinished(t, sys, d.ThreadID).DispatchID
	// The records say when they expire (read before they do).
	var expires *time.Time
	for deadline := time.Now().Add(retentionFor); time.Now().Before(deadline) && expires == nil; time.Sleep(20 * time.Millisecond) {
		if rec, err := sys.Client.Status(t.Context(), last); err == nil {
			expires = rec.ExpiresAt
		}
	}
	if expires == nil || expires.Before(time.Now()) || expires.After(time.Now().Add(retentionFor+time.Second)) {
		t.Errorf("the finished round's expires_at = %v, want about %s from its end", expires, retentionFor)
	}
	testkit.Eventually(t, 20*time.Second, "every record of the finished thread expired", func() bool {
		for what, ok := range b.keys(t, d.DispatchID, last) {
			if ok {
				t.Logf("still there: %s", what)
				return false
			}
		}
		return true
	})
	_, err = sys.Client.Status(t.Context(), d.DispatchID)
	if !errors.Is(err, client.ErrNotFound) || !strings.Contains(err.Error(), "AGORA_RETENTION") || !strings.Contains(err.Error(), retentionFor.String()) {
		t.Errorf("status of an expired dispatch: %v, want not found naming the retention", err)
	}
	if _, err := sys.Client.Thread(t.Context(), d.ThreadID); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("thread of an expired thread: %v, want not found", err)
	}
}

// A thread whose last round still runs keeps its records past the
// retention.
func TestRunningThreadKeepsItsRecords(t *testing.T) {
	sys := systemtest.Start(t, systemtest.Options{Retention: retentionFor, Routes: "routes:\n  - name: team\n    answerer: agent\n"})
	sys.Shell("big", bigAsker, "SLEEP")
	b := openBuckets(t, sys)
	release := make(chan struct{})
	close(release)
	answerWith(sys, "team", "A", release)
	d, err := sys.Client.Dispatch(t.Context(), lifecycle.Request{Subagent: "big", Env: map[string]string{"SLEEP": "6"}})
	if err != nil {
		t.Fatal(err)
	}
	var round1 string
	testkit.Eventually(t, 20*time.Second, "round 1 running", func() bool {
		th, err := sys.Client.Thread(t.Context(), d.ThreadID)
		if err != nil || len(th.Rounds) < 2 || th.Rounds[1].Status != lifecycle.KindStarted {
			return false
		}
		round1 = th.Rounds[1].DispatchID
		return true
	})
	time.Sleep(2 * retentionFor)
	k := b.keys(t, d.DispatchID, round1)
	for _, what := range []string{"dispatch round 0", "dispatch round 1", "thread index", "question"} {
		if !k[what] {
			t.Errorf("%s expired while the thread still runs", what)
		}
	}
	waitFinished(t, sys, d.ThreadID)
	testkit.Eventually(t, 20*time.Second, "the records expire once the thread ended", func() bool {
		k := b.keys(t, d.DispatchID, round1)
		return !k["dispatch round 0"] && !k["dispatch round 1"] && !k["thread index"] && !k["question"]
	})
}
