package router_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/services/router"
)

// TestAskOnceStaysWithinASubagent attacks what sub-agents share through
// ask once (docs/security.md, "What sub-agents share") as a hostile
// sub-agent on the victim's route would: it reuses the victim's
// dedupe_key to join the victim's question and receive the person's
// answer, and plants a decision under a key the victim uses so that the
// victim's dangerous question is answered from memory. Neither may work:
// a dedupe_key joins and remembers within one sub-agent's questions, and
// memory answers only a question that shows what the decision was made
// on. A route whose operator widens sharing joins across sub-agents.
func TestAskOnceStaysWithinASubagent(t *testing.T) {
	e := newEnv(t, `routes:
  - name: shared
    match: {labels: {team: shared}}
    share_across_subagents: true
  - name: default
    remember: 1h
`)
	e.startRouter(e.config())
	asked := e.asked

	t.Run("answer theft through a dedupe_key", func(t *testing.T) {
		victim := lifecycle.NeedsInput{Common: lifecycle.Common{Subagent: "victim"}, Question: "What is the staging database password?", DedupeKey: "db-secret"}
		evil := lifecycle.NeedsInput{Common: lifecycle.Common{Subagent: "evil"}, Question: "Anything?", DedupeKey: "db-secret"}
		vq := e.askFrom(victim, 0)
		if r := asked(vq); r.Status != "asked" {
			t.Fatalf("the victim's question: %s", r.Status)
		}
		eq := e.askFrom(evil, 1)
		if r := asked(eq); r.Status != "asked" || r.JoinedTo != "" {
			t.Fatalf("another sub-agent's question with the victim's dedupe_key: status %s joined_to %q, want asked on its own", r.Status, r.JoinedTo)
		}
		if rep := e.answer(router.Submission{QuestionID: vq, Answer: "hunter2", AnsweredBy: "alice"}); rep.Status != client.AnswerAccepted {
			t.Fatalf("answer = %+v", rep)
		}
		e.waitStatus(vq, "answered")
		if reqs := e.requests("evil"); len(reqs) != 0 {
			t.Fatalf("the hostile sub-agent got %d re-dispatches from the victim's answer, want none", len(reqs))
		}
		if r, _ := e.record(eq); r.Status != "asked" {
			t.Errorf("the hostile question is %s after the victim's answer, want still asked", r.Status)
		}
	})

	t.Run("decision-memory poisoning", func(t *testing.T) {
		planted := lifecycle.NeedsInput{Common: lifecycle.Common{Subagent: "evil"}, Question: "Run the unit tests?", Options: []string{"yes", "no"}, DedupeKey: "ops"}
		pq := e.askFrom(planted, 2)
		asked(pq)
		if rep := e.answer(router.Submission{QuestionID: pq, Answer: "yes", AnsweredBy: "alice"}); rep.Status != client.AnswerAccepted {
			t.Fatalf("answer = %+v", rep)
		}
		e.waitStatus(pq, "answered")
		danger := lifecycle.NeedsInput{Common: lifecycle.Common{Subagent: "victim"}, Question: "Drop and recreate the PRODUCTION database?", Options: []string{"yes", "no"}, DedupeKey: "ops"}
		if r := asked(e.askFrom(danger, 3)); r.Status != "asked" || r.Reused != nil {
			t.Fatalf("another sub-agent's dangerous question under the planted key: status %s reused %+v, want asked", r.Status, r.Reused)
		}
		// The same sub-agent, the same key, another question: the person
		// who decided never saw it.
		same := planted
		same.Question = "Delete every branch?"
		if r := asked(e.askFrom(same, 4)); r.Status != "asked" || r.Reused != nil {
			t.Fatalf("the planter's own other question under its key: status %s reused %+v, want asked", r.Status, r.Reused)
		}
		// What was shown, again (its partial state too): memory answers it.
		again := e.askFrom(planted, 2)
		if r := e.waitStatus(again, "answered"); r.Reused == nil || r.Reused.QuestionID != pq {
			t.Errorf("the very question again: reused %+v, want answered from %s", r.Reused, pq)
		}
	})

	t.Run("an operator widens sharing", func(t *testing.T) {
		first := lifecycle.NeedsInput{Common: lifecycle.Common{Subagent: "lint"}, Question: "Adopt the new style?", DedupeKey: "style"}
		second := lifecycle.NeedsInput{Common: lifecycle.Common{Subagent: "format"}, Question: "Use the new style?", DedupeKey: "style"}
		labels := lifecycle.Request{Labels: map[string]string{"team": "shared"}}
		q1 := e.ask(first, labels, "")
		asked(q1)
		q2 := e.ask(second, labels, "")
		if r := e.waitRecord(q2, "joined", func(r questionRecord) bool { return r.Status == lifecycle.StatusJoined }); r.JoinedTo != q1 {
			t.Errorf("share_across_subagents: joined to %q, want %s", r.JoinedTo, q1)
		}
	})
}

// TestQuestionTooLargeForItsRecord: a needs_input event that fits while
// the question's record — which adds the request to resume with — does
// not ends its thread failed rejected, saying why, once; the event is
// acknowledged rather than redelivered forever.
func TestQuestionTooLargeForItsRecord(t *testing.T) {
	e := newEnv(t, "")
	e.startRouter(e.config())
	ni := lifecycle.NeedsInput{Common: lifecycle.Common{Subagent: "verbose"}, Question: "Which one?", Context: strings.Repeat("c", 500<<10)}
	qid := e.ask(ni, lifecycle.Request{Input: json.RawMessage(`{"notes":"` + strings.Repeat("n", 600<<10) + `"}`)}, "")
	var ended []event
	testkit.Eventually(t, waitFor, "the thread to end", func() bool {
		ended = e.streamEvents(lifecycle.StreamLifecycle, lifecycle.LifecycleFilter(lifecycle.KindFailed, strings.TrimPrefix(qid, "q-"), ""))
		return len(ended) > 0
	})
	f, ok := ended[0].Data.(*lifecycle.Failed)
	if !ok || f.Reason != lifecycle.ReasonRejected || !strings.Contains(f.Detail, "cannot be asked") || f.ParentID != strings.TrimPrefix(qid, "q-") || f.Round != 1 {
		t.Fatalf("the thread ended %+v, want failed rejected on round 1 saying the question cannot be asked", ended[0].Data)
	}
	if _, stored := e.record(qid); stored {
		t.Errorf("a record of %s was stored", qid)
	}
	c, err := e.js.Consumer(t.Context(), lifecycle.StreamLifecycle, provision.ConsumerRouter)
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, waitFor, "the needs_input acknowledged", func() bool {
		info, err := c.Info(t.Context())
		return err == nil && info.NumAckPending == 0 && info.NumPending == 0
	})
	if n := len(e.streamEvents(lifecycle.StreamLifecycle, lifecycle.LifecycleFilter(lifecycle.KindFailed, strings.TrimPrefix(qid, "q-"), ""))); n != 1 {
		t.Errorf("%d failed events in the thread, want 1", n)
	}
}

// asked waits for question q's first event and returns its record.
func (e *env) asked(q string) questionRecord {
	e.t.Helper()
	e.waitQuestionEvents(q, 1)
	rec, _ := e.record(q)
	return rec
}

// askAs asks ni on a thread principal dispatched (the Principal of its
// first round's record, as the dispatcher writes it); with round 1 the
// question is the thread's second round's, whose own record names no
// principal, so the router must read the owner from the first.
func (e *env) askAs(ni lifecycle.NeedsInput, principal string, round, n int) string {
	e.t.Helper()
	root := lifecycle.NewID()
	seed := func(id, parent string, r int, who string) {
		e.putDispatch(client.Record{DispatchID: id, ThreadID: root, ParentID: parent, Round: r, Subagent: ni.Subagent, Principal: who,
			Status: lifecycle.KindNeedsInput, Request: &lifecycle.Request{DispatchID: id, ThreadID: root, ParentID: parent, Round: r, Subagent: ni.Subagent, Input: json.RawMessage(`{}`)},
			CreatedAt: time.Now().UTC(), UpdatedAt: time.Now().UTC()})
	}
	seed(root, "", 0, principal)
	ni.DispatchID, ni.ThreadID, ni.Round = root, root, 0
	if round == 1 {
		ni.DispatchID, ni.ParentID, ni.Round = lifecycle.NewID(), root, 1
		seed(ni.DispatchID, root, 1, "")
	}
	ni.QuestionID = lifecycle.QuestionID(ni.DispatchID)
	ni.PartialState = json.RawMessage(fmt.Sprintf(`{"n":%d}`, n))
	e.publish(&ni, "")
	return ni.QuestionID
}

// Ask once stays within the threads of one dispatching principal
// (docs/security.md, "What sub-agents share"): a second team's thread
// asking the very same question, of the very same sub-agent, neither
// joins the first team's question (and so receives its person's answer)
// nor is answered from the first team's remembered decision; a route
// whose operator says share_across_principals joins them.
func TestAskOnceStaysWithinAPrincipal(t *testing.T) {
	e := newEnv(t, `routes:
  - name: shared
    match: {labels: {team: shared}}
    share_across_principals: true
  - name: default
    remember: 1h
`)
	e.startRouter(e.config())
	asked := e.asked
	ni := lifecycle.NeedsInput{Common: lifecycle.Common{Subagent: "deployer"}, Question: "Deploy to production now?", Options: []string{"yes", "no"}}
	for _, round := range []int{0, 1} {
		t.Run(fmt.Sprintf("round %d", round), func(t *testing.T) {
			q := ni
			q.Question = fmt.Sprintf("%s (round %d)", ni.Question, round)
			a1 := e.askAs(q, "team-a", round, 0)
			if r := asked(a1); r.Status != "asked" {
				t.Fatalf("team-a's question: %s", r.Status)
			}
			a2 := e.askAs(q, "team-a", round, 1)
			e.waitRecord(a2, "joined", func(r questionRecord) bool { return r.Status == lifecycle.StatusJoined })
			b1 := e.askAs(q, "team-b", round, 2)
			if r := asked(b1); r.Status != "asked" || r.JoinedTo != "" {
				t.Fatalf("team-b's same question: status %s joined_to %q, want asked on its own", r.Status, r.JoinedTo)
			}
			if rep := e.answer(router.Submission{QuestionID: a1, Answer: "yes", AnsweredBy: "alice"}); rep.Status != client.AnswerAccepted {
				t.Fatalf("answer = %+v", rep)
			}
			e.waitStatus(a1, "answered")
			e.waitStatus(a2, "answered")
			if r, _ := e.record(b1); r.Status != "asked" {
				t.Errorf("team-b's question is %s after team-a's answer, want still asked", r.Status)
			}
			// Remembered: team-a asks again, showing the same (partial
			// state too), and is answered at once; team-b asks again and
			// waits with its own first question.
			if r := e.waitStatus(e.askAs(q, "team-a", round, 0), "answered"); r.Reused == nil || r.Reused.QuestionID != a1 {
				t.Errorf("team-a again: reused %+v, want answered from %s", r.Reused, a1)
			}
			b2 := e.askAs(q, "team-b", round, 4)
			if r := e.waitRecord(b2, "joined", func(r questionRecord) bool { return r.Status != "" }); r.Status != lifecycle.StatusJoined || r.JoinedTo != b1 || r.Reused != nil {
				t.Errorf("team-b again: status %s joined_to %q reused %+v, want joined to its own %s", r.Status, r.JoinedTo, r.Reused, b1)
			}
		})
	}
	t.Run("a route that shares across principals", func(t *testing.T) {
		q := ni
		q.Question = "Shared question?"
		// The label on the request routes the question to "shared".
		s1 := e.askShared(q, "team-a", 5)
		asked(s1)
		s2 := e.askShared(q, "team-b", 6)
		e.waitRecord(s2, "joined across principals", func(r questionRecord) bool { return r.Status == lifecycle.StatusJoined && r.JoinedTo == s1 })
	})
}

// askShared is askAs on round 0 with the label that routes to "shared".
func (e *env) askShared(ni lifecycle.NeedsInput, principal string, n int) string {
	e.t.Helper()
	id := lifecycle.NewID()
	req := lifecycle.Request{DispatchID: id, ThreadID: id, Subagent: ni.Subagent, Input: json.RawMessage(`{}`), Labels: map[string]string{"team": "shared"}}
	e.putDispatch(client.Record{DispatchID: id, ThreadID: id, Subagent: ni.Subagent, Principal: principal, Status: lifecycle.KindNeedsInput,
		Request: &req, CreatedAt: time.Now().UTC(), UpdatedAt: time.Now().UTC()})
	ni.DispatchID, ni.ThreadID, ni.QuestionID = id, id, lifecycle.QuestionID(id)
	ni.PartialState = json.RawMessage(fmt.Sprintf(`{"n":%d}`, n))
	e.publish(&ni, "")
	return ni.QuestionID
}
