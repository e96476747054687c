package router_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/services/router"
)

// TestAskAnswerRedispatch: a needs_input becomes a question on its route;
// the first valid answer wins and is re-dispatched exactly once, carrying
// the original request's settings, the answer and the partial state; later
// and invalid answers are refused and kept in the history.
func TestAskAnswerRedispatch(t *testing.T) {
	e := newEnv(t, "routes:\n  - name: planning\n    match: {subagent: plan*}\n    answerer: human\n  - name: default\n")
	rt := e.startRouter(e.config())
	tp := lifecycle.NewTraceparent()
	req := lifecycle.Request{
		Subagent: "planner", Input: json.RawMessage(`{"task":"refactor","answer":"stale","n":1e400}`),
		Target: "repo-x", Env: map[string]string{"MODE": "fast"}, Labels: map[string]string{"team": "core"},
		Timeout: "5m", MaxRounds: 4,
	}
	qid := e.ask(lifecycle.NeedsInput{
		Common:   lifecycle.Common{Subagent: "planner"},
		Question: "Rewrite function A or B?", Options: []string{"A", "B"}, Context: "same signature", Kind: "decision",
		PartialState: json.RawMessage(`{"analysis": "done", "big": 1e400}`),
	}, req, tp)

	evs := e.waitQuestionEvents(qid, 1)
	if got := evs[0].Subject; got != "agora.questions.planning."+qid+".asked" {
		t.Fatalf("asked on %s", got)
	}
	q := evs[0].Data.(*lifecycle.Question)
	if q.Route != "planning" || q.Answerer != "human" || q.Status != "asked" || q.Question != "Rewrite function A or B?" ||
		q.Target != "repo-x" || q.Labels["team"] != "core" || len(q.Options) != 2 {
		t.Errorf("asked snapshot = %+v", q)
	}
	if strings.Contains(string(evs[0].Event.Data()), "analysis") {
		t.Error("the asked event carries the partial state; it must not go to answerers")
	}
	if lifecycle.TraceID(lifecycle.Traceparent(evs[0].Event)) != lifecycle.TraceID(tp) {
		t.Error("the asked event is not in the needs_input's trace")
	}

	// Refused: not an option, then empty.
	if rep := e.answer(router.Submission{QuestionID: qid, Answer: "C", AnsweredBy: "bob"}); rep.Status != client.AnswerInvalid || !strings.Contains(rep.Reason, "not one of the options") {
		t.Fatalf("answer C = %+v, want invalid", rep)
	}
	if rep := e.answer(router.Submission{QuestionID: qid, AnsweredBy: "bob"}); rep.Status != client.AnswerInvalid {
		t.Fatalf("empty answer = %+v, want invalid", rep)
	}
	// A decision on a decision question says what to send instead.
	if rep := e.answer(router.Submission{QuestionID: qid, Decision: "approve", AnsweredBy: "bob"}); rep.Status != client.AnswerInvalid ||
		!strings.Contains(rep.Reason, "only for approval questions") || !strings.Contains(rep.Reason, "one of the options: A, B") {
		t.Fatalf("a decision on a decision question = %+v, want invalid naming the options", rep)
	}
	rep := e.answer(router.Submission{QuestionID: qid, Answer: "B", AnsweredBy: "alice@example.com", Comment: "B is safer"})
	if rep.Status != client.AnswerAccepted || rep.AnsweredBy != "alice@example.com" || rep.AnsweredAt == nil {
		t.Fatalf("answer B = %+v, want accepted", rep)
	}
	late := e.answer(router.Submission{QuestionID: qid, Answer: "A", AnsweredBy: "carol"})
	if late.Status != client.AnswerAlreadyAnswered || late.AnsweredBy != "alice@example.com" || late.AnsweredAt == nil || !strings.Contains(late.Reason, "alice@example.com") {
		t.Fatalf("late answer = %+v, want already_answered by alice", late)
	}
	if rep := e.answer(router.Submission{QuestionID: "q-nothing", Answer: "A"}); rep.Status != client.AnswerNotFound {
		t.Fatalf("answer to an unknown question = %+v, want not_found", rep)
	}

	rec := e.waitStatus(qid, "answered")
	if len(rec.History) != 5 || rec.History[3].Result != "accepted" || rec.History[4].Status != "already_answered" ||
		rec.History[0].Status != "invalid" || rec.History[2].Status != "invalid" {
		t.Errorf("history = %+v, want invalid, invalid, invalid, accepted, already_answered", rec.History)
	}
	reqs := e.requests("planner")
	if len(reqs) != 1 {
		t.Fatalf("%d re-dispatches, want 1", len(reqs))
	}
	rd := reqs[0].Data.(*lifecycle.Request)
	if reqs[0].MsgID != qid {
		t.Errorf("Nats-Msg-Id = %q, want the question id", reqs[0].MsgID)
	}
	if rd.DispatchID != rec.NextDispatchID || rd.ThreadID != rec.ThreadID || rd.ParentID != rec.DispatchID || rd.Round != 1 || rd.QuestionID != qid {
		t.Errorf("re-dispatch ids = %+v, record %+v", rd, rec)
	}
	if rd.Target != "repo-x" || rd.Env["MODE"] != "fast" || rd.Labels["team"] != "core" || rd.Timeout != "5m" || rd.MaxRounds != 4 || rd.PartialStateRef != "" {
		t.Errorf("re-dispatch settings = %+v", rd)
	}
	in := inputOf(t, rd)
	if jsonString(t, in["answer"]) != "B" || jsonString(t, in["answered_by"]) != "alice@example.com" || jsonString(t, in["comment"]) != "B is safer" ||
		jsonString(t, in["task"]) != "refactor" || string(in["n"]) != "1e400" || string(in["partial_state"]) != `{"analysis":"done","big":1e400}` {
		t.Errorf("re-dispatch input = %s", rd.Input)
	}
	if _, ok := in["decision"]; ok {
		t.Error("input.decision set for an answer without a decision")
	}
	if lifecycle.TraceID(lifecycle.Traceparent(reqs[0].Event)) != lifecycle.TraceID(tp) {
		t.Error("the re-dispatch is not in the needs_input's trace")
	}
	evs = e.waitQuestionEvents(qid, 2)
	conform(t, append(evs, reqs...)...)
	ans := evs[1].Data.(*lifecycle.Question)
	if evs[1].Subject != "agora.questions.planning."+qid+".answered" || ans.AnsweredBy != "alice@example.com" || ans.Answer != "B" || ans.Status != "answered" {
		t.Errorf("answered event %s = %+v", evs[1].Subject, ans)
	}
	// The record reads as a lifecycle.Question for pkg/client.
	c, err := client.New(e.nc)
	if err != nil {
		t.Fatal(err)
	}
	qs, err := c.Questions(t.Context(), client.QuestionFilter{Status: "answered"})
	if err != nil || len(qs) != 1 || qs[0].QuestionID != qid || qs[0].AnsweredBy != "alice@example.com" {
		t.Errorf("client.Questions = %+v, %v", qs, err)
	}
	if _, err := c.Answer(t.Context(), qid, lifecycle.Answer{Answer: "A", AnsweredBy: "dave"}); !errors.Is(err, client.ErrAlreadyAnswered) {
		t.Errorf("client.Answer after the first = %v, want ErrAlreadyAnswered", err)
	}
	if counter(t, rt.reg, "agora_router_questions_total", map[string]string{"route": "planning", "outcome": "answered"}) != 1 {
		t.Error("questions_total{outcome=answered} is not 1")
	}
}

// TestLargeStateByReference: a partial state stored in agora_state is
// re-dispatched by reference, for the worker to resolve.
func TestLargeStateByReference(t *testing.T) {
	e := newEnv(t, "")
	e.startRouter(e.config())
	qid := e.ask(lifecycle.NeedsInput{
		Common: lifecycle.Common{Subagent: "big"}, Question: "Go on?", Kind: "clarification", PartialStateRef: "the-object",
	}, lifecycle.Request{Input: json.RawMessage(`{"task":"t","partial_state":"old"}`)}, "")
	if q := e.waitQuestionEvents(qid, 1)[0]; q.Subject != "agora.questions.human."+qid+".asked" {
		t.Fatalf("asked on %s, want the built-in route human", q.Subject)
	}
	if rep := e.answer(router.Submission{QuestionID: qid, Answer: "yes", AnsweredBy: "alice"}); rep.Status != client.AnswerAccepted {
		t.Fatal(rep)
	}
	e.waitStatus(qid, "answered")
	reqs := e.requests("big")
	if len(reqs) != 1 {
		t.Fatalf("%d re-dispatches", len(reqs))
	}
	rd := reqs[0].Data.(*lifecycle.Request)
	in := inputOf(t, rd)
	if rd.PartialStateRef != "the-object" {
		t.Errorf("partial_state_ref = %q", rd.PartialStateRef)
	}
	if _, ok := in["partial_state"]; ok {
		t.Errorf("input carries partial_state %s; the worker resolves the reference", in["partial_state"])
	}
}

// TestApprovalNeedsDecision: an approval question needs approve or reject.
func TestApprovalNeedsDecision(t *testing.T) {
	e := newEnv(t, "")
	e.startRouter(e.config())
	qid := e.ask(lifecycle.NeedsInput{Common: lifecycle.Common{Subagent: "deployer"}, Question: "Deploy?", Kind: "approval"}, lifecycle.Request{}, "")
	e.waitQuestionEvents(qid, 1)
	if rep := e.answer(router.Submission{QuestionID: qid, Answer: "yes", AnsweredBy: "a"}); rep.Status != client.AnswerInvalid || !strings.Contains(rep.Reason, "decision") {
		t.Fatalf("approval without a decision = %+v", rep)
	}
	if rep := e.answer(router.Submission{QuestionID: qid, Decision: "maybe", AnsweredBy: "a"}); rep.Status != client.AnswerInvalid {
		t.Fatalf("decision maybe = %+v", rep)
	}
	if rep := e.answer(router.Submission{QuestionID: qid, Decision: "approve", AnsweredBy: "a"}); rep.Status != client.AnswerAccepted {
		t.Fatalf("approve = %+v", rep)
	}
	e.waitStatus(qid, "answered")
	in := inputOf(t, e.requests("deployer")[0].Data.(*lifecycle.Request))
	if jsonString(t, in["decision"]) != "approve" || jsonString(t, in["answer"]) != "approve" {
		t.Errorf("input = %v", in)
	}
}

// TestConcurrentAnswers: 50 answers at once to one question: exactly one
// is accepted and re-dispatched, 49 are refused with who answered.
func TestConcurrentAnswers(t *testing.T) {
	e := newEnv(t, "")
	e.startRouter(e.config())
	qid := e.ask(lifecycle.NeedsInput{Common: lifecycle.Common{Subagent: "racer"}, Question: "Pick", Options: []string{"A", "B"}}, lifecycle.Request{}, "")
	e.waitQuestionEvents(qid, 1)

	const n = 50
	replies := make([]client.AnswerReply, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			replies[i] = e.answer(router.Submission{QuestionID: qid, Answer: []string{"A", "B"}[i%2], AnsweredBy: fmt.Sprintf("user-%d", i)})
		})
	}
	wg.Wait()
	var accepted []client.AnswerReply
	refused := 0
	for _, r := range replies {
		switch r.Status {
		case client.AnswerAccepted:
			accepted = append(accepted, r)
		case client.AnswerAlreadyAnswered:
			refused++
		default:
			t.Errorf("reply %+v", r)
		}
	}
	if len(accepted) != 1 || refused != n-1 {
		t.Fatalf("%d accepted, %d refused; want 1 and %d", len(accepted), refused, n-1)
	}
	for _, r := range replies {
		if r.Status == client.AnswerAlreadyAnswered && (r.AnsweredBy != accepted[0].AnsweredBy || !strings.Contains(r.Reason, accepted[0].AnsweredBy)) {
			t.Fatalf("refusal %+v does not name the winner %s", r, accepted[0].AnsweredBy)
		}
	}
	rec := e.waitStatus(qid, "answered")
	if len(rec.History) != n {
		t.Errorf("history has %d entries, want %d", len(rec.History), n)
	}
	if reqs := e.requests("racer"); len(reqs) != 1 {
		t.Fatalf("%d re-dispatches, want exactly 1", len(reqs))
	}
}

// TestMaxRounds: an answer that would take the thread past its round limit
// ends the thread failed max-rounds on the would-be dispatch id.
func TestMaxRounds(t *testing.T) {
	e := newEnv(t, "")
	e.startRouter(e.config())
	root := lifecycle.NewID()
	qid := e.ask(lifecycle.NeedsInput{
		Common:   lifecycle.Common{Subagent: "looper", ThreadID: root, ParentID: root, Round: 2},
		Question: "Again?",
	}, lifecycle.Request{MaxRounds: 2}, "")
	e.waitQuestionEvents(qid, 1)
	rep := e.answer(router.Submission{QuestionID: qid, Answer: "yes", AnsweredBy: "a"})
	if rep.Status != client.AnswerAccepted || !strings.Contains(rep.Reason, "max-rounds") {
		t.Fatalf("answer = %+v, want accepted, saying the thread ends max-rounds", rep)
	}
	rec := e.waitStatus(qid, "answered")
	if rec.Outcome != "failed:max-rounds" {
		t.Errorf("outcome = %q", rec.Outcome)
	}
	if reqs := e.requests("looper"); len(reqs) != 0 {
		t.Fatalf("%d re-dispatches past the round limit", len(reqs))
	}
	evs := e.waitLifecycle(rec.NextDispatchID)
	conform(t, evs...)
	f, ok := evs[0].Data.(*lifecycle.Failed)
	if len(evs) != 1 || !ok || f.Reason != lifecycle.ReasonMaxRounds || f.Round != 3 || f.ParentID != rec.DispatchID || f.ThreadID != root || evs[0].Event.ID() != rec.NextDispatchID+".terminal" {
		t.Fatalf("thread end = %+v (%d events)", evs[0].Data, len(evs))
	}
}

// TestAnswerBeforeQuestion: an answer to a question whose dispatch is
// still running is answered "retry" and not lost: sent again once the
// question exists, it is accepted. On AGORA_ANSWERS it waits (redelivered)
// until the question exists.
func TestAnswerBeforeQuestion(t *testing.T) {
	e := newEnv(t, "")
	e.startRouter(e.config())

	// Through agora.api.answer.
	id := lifecycle.NewID()
	qid := lifecycle.QuestionID(id)
	e.seedDispatch(lifecycle.Request{DispatchID: id, Subagent: "slow"}, lifecycle.KindStarted)
	if rep := e.answer(router.Submission{QuestionID: qid, Answer: "A", AnsweredBy: "early"}); rep.Status != client.AnswerRetry {
		t.Fatalf("early answer = %+v, want retry", rep)
	}
	c, err := client.New(e.nc)
	if err != nil {
		t.Fatal(err)
	}
	// pkg/client reports (or retries) it as a temporary failure.
	cctx, ccancel := context.WithTimeout(t.Context(), 2*time.Second)
	_, err = c.Answer(cctx, qid, lifecycle.Answer{Answer: "A", AnsweredBy: "early"})
	ccancel()
	if err == nil {
		t.Fatal("client.Answer before the question succeeded")
	}
	e.ask(lifecycle.NeedsInput{Common: lifecycle.Common{DispatchID: id, Subagent: "slow"}, Question: "A?", Options: []string{"A"}}, lifecycle.Request{}, "")
	var rep client.AnswerReply
	for deadline := time.Now().Add(waitFor); time.Now().Before(deadline); time.Sleep(25 * time.Millisecond) {
		if rep = e.answer(router.Submission{QuestionID: qid, Answer: "A", AnsweredBy: "early"}); rep.Status != client.AnswerRetry {
			break
		}
	}
	if rep.Status != client.AnswerAccepted {
		t.Fatalf("answer once the question exists = %+v", rep)
	}

	// Through AGORA_ANSWERS, before the needs_input is even published.
	id2 := lifecycle.NewID()
	qid2 := lifecycle.QuestionID(id2)
	e.seedDispatch(lifecycle.Request{DispatchID: id2, Subagent: "slow"}, lifecycle.KindStarted)
	e.publish(&lifecycle.Answer{QuestionID: qid2, Route: "human", Answer: "B", AnsweredBy: "streamer"}, "")
	e.ask(lifecycle.NeedsInput{Common: lifecycle.Common{DispatchID: id2, Subagent: "slow"}, Question: "B?", Options: []string{"A", "B"}}, lifecycle.Request{}, "")
	rec := e.waitStatus(qid2, "answered")
	if rec.AnsweredBy != "streamer" || rec.Answer != "B" || rec.History[0].Via != "stream" {
		t.Fatalf("stream answer before the question: record %+v", rec)
	}
	if reqs := e.requests("slow"); len(reqs) != 2 {
		t.Fatalf("%d re-dispatches, want 2", len(reqs))
	}
}

// TestHealthAndMetrics serves /healthz and the router's metrics.
func TestHealthAndMetrics(t *testing.T) {
	e := newEnv(t, "")
	rt := e.startRouter(e.config())
	qid := e.ask(lifecycle.NeedsInput{Common: lifecycle.Common{Subagent: "m"}, Question: "?"}, lifecycle.Request{}, "")
	e.waitQuestionEvents(qid, 1)
	e.answer(router.Submission{QuestionID: qid, Answer: "x", AnsweredBy: "a"})
	e.waitStatus(qid, "answered")
	srv := httptest.NewServer(rt.Handler())
	defer srv.Close()
	get := func(path string) (int, string) {
		res, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	if code, body := get("/healthz"); code != 200 || !strings.Contains(body, `"ok"`) {
		t.Errorf("/healthz = %d %s", code, body)
	}
	// The pending gauge follows the bucket watch, which may trail the
	// record just read by a moment: wait for it before reading the rest.
	var body string
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		_, body = get("/metrics")
		if strings.Contains(body, "agora_router_pending_questions 0") || time.Now().After(deadline) {
			break
		}
	}
	for _, want := range []string{
		`agora_router_questions_total{outcome="asked",route="human"} 1`,
		`agora_router_questions_total{outcome="answered",route="human"} 1`,
		`agora_router_answers_total{door="api",status="accepted"} 1`,
		`agora_router_time_to_answer_seconds_count{route="human"} 1`,
		`agora_router_pending_questions 0`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// The options of a clarification or information question are suggestions:
// free text is accepted. A decision's options (and those of a question
// with no kind) stay binding, and so do an approval's, which also needs
// approve or reject.
func TestFreeTextBesideOptions(t *testing.T) {
	e := newEnv(t, "routes:\n  - name: default\n")
	e.startRouter(e.config())
	for _, c := range []struct {
		kind, decision string
		accept         bool
		refusal        string
	}{
		{kind: "clarification", accept: true},
		{kind: "information", accept: true},
		{kind: "decision", refusal: "not one of the options: eu, us"},
		{kind: "", refusal: "not one of the options: eu, us"},
		{kind: "approval", refusal: "needs a decision: approve or reject"},
		{kind: "approval", decision: "approve", refusal: "not one of the options: eu, us"},
	} {
		// Each case its own question: the same one, still waiting, would
		// be joined (TestAskOnce).
		req := lifecycle.Request{Subagent: "planner", Input: json.RawMessage(`{}`), Timeout: "5m", MaxRounds: 4}
		qid := e.ask(lifecycle.NeedsInput{Common: lifecycle.Common{Subagent: "planner"}, Question: fmt.Sprintf("Which region? (%s, %s)", c.kind, c.decision),
			Options: []string{"eu", "us"}, Kind: lifecycle.QuestionKind(c.kind)}, req, lifecycle.NewTraceparent())
		e.waitQuestionEvents(qid, 1)
		rep := e.answer(router.Submission{QuestionID: qid, Answer: "neither — use ap-south", Decision: c.decision, AnsweredBy: "bob"})
		if got := rep.Status == client.AnswerAccepted; got != c.accept {
			t.Errorf("kind %q decision %q: free text = %+v, accepted %v want %v", c.kind, c.decision, rep, got, c.accept)
		}
		if !c.accept && (rep.Status != client.AnswerInvalid || !strings.Contains(rep.Reason, c.refusal)) {
			t.Errorf("kind %q decision %q: refusal %+v, want invalid saying %q", c.kind, c.decision, rep, c.refusal)
		}
		if c.accept && (rep.AnsweredBy != "bob") {
			t.Errorf("kind %q: accepted reply %+v", c.kind, rep)
		}
	}
}
