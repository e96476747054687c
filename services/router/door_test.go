package router_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/services/router"
)

// entry is the part of a history entry the door tests compare.
type entry struct{ via, door, route, result, status string }

// lastEntry returns the question's latest history entry.
func (e *env) lastEntry(qid string) (entry, string) {
	e.t.Helper()
	r, ok := e.record(qid)
	if !ok || len(r.History) == 0 {
		e.t.Fatalf("question %s: no history", qid)
	}
	h := r.History[len(r.History)-1]
	return entry{h.Via, h.Door, h.Route, h.Result, h.Status}, h.Reason
}

// TestRouteDoor: agora.api.answer.<route> takes answers and declines only
// for questions on that route now. A refusal is invalid, names the
// question's route, and lands in the history with the door it came
// through; after a fallback the question belongs to its new route.
func TestRouteDoor(t *testing.T) {
	e := newEnv(t, `routes:
  - name: data
    match: {subagent: "data-*"}
    answerer: sqldb
    fallback: human
  - name: human
`)
	e.startRouter(e.config())
	qid := e.ask(lifecycle.NeedsInput{Common: lifecycle.Common{Subagent: "data-loader"}, Question: "Which table?", Options: []string{"a", "b"}}, lifecycle.Request{}, "")
	e.waitStatus(qid, "asked")

	refused := []struct {
		name, door string
		sub        router.Submission
		want       string
		result     string
	}{
		{"another route's answer", "human", router.Submission{Answer: "a", AnsweredBy: "alice"},
			"question " + qid + " is on route data, not human", "refused"},
		{"another route's decline", "human", router.Submission{Decline: true, Reason: "not mine"},
			"question " + qid + " is on route data, not human", "decline-refused"},
		{"a body naming another route", "human", router.Submission{Route: "data", Answer: "a"},
			"names route data but came through agora.api.answer.human", "refused"},
		{"an unknown route", "nobody", router.Submission{Answer: "a"},
			"question " + qid + " is on route data, not nobody", "refused"},
	}
	for _, c := range refused {
		t.Run(c.name, func(t *testing.T) {
			c.sub.QuestionID = qid
			rep := e.answerVia(c.door, c.sub)
			if rep.Status != client.AnswerInvalid || !strings.Contains(rep.Reason, c.want) {
				t.Fatalf("reply = %+v, want invalid: %s", rep, c.want)
			}
			got, reason := e.lastEntry(qid)
			want := entry{"api-route", "agora.api.answer." + c.door, c.door, c.result, "invalid"}
			if got != want || reason != rep.Reason {
				t.Errorf("history = %+v %q, want %+v %q", got, reason, want, rep.Reason)
			}
		})
	}
	if rec, _ := e.record(qid); rec.Status != "asked" || rec.Route != "data" {
		t.Fatalf("after the refusals: status %s, route %s", rec.Status, rec.Route)
	}

	// The data answerer declines through its door: the question falls back
	// to human, which owns it from now on.
	if rep := e.answerVia("data", router.Submission{QuestionID: qid, Decline: true, Reason: "no row"}); rep.Status != client.AnswerAccepted {
		t.Fatalf("decline on data = %+v", rep)
	}
	e.waitRecord(qid, "route human", func(r questionRecord) bool { return r.Route == "human" && len(r.Pending) == 0 })
	if rep := e.answerVia("data", router.Submission{QuestionID: qid, Answer: "a"}); rep.Status != client.AnswerInvalid ||
		rep.Reason != "question "+qid+" is on route human, not data" {
		t.Fatalf("data answers after the fallback: %+v", rep)
	}
	// The stream door is scoped the same way, by its subject.
	e.publish(&lifecycle.Answer{QuestionID: qid, Route: "data", Answer: "a", AnsweredBy: "sqldb"}, "")
	e.waitRecord(qid, "the stream answer refused", func(r questionRecord) bool {
		if len(r.History) == 0 {
			return false
		}
		h := r.History[len(r.History)-1]
		return h.Via == "stream" && h.Door == "agora.answers.data."+qid && h.Route == "data" && h.Result == "refused" &&
			h.Reason == "question "+qid+" is on route human, not data"
	})

	rep := e.answerVia("human", router.Submission{QuestionID: qid, Answer: "b", AnsweredBy: "alice"})
	if rep.Status != client.AnswerAccepted {
		t.Fatalf("human answers = %+v", rep)
	}
	if got, _ := e.lastEntry(qid); got != (entry{"api-route", "agora.api.answer.human", "human", "accepted", "accepted"}) {
		t.Errorf("history = %+v", got)
	}
	rec := e.waitStatus(qid, "answered")
	if rec.Answer != "b" || rec.AnsweredBy != "alice" || rec.Route != "human" {
		t.Errorf("record = %+v", rec)
	}
	// Closed: the old route still learns nothing but that it is not its
	// question; the owner hears who won.
	if rep := e.answerVia("data", router.Submission{QuestionID: qid, Answer: "a"}); rep.Status != client.AnswerInvalid || rep.AnsweredBy != "" {
		t.Errorf("data after the answer = %+v", rep)
	}
	if rep := e.answerVia("human", router.Submission{QuestionID: qid, Answer: "a"}); rep.Status != client.AnswerAlreadyAnswered || rep.AnsweredBy != "alice" {
		t.Errorf("human after the answer = %+v", rep)
	}
	if n := len(e.requests("data-loader")); n != 1 {
		t.Errorf("%d re-dispatches, want 1", n)
	}
}

// TestRouteDoorAfterEscalation: once a question escalates, its new route
// may answer it and the route it left may not.
func TestRouteDoorAfterEscalation(t *testing.T) {
	e := newEnv(t, escalatingRoutes)
	e.startRouter(e.config())
	qid := e.ask(lifecycle.NeedsInput{Common: lifecycle.Common{Subagent: "s"}, Question: "?"}, lifecycle.Request{}, "")
	e.waitStatus(qid, "asked")
	if rep := e.answerVia("oncall", router.Submission{QuestionID: qid, Answer: "early"}); rep.Status != client.AnswerInvalid ||
		rep.Reason != "question "+qid+" is on route first, not oncall" {
		t.Fatalf("oncall before the escalation = %+v", rep)
	}
	e.waitRecord(qid, "escalated to oncall", func(r questionRecord) bool { return r.Route == "oncall" && len(r.Pending) == 0 })
	if rep := e.answerVia("first", router.Submission{QuestionID: qid, Answer: "late"}); rep.Status != client.AnswerInvalid ||
		rep.Reason != "question "+qid+" is on route oncall, not first" {
		t.Fatalf("first after the escalation = %+v", rep)
	}
	if got, _ := e.lastEntry(qid); got != (entry{"api-route", "agora.api.answer.first", "first", "refused", "invalid"}) {
		t.Errorf("history = %+v", got)
	}
	if rep := e.answerVia("oncall", router.Submission{QuestionID: qid, Answer: "ok", AnsweredBy: "pager"}); rep.Status != client.AnswerAccepted {
		t.Fatalf("oncall after the escalation = %+v", rep)
	}
	rec := e.waitStatus(qid, "answered")
	if rec.Answer != "ok" || rec.Route != "oncall" || rec.Origin != "first" {
		t.Errorf("record = %+v", rec)
	}
}

// TestGenericDoorAnswersAnyRoute: agora.api.answer, for trusted callers,
// answers a question on any route, and the history says so.
func TestGenericDoorAnswersAnyRoute(t *testing.T) {
	e, qid := askedOnHuman(t)
	if rep := e.answer(router.Submission{QuestionID: qid, Answer: "yes", AnsweredBy: "operator"}); rep.Status != client.AnswerAccepted {
		t.Fatalf("generic answer = %+v", rep)
	}
	if got, _ := e.lastEntry(qid); got != (entry{"api", "agora.api.answer", "", "accepted", "accepted"}) {
		t.Errorf("history = %+v", got)
	}
}

// TestNamedDoor: an answer names the door it was given through; the
// router keeps the name on the attempt, and refuses a name that is not a
// short token without touching the question.
func TestNamedDoor(t *testing.T) {
	e, qid := askedOnHuman(t)
	for _, bad := range []string{"Inbox", "my door", "inbox:web", strings.Repeat("d", 33), "ünï"} {
		rep := e.answer(router.Submission{QuestionID: qid, Answer: "yes", AnsweredBy: "alice", Door: bad})
		if rep.Status != client.AnswerInvalid || !strings.Contains(rep.Reason, "door") {
			t.Errorf("door %q: %+v, want invalid naming the door", bad, rep)
		}
	}
	e.waitStatus(qid, "asked")
	if rep := e.answer(router.Submission{QuestionID: qid, Answer: "yes", AnsweredBy: "alice", Door: lifecycle.DoorInbox}); rep.Status != client.AnswerAccepted {
		t.Fatalf("answer through the inbox = %+v", rep)
	}
	r, _ := e.record(qid)
	if h := r.History[len(r.History)-1]; h.NamedDoor != "inbox" || h.Via != "api" || h.Door != lifecycle.APIAnswer || h.Result != "accepted" {
		t.Errorf("history = %+v, want the accepted attempt naming door inbox", h)
	}
}

// An answer with a misspelt field is refused, naming it, and the question
// still waits: "anwser" is not read as an empty answer.
func TestAnswerWithUnknownFieldIsRefused(t *testing.T) {
	e, qid := askedOnHuman(t)
	for _, subject := range []string{lifecycle.APIAnswer, "agora.api.answer.human"} {
		m, err := e.nc.Request(subject, []byte(`{"question_id":"`+qid+`","anwser":"yes","answered_by":"op"}`), 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var rep client.AnswerReply
		if err := json.Unmarshal(m.Data, &rep); err != nil {
			t.Fatal(err)
		}
		if rep.Status != client.AnswerInvalid || !strings.Contains(rep.Reason, `unknown field "anwser"`) {
			t.Errorf("%s: %+v, want invalid naming the field", subject, rep)
		}
	}
	e.waitStatus(qid, "asked")
}

// askedOnHuman starts a router with the one route human and returns a
// question asked on it.
func askedOnHuman(t *testing.T) (*env, string) {
	t.Helper()
	e := newEnv(t, "routes:\n  - name: human\n")
	e.startRouter(e.config())
	qid := e.ask(lifecycle.NeedsInput{Common: lifecycle.Common{Subagent: "s"}, Question: "?"}, lifecycle.Request{}, "")
	e.waitStatus(qid, "asked")
	return e, qid
}
