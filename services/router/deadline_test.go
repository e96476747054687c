package router_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agora-dispatch/agora/pkg/answerer"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/services/router"
)

// TestExpiryActions: each on_expiry action when the deadline passes.
func TestExpiryActions(t *testing.T) {
	tests := []struct {
		name      string
		onExpiry  string
		options   []string
		wantKind  lifecycle.Kind // the thread's end on the next dispatch id, "" for a re-dispatch
		wantReq   string         // the default answer re-dispatched
		wantInDet string
	}{
		{"fail", "fail", nil, lifecycle.KindFailed, "", "failed unanswered"},
		{"cancel", "cancel", nil, lifecycle.KindCancelled, "", "ends cancelled"},
		{"default", "default:B", []string{"A", "B"}, "", "B", `default option "B"`},
		{"default not an option", "default:Z", []string{"A", "B"}, lifecycle.KindFailed, "", "cannot answer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, "routes:\n  - name: quick\n    deadline: 1s\n    on_expiry: '"+tt.onExpiry+"'\n")
			rt := e.startRouter(e.config())
			qid := e.ask(lifecycle.NeedsInput{Common: lifecycle.Common{Subagent: "asker"}, Question: "Which?", Options: tt.options,
				PartialState: json.RawMessage(`{"s":1}`)}, lifecycle.Request{Input: json.RawMessage(`{"task":"t"}`)}, "")
			rec := e.waitStatus(qid, "expired")
			evs := e.questionEvents(qid)
			last := evs[len(evs)-1]
			if last.Subject != "agora.questions.quick."+qid+".expired" || !strings.Contains(last.Data.(*lifecycle.Question).Detail, tt.wantInDet) {
				t.Fatalf("last question event %s: %+v", last.Subject, last.Data)
			}
			if rep := e.answer(router.Submission{QuestionID: qid, Answer: "A", AnsweredBy: "late"}); rep.Status != client.AnswerAlreadyAnswered || !strings.Contains(rep.Reason, "expired") {
				t.Errorf("answer after expiry = %+v", rep)
			}
			reqs := e.requests("asker")
			if tt.wantKind == "" {
				if len(reqs) != 1 {
					t.Fatalf("%d re-dispatches, want 1", len(reqs))
				}
				in := inputOf(t, reqs[0].Data.(*lifecycle.Request))
				if jsonString(t, in["answer"]) != tt.wantReq || jsonString(t, in["answered_by"]) != router.DefaultAnsweredBy || string(in["partial_state"]) != `{"s":1}` {
					t.Fatalf("default re-dispatch input = %v", in)
				}
				if rec.AnsweredBy != router.DefaultAnsweredBy {
					t.Errorf("answered_by = %q", rec.AnsweredBy)
				}
				return
			}
			if len(reqs) != 0 {
				t.Fatalf("%d re-dispatches for on_expiry %s", len(reqs), tt.onExpiry)
			}
			end := e.waitLifecycle(rec.NextDispatchID)
			conform(t, append(evs, end...)...)
			l := end[0].Data.(lifecycle.Lifecycle)
			c := l.Base()
			if len(end) != 1 || l.LifecycleKind() != tt.wantKind || c.ParentID != rec.DispatchID || c.ThreadID != rec.ThreadID || c.Round != rec.Round+1 || end[0].Event.ID() != rec.NextDispatchID+".terminal" {
				t.Fatalf("thread end = %s %+v", l.LifecycleKind(), l)
			}
			if f, ok := l.(*lifecycle.Failed); ok && f.Reason != lifecycle.ReasonUnanswered {
				t.Errorf("reason = %s, want unanswered", f.Reason)
			}
			if counter(t, rt.reg, "agora_router_questions_total", map[string]string{"outcome": "expired"}) != 1 {
				t.Error("questions_total{outcome=expired} is not 1")
			}
		})
	}
}

// escalatingRoutes has a route, first, whose questions escalate after a
// second to oncall (answerer pager), which matches no request itself.
const escalatingRoutes = `routes:
  - name: first
    deadline: 1m
    escalate: [{after: 1s, to: oncall}]
  - name: oncall
    match: none
    answerer: pager
`

// TestEscalation: with no answer, the ladder moves the question to the
// next route (question.escalated, then asked there); an answer there wins.
func TestEscalation(t *testing.T) {
	e := newEnv(t, escalatingRoutes)
	e.startRouter(e.config())
	qid := e.ask(lifecycle.NeedsInput{Common: lifecycle.Common{Subagent: "s"}, Question: "?"}, lifecycle.Request{}, "")
	evs := e.waitQuestionEvents(qid, 3)
	want := []string{"agora.questions.first." + qid + ".asked", "agora.questions.oncall." + qid + ".escalated", "agora.questions.oncall." + qid + ".asked"}
	for i, w := range want {
		if evs[i].Subject != w {
			t.Fatalf("events %v, want %v", subjects(evs), want)
		}
	}
	conform(t, evs...)
	esc := evs[1].Data.(*lifecycle.Question)
	if esc.Escalation != 1 || esc.Answerer != "pager" || !strings.Contains(esc.Detail, "escalated from first") {
		t.Errorf("escalated = %+v", esc)
	}
	if evs[2].MsgID == evs[0].MsgID {
		t.Error("the second asked event has the first one's id: it would be dropped as a duplicate")
	}
	if rep := e.answer(router.Submission{QuestionID: qid, Route: "oncall", Answer: "ok", AnsweredBy: "pager"}); rep.Status != client.AnswerAccepted {
		t.Fatal(rep)
	}
	if rec := e.waitStatus(qid, "answered"); rec.Route != "oncall" || rec.Origin != "first" {
		t.Errorf("route %s, origin %s", rec.Route, rec.Origin)
	}
}

// TestDeclineGoesToFallback: an answerer that declines through
// pkg/answerer sends the question to its route's fallback, where another
// answerer answers it.
func TestDeclineGoesToFallback(t *testing.T) {
	e := newEnv(t, `routes:
  - name: data
    match: {subagent: "data-*"}
    answerer: sqldb
    fallback: people
  - name: people
    answerer: human
`)
	e.startRouter(e.config())
	conns := []*nats.Conn{e.srv.Conn(t), e.srv.Conn(t)} // before the cleanup that stops Serve
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	reports := make(chan answerer.Report, 4)
	serve := func(route string, h answerer.HandlerFunc) {
		nc := conns[0]
		conns = conns[1:]
		wg.Go(func() {
			if err := answerer.Serve(ctx, nc, route, h, answerer.WithLogger(quietLogger()),
				answerer.WithReport(func(r answerer.Report) { reports <- r })); err != nil {
				t.Errorf("Serve %s: %v", route, err)
			}
		})
	}
	serve("data", func(context.Context, lifecycle.Question) (answerer.Reply, error) {
		return answerer.Decline("no row"), nil
	})
	serve("people", func(_ context.Context, q lifecycle.Question) (answerer.Reply, error) {
		return answerer.Answer("from a person to: " + q.Question), nil
	})
	t.Cleanup(func() { cancel(); wg.Wait() })

	qid := e.ask(lifecycle.NeedsInput{Common: lifecycle.Common{Subagent: "data-loader"}, Question: "Which table?"}, lifecycle.Request{}, "")
	rec := e.waitStatus(qid, "answered")
	if rec.Answer != "from a person to: Which table?" || rec.AnsweredBy != "answerer:people" || rec.Route != "people" || len(rec.Declined) != 1 || rec.Declined[0] != "data" {
		t.Fatalf("record = %+v", rec)
	}
	evs := e.questionEvents(qid)
	want := []string{"data." + qid + ".asked", "people." + qid + ".escalated", "people." + qid + ".asked", "people." + qid + ".answered"}
	if len(evs) != len(want) {
		t.Fatalf("events %v, want %v", subjects(evs), want)
	}
	for i, w := range want {
		if evs[i].Subject != "agora.questions."+w {
			t.Fatalf("events %v, want %v", subjects(evs), want)
		}
	}
	if d := evs[1].Data.(*lifecycle.Question).Detail; d != "declined on route data by answerer:data: no row" {
		t.Errorf("escalated detail = %q", d)
	}
	got := map[bool]client.AnswerStatus{}
	for range 2 {
		select {
		case r := <-reports:
			got[r.Reply.Declined] = r.Status
		case <-time.After(waitFor):
			t.Fatal("answerer reports missing")
		}
	}
	if got[true] != client.AnswerAccepted || got[false] != client.AnswerAccepted {
		t.Errorf("reports = %v", got)
	}
}

// TestRestartKeepsDeadlines: questions asked before a router stops keep
// their deadlines and escalation steps; a new router acts on them.
func TestRestartKeepsDeadlines(t *testing.T) {
	e := newEnv(t, `routes:
  - name: slow
    match: {kind: decision}
    deadline: 2s
  - name: ladder
    deadline: 1m
    escalate: [{after: 2s, to: later}]
  - name: later
    match: none
`)
	first := e.startRouter(e.config())
	expiring := e.ask(lifecycle.NeedsInput{Common: lifecycle.Common{Subagent: "s"}, Question: "?", Kind: "decision"}, lifecycle.Request{}, "")
	escalating := e.ask(lifecycle.NeedsInput{Common: lifecycle.Common{Subagent: "s"}, Question: "?", Kind: "information"}, lifecycle.Request{}, "")
	e.waitQuestionEvents(expiring, 1)
	e.waitQuestionEvents(escalating, 1)
	first.stop()
	// Asked while no router runs: the needs_input waits on its consumer.
	waiting := e.ask(lifecycle.NeedsInput{Common: lifecycle.Common{Subagent: "s"}, Question: "?", Kind: "decision"}, lifecycle.Request{}, "")
	time.Sleep(3 * time.Second) // past both deadlines' times while no router runs
	if r, _ := e.record(expiring); r.Status != "asked" {
		t.Fatalf("status %s while no router runs", r.Status)
	}
	e.startRouter(e.config())
	rec := e.waitStatus(expiring, "expired")
	if rec.Outcome != "failed:unanswered" {
		t.Errorf("outcome = %s", rec.Outcome)
	}
	if ev := e.waitLifecycle(rec.NextDispatchID)[0].Data.(*lifecycle.Failed); ev.Reason != lifecycle.ReasonUnanswered {
		t.Errorf("thread end = %+v", ev)
	}
	e.waitRecord(escalating, "moved to later", func(r questionRecord) bool { return r.Route == "later" && len(r.Pending) == 0 })
	e.waitQuestionEvents(waiting, 1)
	e.waitStatus(waiting, "expired")
}

// TestTwoReplicas: two routers share the work; answers through both and
// deadlines seen by both still give one re-dispatch and one expiry per
// question.
func TestTwoReplicas(t *testing.T) {
	e := newEnv(t, `routes:
  - name: expiring
    match: {kind: information}
    deadline: 1s
  - name: default
`)
	cfg := e.config()
	cfg.ID = "one"
	a := e.startRouter(cfg)
	cfg.ID = "two"
	b := e.startRouter(cfg)

	// Ten different questions (the same one would be asked once:
	// TestAskOnce).
	var answered, expiring []string
	for i := range 5 {
		answered = append(answered, e.ask(lifecycle.NeedsInput{Common: lifecycle.Common{Subagent: "twin"}, Question: fmt.Sprintf("decide %d?", i), Kind: "decision"}, lifecycle.Request{}, ""))
		expiring = append(expiring, e.ask(lifecycle.NeedsInput{Common: lifecycle.Common{Subagent: "twin"}, Question: fmt.Sprintf("inform %d?", i), Kind: "information"}, lifecycle.Request{}, ""))
	}
	var wg sync.WaitGroup
	for _, qid := range answered {
		e.waitQuestionEvents(qid, 1)
		for i := range 10 {
			wg.Go(func() { e.answer(router.Submission{QuestionID: qid, Answer: "x", AnsweredBy: string(rune('a' + i))}) })
		}
	}
	wg.Wait()
	for _, qid := range answered {
		if rec := e.waitStatus(qid, "answered"); len(rec.History) != 10 {
			t.Errorf("%s: history has %d entries, want 10", qid, len(rec.History))
		}
	}
	for _, qid := range expiring {
		e.waitStatus(qid, "expired")
	}
	if reqs := e.requests("twin"); len(reqs) != len(answered) {
		t.Fatalf("%d re-dispatches for %d answered questions", len(reqs), len(answered))
	}
	sum := func(name string, labels map[string]string) float64 {
		return counter(t, a.reg, name, labels) + counter(t, b.reg, name, labels)
	}
	if got := sum("agora_router_questions_total", map[string]string{"outcome": "asked"}); got != 10 {
		t.Errorf("questions asked by the two routers: %v, want 10", got)
	}
	if got := sum("agora_router_questions_total", map[string]string{"outcome": "answered"}); got != 5 {
		t.Errorf("questions answered by the two routers: %v, want 5", got)
	}
	if got := sum("agora_router_questions_total", map[string]string{"outcome": "expired"}); got != 5 {
		t.Errorf("questions expired by the two routers: %v, want 5", got)
	}
	if got := sum("agora_router_answers_total", map[string]string{"status": "accepted"}); got != 5 {
		t.Errorf("answers accepted by the two routers: %v, want 5", got)
	}
	if counter(t, a.reg, "agora_router_answers_total", nil) == 0 || counter(t, b.reg, "agora_router_answers_total", nil) == 0 {
		t.Log("one router took every answer (the micro queue group chose so)")
	}
}

// TestCancelWhilePaused: a thread cancelled while paused on its question
// (the dispatcher's core message, or the mark on the paused dispatch's
// record when that message was missed) withdraws the question; later
// answers are refused.
func TestCancelWhilePaused(t *testing.T) {
	e := newEnv(t, "routes:\n  - name: default\n    deadline: 1h\n")
	e.startRouter(e.config())

	qid, rec := e.askPaused("c")
	body, _ := json.Marshal(lifecycle.CancelRequest{DispatchID: rec.DispatchID, ThreadID: rec.ThreadID, By: "alice", Reason: "not needed"})
	subj, _ := lifecycle.CancelThreadSubject(rec.ThreadID)
	if err := e.nc.Publish(subj, body); err != nil {
		t.Fatal(err)
	}
	rec = e.waitStatus(qid, "withdrawn")
	if !strings.Contains(rec.Detail, "cancelled by alice: not needed") {
		t.Errorf("detail = %q", rec.Detail)
	}
	evs := e.questionEvents(qid)
	if last := evs[len(evs)-1]; last.Subject != "agora.questions.default."+qid+".withdrawn" {
		t.Errorf("last event %s", last.Subject)
	}
	if rep := e.answer(router.Submission{QuestionID: qid, Answer: "x", AnsweredBy: "bob"}); rep.Status != client.AnswerAlreadyAnswered || !strings.Contains(rep.Reason, "withdrawn") {
		t.Errorf("answer after withdrawal = %+v", rep)
	}
	if len(e.requests("c")) != 0 {
		t.Error("a withdrawn question was re-dispatched")
	}
	e.checkCancelledEnd(rec, "alice", "not needed")

	// The core message was missed: the mark on the dispatch record stops
	// the answer.
	qid2, rec2 := e.askPaused("c")
	e.putDispatch(map[string]any{
		"dispatch_id": rec2.DispatchID, "thread_id": rec2.ThreadID, "round": 0, "subagent": "c", "status": "needs_input",
		"cancel_requested": lifecycle.CancelRequest{DispatchID: rec2.DispatchID, ThreadID: rec2.ThreadID, By: "ops"},
	})
	if rep := e.answer(router.Submission{QuestionID: qid2, Answer: "x", AnsweredBy: "bob"}); rep.Status != client.AnswerAlreadyAnswered || !strings.Contains(rep.Reason, "cancelled by ops") {
		t.Errorf("answer to a thread cancelled while the router missed it = %+v", rep)
	}
	rec2 = e.waitStatus(qid2, "withdrawn")
	if len(e.requests("c")) != 0 {
		t.Error("a withdrawn question was re-dispatched")
	}
	e.checkCancelledEnd(rec2, "ops", "")
}

// checkCancelledEnd checks that a withdrawn question's thread ended
// cancelled, once, on the dispatch id its record names: round + 1, parent
// the paused dispatch, event id <id>.terminal.
func (e *env) checkCancelledEnd(rec questionRecord, by, reason string) {
	e.t.Helper()
	if rec.Outcome != "withdrawn" || rec.NextDispatchID == "" {
		e.t.Fatalf("withdrawn record: outcome %q, next dispatch %q", rec.Outcome, rec.NextDispatchID)
	}
	end := e.waitLifecycle(rec.NextDispatchID)
	conform(e.t, end...)
	c, ok := end[0].Data.(*lifecycle.Cancelled)
	if len(end) != 1 || !ok || c.By != by || c.Reason != reason || c.ParentID != rec.DispatchID || c.ThreadID != rec.ThreadID ||
		c.Round != rec.Round+1 || c.Subagent != rec.Subagent || end[0].Event.ID() != rec.NextDispatchID+".terminal" || end[0].MsgID != end[0].Event.ID() {
		e.fatalEnd(end)
	}
	// The paused dispatch keeps its one terminal event; the thread has no
	// other dispatch.
	evs := e.streamEvents(lifecycle.StreamLifecycle, lifecycle.LifecycleFilter("", rec.ThreadID, ""))
	terminal := map[string]int{}
	for _, ev := range evs {
		if l := ev.Data.(lifecycle.Lifecycle); l.LifecycleKind().Terminal() {
			terminal[l.Base().DispatchID]++
		}
	}
	if len(terminal) != 2 || terminal[rec.DispatchID] != 1 || terminal[rec.NextDispatchID] != 1 {
		e.t.Errorf("terminal events by dispatch: %v", terminal)
	}
}

func (e *env) fatalEnd(end []event) {
	e.t.Helper()
	var out []string
	for _, ev := range end {
		out = append(out, ev.Subject+" "+string(ev.Event.Data()))
	}
	e.t.Fatalf("thread end: %v", out)
}

// TestCancelMarkFoundAtStart: a thread cancelled while no router ran
// (only the mark on the paused dispatch's record tells) is withdrawn and
// ended cancelled when a router starts, without waiting for an answer.
func TestCancelMarkFoundAtStart(t *testing.T) {
	e := newEnv(t, "routes:\n  - name: default\n    deadline: 1h\n")
	rt := e.startRouter(e.config())
	qid, _ := e.askPaused("c")
	rt.stop()
	rec, _ := e.record(qid)
	e.putDispatch(client.Record{
		DispatchID: rec.DispatchID, ThreadID: rec.ThreadID, Subagent: "c", Status: lifecycle.KindNeedsInput,
		CancelRequested: &client.CancelMark{CancelRequest: lifecycle.CancelRequest{DispatchID: rec.DispatchID, ThreadID: rec.ThreadID, By: "ops", Reason: "shutting down"}, At: time.Now().UTC()},
	})
	e.startRouter(e.config())
	rec = e.waitStatus(qid, "withdrawn")
	if !strings.Contains(rec.Detail, "cancelled by ops: shutting down") {
		t.Errorf("detail = %q", rec.Detail)
	}
	e.checkCancelledEnd(rec, "ops", "shutting down")
	if rep := e.answer(router.Submission{QuestionID: qid, Answer: "x", AnsweredBy: "bob"}); rep.Status != client.AnswerAlreadyAnswered || !strings.Contains(rep.Reason, "withdrawn") {
		t.Errorf("answer after withdrawal = %+v", rep)
	}
	if len(e.requests("c")) != 0 {
		t.Error("a withdrawn question was re-dispatched")
	}
}

// TestCancelMarkFoundAfterReconnect: a thread cancelled while the router
// was cut off from NATS (it missed the cancel-thread message; only the
// mark on the paused dispatch's record tells) is withdrawn as soon as the
// router reconnects, not at the next periodic sweep (ten minutes).
func TestCancelMarkFoundAfterReconnect(t *testing.T) {
	e := newEnv(t, "routes:\n  - name: default\n    deadline: 1h\n")
	e.startRouter(e.config())
	qid, rec := e.askPaused("c")
	e.putDispatch(client.Record{
		DispatchID: rec.DispatchID, ThreadID: rec.ThreadID, Subagent: "c", Status: lifecycle.KindNeedsInput,
		CancelRequested: &client.CancelMark{CancelRequest: lifecycle.CancelRequest{DispatchID: rec.DispatchID, ThreadID: rec.ThreadID, By: "ops", Reason: "partitioned"}, At: time.Now().UTC()},
	})
	e.srv.Restart(t)
	deadline := time.Now().Add(20 * time.Second)
	for {
		r, ok := e.record(qid)
		if ok && r.Status == "withdrawn" && len(r.Pending) == 0 {
			if !strings.Contains(r.Detail, "cancelled by ops: partitioned") {
				t.Errorf("detail = %q", r.Detail)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("question %+v not withdrawn within 20s of the reconnect", r)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestCancelWithTwoReplicas: both replicas hear the cancel-thread message;
// the thread ends cancelled once, on one dispatch id.
func TestCancelWithTwoReplicas(t *testing.T) {
	e := newEnv(t, "")
	a, b := e.config(), e.config()
	a.ID, b.ID = "ra", "rb"
	e.startRouter(a)
	e.startRouter(b)
	qid, rec := e.askPaused("c")
	body, _ := json.Marshal(lifecycle.CancelRequest{DispatchID: rec.DispatchID, ThreadID: rec.ThreadID, By: "alice"})
	subj, _ := lifecycle.CancelThreadSubject(rec.ThreadID)
	for range 3 {
		if err := e.nc.Publish(subj, body); err != nil {
			t.Fatal(err)
		}
	}
	rec = e.waitStatus(qid, "withdrawn")
	e.checkCancelledEnd(rec, "alice", "")
	if evs := e.questionEvents(qid); len(evs) != 2 || evs[1].Subject != "agora.questions."+rec.Route+"."+qid+".withdrawn" {
		t.Errorf("question events: %v", subjects(evs))
	}
}
