package router_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/services/router"
)

// sameQuestion is the question every thread of these tests asks.
var sameQuestion = lifecycle.NeedsInput{Common: lifecycle.Common{Subagent: "refactor"},
	Question: "The config loader: rename to readConfig or parseConfig?", Options: []string{"readConfig", "parseConfig"}, Kind: "decision"}

// askFrom asks ni from a new thread whose partial state is {"n": n}.
func (e *env) askFrom(ni lifecycle.NeedsInput, n int) string {
	e.t.Helper()
	ni.PartialState = json.RawMessage(fmt.Sprintf(`{"n":%d}`, n))
	return e.ask(ni, lifecycle.Request{Input: json.RawMessage(`{"task":"rename"}`)}, "")
}

// askGroup asks ni from n threads: the first is asked (and waited for),
// then the others concurrently. It returns the question ids, the asked
// one first, once the asked one lists every thread.
func (e *env) askGroup(ni lifecycle.NeedsInput, n int) []string {
	e.t.Helper()
	qids := []string{e.askFrom(ni, 0)}
	e.waitQuestionEvents(qids[0], 1)
	for i := 1; i < n; i++ {
		qids = append(qids, e.askFrom(ni, i))
	}
	e.waitRecord(qids[0], fmt.Sprintf("%d waiting threads", n), func(r questionRecord) bool { return len(r.WaitingThreads) == n })
	for _, q := range qids[1:] {
		e.waitRecord(q, "joined", func(r questionRecord) bool { return r.Status == lifecycle.StatusJoined })
	}
	return qids
}

// checkResumed checks that each question's thread got exactly one
// re-dispatch, carrying answer and its own partial state, and that each
// question ended answered with its own question.answered event.
func (e *env) checkResumed(qids []string, answer string) {
	e.t.Helper()
	t := e.t
	for _, q := range qids {
		e.waitStatus(q, "answered")
	}
	reqs := e.requests(sameQuestion.Subagent)
	if len(reqs) != len(qids) {
		t.Fatalf("%d re-dispatches for %d threads, want one each", len(reqs), len(qids))
	}
	byParent := map[string]*lifecycle.Request{}
	for _, ev := range reqs {
		r := ev.Data.(*lifecycle.Request)
		if byParent[r.ParentID] != nil {
			t.Errorf("dispatch %s re-dispatched twice", r.ParentID)
		}
		byParent[r.ParentID] = r
	}
	for i, q := range qids {
		rec, _ := e.record(q)
		req := byParent[rec.DispatchID]
		if req == nil {
			t.Errorf("%s (thread %s): no re-dispatch", q, rec.ThreadID)
			continue
		}
		in := inputOf(t, req)
		if got := jsonString(t, in["answer"]); got != answer || req.ThreadID != rec.ThreadID || req.DispatchID != rec.NextDispatchID {
			t.Errorf("%s: re-dispatch %s thread %s answer %q, want %s thread %s answer %q", q, req.DispatchID, req.ThreadID, got, rec.NextDispatchID, rec.ThreadID, answer)
		}
		if want := fmt.Sprintf(`{"n":%d}`, i); string(in["partial_state"]) != want {
			t.Errorf("%s: partial state %s, want its own %s", q, in["partial_state"], want)
		}
		var answered int
		for _, ev := range e.questionEvents(q) {
			if strings.HasSuffix(ev.Subject, ".answered") {
				answered++
				conform(t, ev)
			}
		}
		if answered != 1 {
			t.Errorf("%s: %d question.answered events, want 1", q, answered)
		}
	}
}

// TestAskOnce: thirty threads asking the same question make one waiting
// question, listed with every thread; one answer resumes each thread once,
// with its own partial state and its own answered event.
func TestAskOnce(t *testing.T) {
	e := newEnv(t, "routes:\n  - name: default\n")
	r := e.startRouter(e.config())
	const n = 30
	qids := e.askGroup(sameQuestion, n)

	lead, _ := e.record(qids[0])
	for i, w := range lead.WaitingThreads {
		if w.QuestionID != qids[i] && i == 0 {
			t.Errorf("waiting_threads[0] = %s, want the asking thread's question %s", w.QuestionID, qids[0])
		}
		if w.DispatchID == "" || w.ThreadID == "" || w.AskedAt.IsZero() {
			t.Errorf("waiting thread %d lacks ids or time: %+v", i, w)
		}
	}
	for _, q := range qids[1:] {
		rec, _ := e.record(q)
		if rec.JoinedTo != qids[0] {
			t.Errorf("%s joined_to = %q, want %s", q, rec.JoinedTo, qids[0])
		}
		// Never asked: its one event says it joined (docs/answering.md).
		if evs := e.questionEvents(q); len(evs) != 1 || !strings.HasSuffix(evs[0].Subject, ".joined") {
			t.Errorf("%s joined, yet has question events %v, want only joined", q, subjects(evs))
		}
	}
	c, err := client.New(e.nc)
	if err != nil {
		t.Fatal(err)
	}
	page, err := c.Waiting(t.Context(), client.QuestionFilter{}, 0, "")
	if err != nil {
		t.Fatal(err)
	}
	if page.Count != 1 || len(page.Questions) != 1 || len(page.Questions[0].WaitingThreads) != n {
		t.Fatalf("waiting questions: count %d, %d on the page, want one with %d threads", page.Count, len(page.Questions), n)
	}
	joined, _ := e.record(qids[n-1])
	byThread, err := c.Waiting(t.Context(), client.QuestionFilter{ThreadID: joined.ThreadID}, 0, "")
	if err != nil {
		t.Fatal(err)
	}
	if byThread.Count != 1 || byThread.Questions[0].QuestionID != qids[0] {
		t.Errorf("waiting questions of a joined thread: %d, want the question it joined", byThread.Count)
	}
	if got := counter(t, r.reg, "agora_router_questions_coalesced_total", map[string]string{"route": "default"}); got != n-1 {
		t.Errorf("questions coalesced = %v, want %d", got, n-1)
	}

	rep := e.answer(router.Submission{QuestionID: qids[0], Answer: "parseConfig", AnsweredBy: "alice"})
	if rep.Status != client.AnswerAccepted || !strings.Contains(rep.Reason, fmt.Sprintf("resumes the %d threads", n)) {
		t.Fatalf("answer = %+v", rep)
	}
	e.checkResumed(qids, "parseConfig")
	e.waitRecord(qids[0], "fan-out done", func(r questionRecord) bool { return len(r.Fanout) == 0 && !r.Release })

	// The question is asked afresh now: the next thread asks it.
	next := e.askFrom(sameQuestion, n)
	e.waitQuestionEvents(next, 1)
	if rec, _ := e.record(next); rec.Status != "asked" || rec.JoinedTo != "" {
		t.Errorf("after the answer, the same question: status %s joined_to %q, want asked on its own", rec.Status, rec.JoinedTo)
	}
}

// TestAskOnceRacingAnswers: concurrent answers, some through joined
// questions' ids, answer the group once.
func TestAskOnceRacingAnswers(t *testing.T) {
	e := newEnv(t, "routes:\n  - name: default\n")
	cfg := e.config()
	cfg.ID = "one"
	e.startRouter(cfg)
	cfg.ID = "two"
	e.startRouter(cfg)
	qids := e.askGroup(sameQuestion, 10)

	var mu sync.Mutex
	var accepted []client.AnswerReply
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			answer := []string{"readConfig", "parseConfig"}[i%2]
			rep := e.answer(router.Submission{QuestionID: qids[i], Answer: answer, AnsweredBy: fmt.Sprintf("person-%d", i)})
			if rep.Status == client.AnswerAccepted {
				mu.Lock()
				accepted = append(accepted, rep)
				mu.Unlock()
			} else if rep.Status != client.AnswerAlreadyAnswered {
				t.Errorf("answer %d: %+v, want accepted or already answered", i, rep)
			}
		})
	}
	wg.Wait()
	if len(accepted) != 1 {
		t.Fatalf("%d answers accepted, want 1: %+v", len(accepted), accepted)
	}
	lead := e.waitStatus(qids[0], "answered")
	if lead.AnsweredBy != accepted[0].AnsweredBy {
		t.Errorf("answered by %s, the accepted reply says %s", lead.AnsweredBy, accepted[0].AnsweredBy)
	}
	e.checkResumed(qids, lead.Answer)
}

// TestAskOnceRouterKilledDuringFanout: the router that took the answer
// dies a third of the way through the fan-out; another finishes it, and
// every thread is resumed exactly once.
func TestAskOnceRouterKilledDuringFanout(t *testing.T) {
	e := newEnv(t, "routes:\n  - name: default\n")
	const n = 12
	var steps int
	var stepMu sync.Mutex
	halted := make(chan struct{})
	release := make(chan struct{})
	router.SetFanoutStep(func(string) {
		stepMu.Lock()
		steps++
		k := steps
		stepMu.Unlock()
		if k == n/3 {
			close(halted)
			<-release
		}
	})
	t.Cleanup(func() { router.SetFanoutStep(nil) })
	t.Cleanup(func() { close(release) })

	conn := e.srv.Conn(t)
	cfg := e.config()
	cfg.ID = "doomed"
	doomed := e.startRouterOn(cfg, conn)
	qids := e.askGroup(sameQuestion, n)
	if rep := e.answer(router.Submission{QuestionID: qids[0], Answer: "readConfig", AnsweredBy: "alice"}); rep.Status != client.AnswerAccepted {
		t.Fatalf("answer = %+v", rep)
	}
	select {
	case <-halted:
	case <-time.After(waitFor):
		t.Fatal("the fan-out never reached its third thread")
	}
	// The router dies: its connection goes, then the process.
	conn.Close()
	doomed.stop()
	lead, _ := e.record(qids[0])
	if len(lead.Fanout) == 0 {
		t.Fatal("the fan-out finished before the router died: nothing to recover")
	}
	done := 0
	for _, q := range qids[1:] {
		if rec, _ := e.record(q); rec.Status == "answered" {
			done++
		}
	}
	t.Logf("router stopped with %d of %d joined threads resumed, %d left", done, n-1, len(lead.Fanout))

	cfg.ID = "survivor"
	e.startRouter(cfg)
	e.checkResumed(qids, "readConfig")
}

// cancelThread cancels a paused thread as the dispatcher does.
func (e *env) cancelThread(qid, by string) {
	e.t.Helper()
	rec, _ := e.record(qid)
	body, _ := json.Marshal(lifecycle.CancelRequest{DispatchID: rec.DispatchID, ThreadID: rec.ThreadID, By: by})
	subj, _ := lifecycle.CancelThreadSubject(rec.ThreadID)
	if err := e.nc.Publish(subj, body); err != nil {
		e.t.Fatal(err)
	}
}

// TestAskOnceCancel: a cancelled thread leaves the question; the others
// still get the answer; the question is withdrawn when its last thread
// leaves.
func TestAskOnceCancel(t *testing.T) {
	e := newEnv(t, "routes:\n  - name: default\n")
	e.startRouter(e.config())
	qids := e.askGroup(sameQuestion, 3)

	// A joined thread leaves: it ends cancelled, the question stays.
	e.cancelThread(qids[1], "bob")
	left := e.waitStatus(qids[1], "withdrawn")
	if evs := e.waitLifecycle(left.NextDispatchID); evs[0].Event.Type() != lifecycle.KindCancelled.Type() {
		t.Errorf("the cancelled thread ended with %s, want cancelled", evs[0].Event.Type())
	}
	e.waitRecord(qids[0], "two threads waiting", func(r questionRecord) bool { return len(r.WaitingThreads) == 2 && r.Status == "asked" })

	// The asking thread leaves: the question stays asked for the other.
	e.cancelThread(qids[0], "carol")
	lead := e.waitRecord(qids[0], "its asking thread gone", func(r questionRecord) bool { return r.Left })
	if lead.Status != "asked" || len(lead.WaitingThreads) != 1 || lead.WaitingThreads[0].QuestionID != qids[2] {
		t.Fatalf("after the asking thread left: status %s, waiting %+v; want asked, for %s alone", lead.Status, lead.WaitingThreads, qids[2])
	}
	if evs := e.waitLifecycle(lead.NextDispatchID); evs[0].Event.Type() != lifecycle.KindCancelled.Type() {
		t.Errorf("the asking thread ended with %s, want cancelled", evs[0].Event.Type())
	}
	if rep := e.answer(router.Submission{QuestionID: qids[0], Answer: "readConfig", AnsweredBy: "alice"}); rep.Status != client.AnswerAccepted {
		t.Fatalf("answer = %+v", rep)
	}
	e.waitStatus(qids[2], "answered")
	reqs := e.requests(sameQuestion.Subagent)
	if len(reqs) != 1 || reqs[0].Data.(*lifecycle.Request).ThreadID != lead.WaitingThreads[0].ThreadID {
		t.Errorf("re-dispatches %d, want the one of the thread still waiting", len(reqs))
	}

	// Every thread leaves: the question is withdrawn.
	qids = e.askGroup(sameQuestion, 2)
	e.cancelThread(qids[0], "dan")
	e.waitRecord(qids[0], "its asking thread gone", func(r questionRecord) bool { return r.Left })
	e.cancelThread(qids[1], "erin")
	lead = e.waitStatus(qids[0], "withdrawn")
	if !strings.Contains(lead.Detail, "the last by erin") {
		t.Errorf("withdrawn: %q", lead.Detail)
	}
}

// TestAskOnceMatching: what makes two questions one.
func TestAskOnceMatching(t *testing.T) {
	e := newEnv(t, `routes:
  - name: solo
    match: {subagent: solo}
    coalesce: false
  - name: default
`)
	e.startRouter(e.config())
	ask := func(ni lifecycle.NeedsInput) questionRecord {
		q := e.askFrom(ni, 0)
		return e.waitRecord(q, "asked or joined", func(r questionRecord) bool {
			return r.Status == "asked" && len(e.questionEvents(q)) > 0 || r.Status == lifecycle.StatusJoined
		})
	}
	first := ask(sameQuestion)
	for _, c := range []struct {
		name   string
		change func(*lifecycle.NeedsInput)
		joins  bool
	}{
		{"the same question", func(*lifecycle.NeedsInput) {}, true},
		{"other options", func(ni *lifecycle.NeedsInput) { ni.Options = []string{"readConfig", "loadConfig"} }, false},
		{"another kind", func(ni *lifecycle.NeedsInput) { ni.Kind = "clarification" }, false},
		{"another sub-agent", func(ni *lifecycle.NeedsInput) { ni.Subagent = "other" }, false},
		{"other words", func(ni *lifecycle.NeedsInput) { ni.Question += " " }, false},
		{"a route that does not coalesce", func(ni *lifecycle.NeedsInput) { ni.Subagent = "solo" }, false},
	} {
		ni := sameQuestion
		c.change(&ni)
		if got := ask(ni); (got.Status == lifecycle.StatusJoined) != c.joins {
			t.Errorf("%s: status %s joined_to %q, want joined %v", c.name, got.Status, got.JoinedTo, c.joins)
		}
	}
	_ = first

	// A dedupe_key matches over the words; different keys never join.
	keyed := lifecycle.NeedsInput{Common: lifecycle.Common{Subagent: "refactor"}, Question: "Rename the loader?", DedupeKey: "loader-name"}
	ask(keyed)
	keyed.Question = "What should the config loader be called?"
	if got := ask(keyed); got.Status != lifecycle.StatusJoined {
		t.Errorf("same dedupe_key, other words: status %s, want joined", got.Status)
	}
	keyed.DedupeKey = "loader-name-2"
	if got := ask(keyed); got.Status != "asked" {
		t.Errorf("another dedupe_key: status %s, want asked", got.Status)
	}
	solo := sameQuestion
	solo.Subagent = "solo"
	if got := ask(solo); got.Status != "asked" {
		t.Errorf("coalesce: false, the same question again: status %s, want asked", got.Status)
	}
}

// TestAskOnceExpiry: a group's deadline is its asking thread's; on expiry
// every thread takes the route's action.
func TestAskOnceExpiry(t *testing.T) {
	e := newEnv(t, "routes:\n  - name: default\n    deadline: 2s\n    on_expiry: default:readConfig\n")
	e.startRouter(e.config())
	qids := e.askGroup(sameQuestion, 3)
	for _, q := range qids {
		rec := e.waitStatus(q, "expired")
		if rec.AnsweredBy != router.DefaultAnsweredBy || rec.Answer != "readConfig" {
			t.Errorf("%s: expired answered by %s with %q, want the default", q, rec.AnsweredBy, rec.Answer)
		}
	}
	if reqs := e.requests(sameQuestion.Subagent); len(reqs) != 3 {
		t.Errorf("%d re-dispatches after expiry, want 3", len(reqs))
	}
}

// TestDecisionMemory: a route that remembers answers a later matching
// question at once, with provenance; forgetting asks again.
func TestDecisionMemory(t *testing.T) {
	e := newEnv(t, `routes:
  - name: approvals
    match: {kind: approval}
    remember: 1h
  - name: default
    remember: 1h
`)
	r := e.startRouter(e.config())
	c, err := client.New(e.nc)
	if err != nil {
		t.Fatal(err)
	}
	first := e.askFrom(sameQuestion, 0)
	e.waitQuestionEvents(first, 1)
	if rep := e.answer(router.Submission{QuestionID: first, Answer: "parseConfig", AnsweredBy: "alice", Comment: "house style"}); rep.Status != client.AnswerAccepted {
		t.Fatalf("answer = %+v", rep)
	}
	var ds []client.Decision
	testkit.Eventually(t, waitFor, "the decision remembered", func() bool {
		ds, err = c.Decisions(t.Context(), "")
		return err == nil && len(ds) == 1
	})
	d := ds[0]
	if d.QuestionID != first || d.Answer != "parseConfig" || d.AnsweredBy != "alice" || d.Route != "default" || d.ExpiresAt.Sub(d.AnsweredAt) != time.Hour {
		t.Errorf("decision = %+v", d)
	}

	// Tomorrow's identical question, showing the same partial state:
	// answered at once, from memory.
	again := e.askFrom(sameQuestion, 0)
	rec := e.waitStatus(again, "answered")
	if rec.AnsweredBy != "memory:"+first || rec.Reused == nil || rec.Reused.QuestionID != first || rec.Reused.AnsweredBy != "alice" {
		t.Errorf("reused answer: answered_by %s, reused %+v", rec.AnsweredBy, rec.Reused)
	}
	if evs := e.questionEvents(again); len(evs) != 1 || !strings.HasSuffix(evs[0].Subject, ".answered") {
		t.Errorf("events of a question answered from memory: %v, want one answered (never asked)", subjects(evs))
	} else {
		conform(t, evs...)
	}
	req := e.waitLifecycleRequest(rec.NextDispatchID)
	if in := inputOf(t, req); jsonString(t, in["answer"]) != "parseConfig" || jsonString(t, in["answered_by"]) != "memory:"+first || jsonString(t, in["comment"]) != "house style" {
		t.Errorf("re-dispatch input %s", req.Input)
	}
	if got := counter(t, r.reg, "agora_router_answers_reused_total", map[string]string{"route": "default"}); got != 1 {
		t.Errorf("answers reused = %v, want 1", got)
	}

	// reuse: false asks afresh.
	fresh := sameQuestion
	fresh.Reuse = new(bool)
	q := e.askFrom(fresh, 2)
	e.waitQuestionEvents(q, 1)
	if rec, _ := e.record(q); rec.Status != "asked" {
		t.Errorf("reuse false: status %s, want asked", rec.Status)
	}

	// An approval is not remembered on a route without remember_approvals.
	appr := lifecycle.NeedsInput{Common: lifecycle.Common{Subagent: "deployer"}, Question: "Deploy to prod?", Kind: "approval"}
	a1 := e.askFrom(appr, 0)
	e.waitQuestionEvents(a1, 1)
	if rep := e.answer(router.Submission{QuestionID: a1, Decision: "approve", AnsweredBy: "alice"}); rep.Status != client.AnswerAccepted {
		t.Fatalf("approve = %+v", rep)
	}
	e.waitStatus(a1, "answered")
	a2 := e.askFrom(appr, 1)
	e.waitQuestionEvents(a2, 1)
	if rec, _ := e.record(a2); rec.Status != "asked" {
		t.Errorf("a second approval: status %s, want asked (approvals are not remembered)", rec.Status)
	}

	// Forgotten: asked again; the thread it answered stays answered.
	if _, err := c.ForgetDecision(t.Context(), d.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ForgetDecision(t.Context(), d.ID); err == nil || !strings.Contains(err.Error(), "agora decisions list") {
		t.Errorf("forgetting twice: %v, want not found naming how to list", err)
	}
	// Answer the open one first, so the next is not joined to it.
	if rep := e.answer(router.Submission{QuestionID: q, Answer: "readConfig", AnsweredBy: "bob"}); rep.Status != client.AnswerAccepted {
		t.Fatalf("answer = %+v", rep)
	}
	e.waitRecord(q, "fan-out done", func(r questionRecord) bool { return r.Status == "answered" && !r.Release })
	testkit.Eventually(t, waitFor, "bob's answer remembered", func() bool {
		ds, err := c.Decisions(t.Context(), "default")
		return err == nil && len(ds) == 1 && ds[0].AnsweredBy == "bob"
	})
	if _, err := c.ForgetDecision(t.Context(), d.ID); err != nil {
		t.Fatal(err)
	}
	later := e.askFrom(sameQuestion, 3)
	e.waitQuestionEvents(later, 1)
	if rec, _ := e.record(later); rec.Status != "asked" {
		t.Errorf("after forget: status %s, want asked", rec.Status)
	}
	if rec, _ := e.record(again); rec.Status != "answered" || rec.AnsweredBy != "memory:"+first {
		t.Errorf("forgetting changed a thread already resumed: %s by %s", rec.Status, rec.AnsweredBy)
	}
}

// waitLifecycleRequest returns the re-dispatch request with dispatch id.
func (e *env) waitLifecycleRequest(dispatchID string) *lifecycle.Request {
	e.t.Helper()
	var req *lifecycle.Request
	testkit.Eventually(e.t, waitFor, "re-dispatch "+dispatchID, func() bool {
		for _, ev := range e.requests(sameQuestion.Subagent) {
			if r := ev.Data.(*lifecycle.Request); r.DispatchID == dispatchID {
				req = r
				return true
			}
		}
		return false
	})
	return req
}

// TestSuggestions: a suggestion at or above auto_accept answers; below,
// the question goes to the fallback with the suggestion.
func TestSuggestions(t *testing.T) {
	e := newEnv(t, `routes:
  - name: agents
    match: {subagent: refactor}
    auto_accept: 0.9
    fallback: human
  - name: human
    match: none
  - name: default
`)
	r := e.startRouter(e.config())
	suggest := func(qid string, conf float64) client.AnswerReply {
		return e.answerVia("agents", router.Submission{QuestionID: qid, Answer: "parseConfig", AnsweredBy: "agent:reviewer", Suggest: true, Confidence: &conf, Reason: "matches parseArgs"})
	}
	sure := e.askFrom(sameQuestion, 0)
	e.waitQuestionEvents(sure, 1)
	if rep := suggest(sure, 0.95); rep.Status != client.AnswerAccepted {
		t.Fatalf("confident suggestion = %+v", rep)
	}
	rec := e.waitStatus(sure, "answered")
	if rec.AnsweredBy != "suggested:agent:reviewer" || rec.Suggestion == nil || !rec.Suggestion.Accepted || rec.Suggestion.Confidence != 0.95 || rec.Suggestion.Rationale != "matches parseArgs" {
		t.Errorf("accepted suggestion: answered_by %s, suggestion %+v", rec.AnsweredBy, rec.Suggestion)
	}

	unsure := e.askFrom(sameQuestion, 1)
	e.waitQuestionEvents(unsure, 1)
	if rep := suggest(unsure, 0.6); rep.Status != client.AnswerAccepted || !strings.Contains(rep.Reason, "fallback route human") {
		t.Fatalf("unsure suggestion = %+v", rep)
	}
	rec = e.waitRecord(unsure, "moved to human", func(r questionRecord) bool { return r.Route == "human" })
	if rec.Status != "asked" || rec.Suggestion == nil || rec.Suggestion.Accepted || rec.Suggestion.Answer != "parseConfig" {
		t.Errorf("below auto_accept: status %s, suggestion %+v", rec.Status, rec.Suggestion)
	}
	if c := 1.5; e.answerVia("human", router.Submission{QuestionID: unsure, Answer: "readConfig", Suggest: true, Confidence: &c}).Status != client.AnswerInvalid {
		t.Error("a confidence above 1 was not refused")
	}
	if rep := e.answerVia("human", router.Submission{QuestionID: unsure, Answer: "readConfig", AnsweredBy: "alice"}); rep.Status != client.AnswerAccepted {
		t.Fatalf("person's answer = %+v", rep)
	}
	e.waitStatus(unsure, "answered")
	for result, want := range map[string]float64{"accepted": 1, "below": 1, "overridden": 1} {
		if got := counter(t, r.reg, "agora_router_suggestions_total", map[string]string{"result": result}); got != want {
			t.Errorf("suggestions %s = %v, want %v", result, got, want)
		}
	}
}

// TestAskOnceFullQuestion: a question lists a bounded number of threads;
// the next matching one is asked on its own and gathers the later ones.
func TestAskOnceFullQuestion(t *testing.T) {
	old := router.SetMaxWaitingThreads(3)
	t.Cleanup(func() { router.SetMaxWaitingThreads(old) })
	e := newEnv(t, "routes:\n  - name: default\n")
	e.startRouter(e.config())
	full := e.askGroup(sameQuestion, 3)
	second := e.askFrom(sameQuestion, 3)
	e.waitQuestionEvents(second, 1)
	third := e.askFrom(sameQuestion, 4)
	rec := e.waitRecord(third, "joined", func(r questionRecord) bool { return r.Status == lifecycle.StatusJoined })
	if rec.JoinedTo != second {
		t.Errorf("after a full question, the next joined %s, want %s (the one asked after it)", rec.JoinedTo, second)
	}
	if lead, _ := e.record(full[0]); len(lead.WaitingThreads) != 3 {
		t.Errorf("the full question lists %d threads, want 3", len(lead.WaitingThreads))
	}
}

// TestAskOnceListedButAskedAlone: a question listed among an asked one's
// waiting threads whose own record did not join it (it was asked on its
// own, as when its needs_input came back after the fan-out gave up on it)
// is not resumed by that answer, and the answered record stops listing it:
// the record names exactly the threads its answer resumed.
func TestAskOnceListedButAskedAlone(t *testing.T) {
	e := newEnv(t, "routes:\n  - name: default\n")
	e.startRouter(e.config())
	lead := e.askFrom(sameQuestion, 0)
	e.waitQuestionEvents(lead, 1)
	other := sameQuestion
	other.Question = "The cache: drop it or keep it?"
	other.Options = []string{"drop", "keep"}
	alone := e.askFrom(other, 1)
	e.waitQuestionEvents(alone, 1)

	// List alone's thread on lead, as a router that crashed between
	// listing a thread and writing its record would have left it.
	kv, err := e.js.KeyValue(t.Context(), lifecycle.BucketQuestions)
	if err != nil {
		t.Fatal(err)
	}
	en, err := kv.Get(t.Context(), lead)
	if err != nil {
		t.Fatal(err)
	}
	var raw map[string]any
	if err := json.Unmarshal(en.Value(), &raw); err != nil {
		t.Fatal(err)
	}
	lr, _ := e.record(lead)
	ar, _ := e.record(alone)
	raw["waiting_threads"] = []lifecycle.WaitingThread{
		{QuestionID: lead, DispatchID: lr.DispatchID, ThreadID: lr.ThreadID, Subagent: lr.Subagent, AskedAt: lr.AskedAt},
		{QuestionID: alone, DispatchID: ar.DispatchID, ThreadID: ar.ThreadID, Subagent: ar.Subagent, AskedAt: ar.AskedAt},
	}
	b, err := json.Marshal(raw)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Update(t.Context(), lead, b, en.Revision()); err != nil {
		t.Fatal(err)
	}

	if rep := e.answer(router.Submission{QuestionID: lead, Answer: "readConfig", AnsweredBy: "alice"}); rep.Status != client.AnswerAccepted {
		t.Fatalf("answer = %+v", rep)
	}
	got := e.waitRecord(lead, "fan-out done", func(r questionRecord) bool { return r.Status == "answered" && len(r.Fanout) == 0 && !r.Release })
	if len(got.WaitingThreads) != 1 || got.WaitingThreads[0].QuestionID != lead {
		t.Errorf("answered question lists %+v, want only its own thread", got.WaitingThreads)
	}
	unlisted := false
	for _, h := range got.History {
		unlisted = unlisted || (h.Result == "unlisted" && strings.Contains(h.Reason, alone))
	}
	if !unlisted {
		t.Errorf("answered question's history has no unlisted entry for %s: %+v", alone, got.History)
	}
	if rec, _ := e.record(alone); rec.Status != "asked" || rec.JoinedTo != "" {
		t.Errorf("the question asked on its own: status %s joined_to %q, want still asked", rec.Status, rec.JoinedTo)
	}
	if reqs := e.requests(sameQuestion.Subagent); len(reqs) != 1 {
		t.Fatalf("%d re-dispatches, want one: the lead's thread only", len(reqs))
	}

	// Its own answer resumes it, once.
	if rep := e.answer(router.Submission{QuestionID: alone, Answer: "keep", AnsweredBy: "bob"}); rep.Status != client.AnswerAccepted {
		t.Fatalf("answer = %+v", rep)
	}
	e.waitStatus(alone, "answered")
	testkit.Eventually(t, waitFor, "the second thread's re-dispatch", func() bool { return len(e.requests(sameQuestion.Subagent)) == 2 })
}

// TestAskOnceSeatedWhereItsRecordSays: a joined question is written
// before it is listed on the question it joined. When the listing fails
// (a full store, a crash) the redelivery of its needs_input lists it: on
// that question while it is still asked, else on the question holding the
// match by then. No question lists a thread whose record names another,
// and every thread is resumed once, by the answer of the question it was
// listed on.
func TestAskOnceSeatedWhereItsRecordSays(t *testing.T) {
	for _, c := range []struct {
		name         string
		leadAnswered bool // answered while the listing is held
		third        bool // then a third thread asks the same
	}{
		{name: "the question it joined still asked"},
		{name: "the question it joined answered, a third holds the match", leadAnswered: true, third: true},
		{name: "the question it joined answered, nobody holds the match", leadAnswered: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, "routes:\n  - name: default\n")
			held := make(chan string, 1)
			release := make(chan struct{})
			var first sync.Once
			router.SetSeatStep(func(qid string) error {
				hold := false
				first.Do(func() { hold = true })
				if !hold {
					return nil
				}
				held <- qid
				<-release
				return errors.New("listing refused, as by a full store")
			})
			t.Cleanup(func() { router.SetSeatStep(nil) })
			e.startRouter(e.config())

			lead := e.askFrom(sameQuestion, 0)
			e.waitQuestionEvents(lead, 1)
			late := e.askFrom(sameQuestion, 1)
			select {
			case q := <-held:
				if q != late {
					t.Fatalf("listing held for %s, want %s", q, late)
				}
			case <-time.After(waitFor):
				t.Fatal("the joined question was never about to be listed")
			}
			if rec, _ := e.record(late); rec.Status != lifecycle.StatusJoined || rec.JoinedTo != lead {
				t.Fatalf("before its listing the question is %s joined to %q, want joined to %s", rec.Status, rec.JoinedTo, lead)
			}
			if rec, _ := e.record(lead); len(rec.WaitingThreads) != 0 {
				t.Fatalf("the question joined lists %+v before the listing", rec.WaitingThreads)
			}

			holderOf, answer := lead, "readConfig"
			threads := []string{lead, late}
			if c.leadAnswered {
				if rep := e.answer(router.Submission{QuestionID: lead, Answer: "readConfig", AnsweredBy: "alice"}); rep.Status != client.AnswerAccepted {
					t.Fatalf("answer = %+v", rep)
				}
				e.waitRecord(lead, "answered, its match released", func(r questionRecord) bool {
					return r.Status == "answered" && len(r.Fanout) == 0 && !r.Release
				})
				holderOf, answer, threads = late, "parseConfig", []string{late}
				if c.third {
					third := e.askFrom(sameQuestion, 2)
					e.waitQuestionEvents(third, 1)
					holderOf, threads = third, []string{third, late}
				}
			}
			close(release)

			if holderOf == late {
				// Nobody to join: asked on its own, holding the match.
				if rec := e.waitStatus(late, "asked"); rec.JoinedTo != "" {
					t.Fatalf("the late question asked on its own still names %s", rec.JoinedTo)
				}
				e.waitQuestionEvents(late, 1)
			} else {
				e.waitRecord(holderOf, "both threads listed", func(r questionRecord) bool { return len(r.WaitingThreads) == 2 })
				if rec := e.waitRecord(late, "joined", func(r questionRecord) bool { return r.JoinedTo == holderOf }); rec.Status != lifecycle.StatusJoined {
					t.Fatalf("the late question is %s, want joined to %s", rec.Status, holderOf)
				}
			}
			if rep := e.answer(router.Submission{QuestionID: holderOf, Answer: answer, AnsweredBy: "bob"}); rep.Status != client.AnswerAccepted {
				t.Fatalf("answer = %+v", rep)
			}
			for _, q := range threads {
				e.waitStatus(q, "answered")
			}
			testkit.Eventually(t, waitFor, "one re-dispatch per thread", func() bool { return len(e.requests(sameQuestion.Subagent)) == len(threads)+boolInt(c.leadAnswered) })
			for _, q := range []string{lead, holderOf} {
				rec, _ := e.record(q)
				for _, h := range rec.History {
					if h.Result == "unlisted" {
						t.Errorf("question %s unlisted a thread: %s", q, h.Reason)
					}
				}
			}
			if rec, _ := e.record(lead); c.leadAnswered && len(rec.WaitingThreads) > 1 {
				t.Errorf("the question answered without it lists %+v", rec.WaitingThreads)
			}
			reqs := e.requests(sameQuestion.Subagent)
			late1, _ := e.record(late)
			for _, ev := range reqs {
				r := ev.Data.(*lifecycle.Request)
				if r.ParentID == late1.DispatchID {
					if got := jsonString(t, inputOf(t, r)["answer"]); got != answer {
						t.Errorf("the late thread resumed with %q, want %q", got, answer)
					}
				}
			}
		})
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
