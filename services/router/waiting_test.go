package router_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/services/router"
)

// agora.api.questions pages the waiting questions oldest first with a
// cursor: no question twice or left out, an answered one drops out, one
// asked meanwhile comes on a later page without shifting it, filters and
// the count hold, and bad requests are refused naming the field.
func TestWaitingPages(t *testing.T) {
	e := newEnv(t, "routes:\n  - name: planning\n    match: {subagent: plan*}\n    answerer: human\n  - name: default\n")
	e.startRouter(e.config())
	c, err := client.New(e.srv.Conn(t))
	if err != nil {
		t.Fatal(err)
	}
	var asked []string
	for i := range 7 {
		sa := "planner"
		if i%3 == 2 {
			sa = "worker-x"
		}
		qid := e.ask(lifecycle.NeedsInput{Common: lifecycle.Common{Subagent: sa}, Question: fmt.Sprintf("Q%d?", i)}, lifecycle.Request{}, "")
		e.waitStatus(qid, "asked")
		asked = append(asked, qid)
		time.Sleep(2 * time.Millisecond) // distinct asked_at
	}
	page := func(f client.QuestionFilter, limit int, cursor string) *client.WaitingPage {
		t.Helper()
		deadline := time.Now().Add(waitFor)
		for {
			p, err := c.Waiting(t.Context(), f, limit, cursor)
			if err == nil {
				return p
			}
			if !errors.Is(err, client.ErrUnavailable) || time.Now().After(deadline) {
				t.Fatalf("waiting %+v limit %d cursor %q: %v", f, limit, cursor, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	// The index learns of each question by its watch: wait for all seven.
	testkit.Eventually(t, waitFor, "the router to count the seven questions", func() bool {
		return page(client.QuestionFilter{}, 1, "").Count == 7
	})
	first := page(client.QuestionFilter{}, 3, "")
	if first.Count != 7 || len(first.Questions) != 3 || first.NextCursor == "" {
		t.Fatalf("first page: count %d, %d rows, next %q", first.Count, len(first.Questions), first.NextCursor)
	}
	// Asked after the first page, and one of a later page answered.
	late := e.ask(lifecycle.NeedsInput{Common: lifecycle.Common{Subagent: "planner"}, Question: "Late?"}, lifecycle.Request{}, "")
	e.waitStatus(late, "asked")
	if rep := e.answer(router.Submission{QuestionID: asked[5], Answer: "ok", AnsweredBy: "bob"}); rep.Status != client.AnswerAccepted {
		t.Fatalf("answer: %+v", rep)
	}
	e.waitStatus(asked[5], "answered")
	// The index learns of both through its watch: wait until a whole page
	// shows the late one and not the answered one.
	testkit.Eventually(t, waitFor, "the index to show the late question and drop the answered one", func() bool {
		var late1, answered bool
		p := page(client.QuestionFilter{}, 100, "")
		for _, q := range p.Questions {
			late1 = late1 || q.QuestionID == late
			answered = answered || q.QuestionID == asked[5]
		}
		// Rows are read from the records; the count is the index's own,
		// so it alone shows the index has dropped the answered one.
		return late1 && !answered && p.Count == len(p.Questions)
	})
	got := append([]lifecycle.Question{}, first.Questions...)
	for cursor, n := first.NextCursor, 0; cursor != ""; n++ {
		if n > 5 {
			t.Fatal("more pages than questions")
		}
		p := page(client.QuestionFilter{}, 3, cursor)
		got = append(got, p.Questions...)
		cursor = p.NextCursor
	}
	var ids []string
	for i, q := range got {
		ids = append(ids, q.QuestionID)
		if q.Status != "asked" || q.Question == "" {
			t.Errorf("row %d: %+v", i, q)
		}
		if i > 0 && q.AskedAt.Before(got[i-1].AskedAt) {
			t.Errorf("row %d asked before row %d: not oldest first", i, i-1)
		}
	}
	want := append(append([]string{}, asked[:5]...), asked[6], late)
	if strings.Join(ids, " ") != strings.Join(want, " ") {
		t.Errorf("pages gave\n%v\nwant (the answered one out, the late one last)\n%v", ids, want)
	}

	// Filters, and the count under them.
	// worker-x asked questions 2 and 5 (5 is answered); the planners
	// asked the other five and the late one, all on route planning.
	if p := page(client.QuestionFilter{Subagent: "worker-x"}, 10, ""); p.Count != 1 || len(p.Questions) != 1 || p.Questions[0].QuestionID != asked[2] {
		t.Errorf("subagent filter: count %d, %d rows; want question 2 alone", p.Count, len(p.Questions))
	}
	if p := page(client.QuestionFilter{Route: "planning"}, 2, ""); p.Count != 6 || len(p.Questions) != 2 || p.NextCursor == "" {
		t.Errorf("route filter: count %d, %d rows, next %q; want 6, 2 and a cursor", p.Count, len(p.Questions), p.NextCursor)
	}
	if p := page(client.QuestionFilter{ThreadID: lifecycle.NewID()}, 10, ""); p.Count != 0 || len(p.Questions) != 0 {
		t.Errorf("unknown thread: %+v", p)
	}

	// Refused, naming the field.
	for _, bad := range []struct {
		body  string
		field string
	}{
		{`{"limit": 5000}`, "limit"},
		{`{"limit": -1}`, "limit"},
		{`{"cursor": "nope"}`, "cursor"},
		{`{"cursor": "12.a.b"}`, "cursor"},
		{`{"rout": "planning"}`, "rout"},
		{`[1]`, "body"},
	} {
		msg, err := e.nc.Request(lifecycle.APIQuestions, []byte(bad.body), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var p client.Problem
		if json.Unmarshal(msg.Data, &p) != nil || p.Status != 422 || len(p.Errors) != 1 || p.Errors[0].Field != bad.field {
			t.Errorf("%s: %s %s, want 422 naming %s", bad.body, msg.Header.Get("Nats-Service-Error-Code"), msg.Data, bad.field)
		}
	}

	// What `nats micro stats agora-router` reads counts those six refusals
	// as errors of the questions endpoints (micro records a request once
	// its handler returned, after the reply: wait until all are counted).
	statsSubj, err := micro.ControlSubject(micro.StatsVerb, "agora-router", "")
	if err != nil {
		t.Fatal(err)
	}
	var requests, errs int
	testkit.Eventually(t, 10*time.Second, "the refusals counted in $SRV.STATS", func() bool {
		msg, err := e.nc.Request(statsSubj, nil, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var st micro.Stats
		if err := json.Unmarshal(msg.Data, &st); err != nil {
			t.Fatalf("$SRV.STATS: %v: %s", err, msg.Data)
		}
		requests, errs = 0, 0
		for _, ep := range st.Endpoints {
			if ep.Subject == lifecycle.APIQuestions {
				requests += ep.NumRequests
				errs += ep.NumErrors
			}
		}
		return errs >= 6
	})
	if errs != 6 || requests < 6 {
		t.Errorf("questions endpoints: %d requests, %d errors counted; want the 6 refusals as errors", requests, errs)
	}
}
