package inbox_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/internal/testkit"

	"github.com/agora-dispatch/agora/answerers/inbox"
	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// TestAuth: pages redirect to the login page and the API answers 401
// without a sign-in; a sign-in sets a strict, HttpOnly session cookie
// (Secure over TLS); logout ends the session.
func TestAuth(t *testing.T) {
	s := start(t, options{noWorker: true})
	b := s.browser()

	p := b.get("/inbox/history?status=answered")
	if p.status != http.StatusSeeOther || p.location != "/inbox/login?next="+url.QueryEscape("/inbox/history?status=answered") {
		t.Errorf("history without a sign-in: %d %q", p.status, p.location)
	}
	for _, path := range []string{"/inbox/api/questions", "/inbox/api/questions/q-x"} {
		st, body := s.apiCall(http.MethodGet, path, nil, nil)
		if st != http.StatusUnauthorized || !strings.Contains(body, client.ProblemUnauthorized) {
			t.Errorf("GET %s without a sign-in: %d %s", path, st, body)
		}
		st, _ = s.apiCall(http.MethodGet, path, nil, map[string]string{"Authorization": "Bearer not-a-token"})
		if st != http.StatusUnauthorized {
			t.Errorf("GET %s with a wrong bearer token: %d", path, st)
		}
	}
	if st, _ := s.apiCall(http.MethodPost, "/inbox/api/questions/q-x/answer", map[string]string{"answer": "A"}, nil); st != http.StatusUnauthorized {
		t.Errorf("POST answer without a sign-in: %d", st)
	}
	if st, _ := s.apiCall(http.MethodPost, "/inbox/api/login", inbox.LoginRequest{Name: "alice", Password: "wrong"}, nil); st != http.StatusUnauthorized {
		t.Errorf("api login with a wrong password: %d", st)
	}

	// The login form: a wrong password, an unknown name, a missing token.
	p = b.get("/inbox/login?next=" + url.QueryEscape("//evil.example/x"))
	mustContain(t, "login page", p.body, `name="password"`, `name="next" value="/inbox/"`)
	if c := b.cookie("agora_inbox_login"); c == nil {
		t.Fatal("the login page set no CSRF cookie")
	}
	for _, tc := range []struct {
		name string
		form url.Values
		want int
	}{
		{"wrong password", url.Values{"name": {"alice"}, "password": {"nope"}}, http.StatusUnauthorized},
		{"unknown user", url.Values{"name": {"mallory"}, "password": {password}}, http.StatusUnauthorized},
		{"no CSRF token", url.Values{"name": {"alice"}, "password": {password}, "csrf": {""}}, http.StatusForbidden},
		{"wrong CSRF token", url.Values{"name": {"alice"}, "password": {password}, "csrf": {"forged"}}, http.StatusForbidden},
	} {
		p = b.post("/inbox/login", tc.form)
		if p.status != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, p.status, tc.want)
		}
		if b.cookie("agora_inbox_session") != nil {
			t.Fatalf("%s: signed in", tc.name)
		}
	}
	mustContain(t, "refused login", b.post("/inbox/login", url.Values{"name": {"alice"}, "password": {"nope"}}).body, "Wrong name or password.")

	// Signing in comes back to where the browser wanted to go.
	b.get("/inbox/login")
	p = b.post("/inbox/login", url.Values{"name": {"alice"}, "password": {password}, "next": {"/inbox/history"}})
	if p.status != http.StatusSeeOther || p.location != "/inbox/history" {
		t.Fatalf("login: %d %q %s", p.status, p.location, p.body)
	}
	raw := strings.Join(p.header.Values("Set-Cookie"), "\n")
	mustContain(t, "session cookie", raw, "agora_inbox_session=", "HttpOnly", "SameSite=Strict", "Path=/inbox")
	for _, line := range p.header.Values("Set-Cookie") {
		if strings.HasPrefix(line, "agora_inbox_session=") && strings.Contains(line, "Secure") {
			t.Errorf("session cookie is Secure over plain HTTP: %s", line)
		}
	}
	p = b.get("/inbox/history")
	if p.status != http.StatusOK {
		t.Fatalf("history after login: %d", p.status)
	}
	mustContain(t, "history", p.body, `<span class="user" title="Signed in as alice">alice</span>`, `name="csrf"`)
	if b.get("/inbox/login").status != http.StatusSeeOther {
		t.Error("the login page does not send a signed-in browser on")
	}
	if st := b.api(http.MethodGet, "/inbox/api/questions", nil, false).status; st != http.StatusOK {
		t.Errorf("API GET with the session cookie: %d", st)
	}
	if p := b.get("/inbox/nowhere"); p.status != http.StatusNotFound {
		t.Errorf("unknown page: %d", p.status)
	}

	// A proxy's Basic auth does not hide the session cookie.
	req0, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, s.web.URL+"/inbox/api/questions", nil)
	req0.SetBasicAuth("proxy", "secret")
	if p := b.do(req0); p.status != http.StatusOK {
		t.Errorf("API GET with the cookie and Basic auth: %d", p.status)
	}

	// Logout needs the CSRF token, ends the session, its live streams and
	// the cookie.
	live := openStream(t, b, "/inbox/events")
	live.next("sync")
	old := b.cookie("agora_inbox_session").Value
	if p := b.post("/inbox/logout", url.Values{"csrf": {"forged"}}); p.status != http.StatusForbidden {
		t.Errorf("logout with a forged token: %d", p.status)
	}
	if b.get("/inbox/").status != http.StatusOK {
		t.Fatal("a refused logout signed out")
	}
	p = b.post("/inbox/logout", url.Values{})
	if p.status != http.StatusSeeOther || p.location != "/inbox/login" {
		t.Errorf("logout: %d %q", p.status, p.location)
	}
	if b.cookie("agora_inbox_session") != nil {
		t.Error("the session cookie survived logout")
	}
	select {
	case <-live.done:
	case <-time.After(waitFor):
		t.Error("the live stream outlived the logout")
	}
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, s.web.URL+"/inbox/api/questions", nil)
	req.AddCookie(&http.Cookie{Name: "agora_inbox_session", Value: old})
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("the old session after logout: %v %v", resp.StatusCode, err)
	} else {
		resp.Body.Close()
	}

	// A bearer token from the API login reads the API without a cookie.
	tok := s.apiLogin("bob", password)
	if st, body := s.apiCall(http.MethodGet, "/inbox/api/questions", nil, map[string]string{"Authorization": "Bearer " + tok}); st != http.StatusOK || !strings.Contains(body, `"questions":[]`) {
		t.Errorf("bearer GET: %d %s", st, body)
	}

	// Over TLS (directly or behind a proxy) the cookie is Secure.
	tlsWeb := httptest.NewTLSServer(s.inbox.Handler())
	t.Cleanup(tlsWeb.Close)
	tb := s.browser()
	tb.hc.Transport = tlsWeb.Client().Transport
	tb.s, tb.base = &system{t: t, web: tlsWeb}, tlsWeb.URL
	tb.get("/inbox/login")
	p = tb.post("/inbox/login", url.Values{"name": {"alice"}, "password": {password}})
	if p.status != http.StatusSeeOther || !strings.Contains(strings.Join(p.header.Values("Set-Cookie"), "\n"), "Secure") {
		t.Errorf("login over TLS: %d, cookies %q", p.status, p.header.Values("Set-Cookie"))
	}
	req = httptest.NewRequest(http.MethodGet, "/inbox/login", nil)
	req.Header.Set("X-Forwarded-Proto", "https")
	rec := httptest.NewRecorder()
	s.inbox.Handler().ServeHTTP(rec, req)
	if c := rec.Result().Cookies(); len(c) == 0 || !c[0].Secure {
		t.Errorf("login cookie behind a TLS proxy: %+v", c)
	}
}

// TestDevToken: in dev-token mode the generated token signs in as "dev",
// as a form and as a bearer token, and answers carry answered_by dev.
func TestDevToken(t *testing.T) {
	s := start(t, options{dev: true})
	tok := s.inbox.DevToken()
	if len(tok) < 40 {
		t.Fatalf("dev token %q is too short", tok)
	}
	b := s.browser()
	// The printed link carries the token in its fragment, which no
	// server sees; one in the query is not echoed into the page.
	if link := inbox.LoginLink("http://127.0.0.1:8080", tok); link != "http://127.0.0.1:8080/inbox/login#token="+tok {
		t.Errorf("LoginLink = %q", link)
	}
	p := b.get("/inbox/login?token=" + url.QueryEscape(tok))
	mustContain(t, "dev login page", p.body, `name="token"`)
	mustNotContain(t, "dev login page", p.body, tok)
	mustNotContain(t, "dev login page", p.body, `name="password"`)
	if p := b.post("/inbox/login", url.Values{"token": {"wrong"}}); p.status != http.StatusUnauthorized || !strings.Contains(p.body, "Wrong token") {
		t.Errorf("wrong dev token: %d", p.status)
	}
	b.login("", tok)

	d, qid := s.ask("asker", sentinel{Question: "Ship it?", Options: []string{"yes", "no"}, Kind: "decision"}, 1)
	st, body := s.apiCall(http.MethodPost, "/inbox/api/questions/"+qid+"/answer", map[string]string{"answer": "yes"}, map[string]string{"Authorization": "Bearer " + tok})
	if st != http.StatusOK || !strings.Contains(body, `"status":"accepted"`) || !strings.Contains(body, `"answered_by":"dev"`) {
		t.Fatalf("answer with the dev token: %d %s", st, body)
	}
	out := s.finished(d.ThreadID)
	if string(out["answer"]) != `"yes"` || string(out["answered_by"]) != `"dev"` {
		t.Errorf("round 1 input = %v", out)
	}
}

// TestPendingPage: pending questions newest first, filters by route, kind
// and sub-agent, and the time left to each deadline.
func TestPendingPage(t *testing.T) {
	s := start(t, options{})
	b := s.browser()
	b.login("alice", password)

	_, q1 := s.ask("asker", sentinel{Question: "Rewrite function A or B?", Options: []string{"A", "B"}, Kind: "decision"}, 1)
	_, q2 := s.ask("ops-asker", sentinel{Question: "Which region is primary?", Kind: "information"}, 1)
	_, q3 := s.ask("asker", sentinel{Question: "Approve the migration?", Kind: "approval"}, 1)

	p := b.get("/inbox/")
	if p.status != http.StatusOK {
		t.Fatalf("pending: %d", p.status)
	}
	order := []int{strings.Index(p.body, `data-id="`+q3+`"`), strings.Index(p.body, `data-id="`+q2+`"`), strings.Index(p.body, `data-id="`+q1+`"`)}
	if order[0] < 0 || order[0] > order[1] || order[1] > order[2] {
		t.Errorf("pending order (newest first) positions %v", order)
	}
	mustContain(t, "pending", p.body,
		`<span class="count" id="pending-count">3</span>`, "3 waiting, newest first.",
		"Rewrite function A or B?", "route approvals", "route ops", "route human",
		`<span class="tag kind-approval">Approval</span>`, `<span class="tag kind-information">Information</span>`,
		"no deadline", `data-events="/inbox/events"`)
	// The approval route has a 4h deadline.
	if !strings.Contains(p.body, "3h 59m left") && !strings.Contains(p.body, "4h left") {
		t.Errorf("pending lacks the time left of the approval:\n%s", clipBody(p.body))
	}

	for _, tc := range []struct {
		query     string
		want, not []string
	}{
		{"route=ops", []string{q2}, []string{q1, q3}},
		{"kind=approval", []string{q3}, []string{q1, q2}},
		{"subagent=asker", []string{q1, q3}, []string{q2}},
		{"subagent=asker&kind=decision", []string{q1}, []string{q2, q3}},
		{"route=nowhere", nil, []string{q1, q2, q3}},
	} {
		p := b.get("/inbox/?" + tc.query)
		for _, id := range tc.want {
			mustContain(t, tc.query, p.body, `data-id="`+id+`"`)
		}
		for _, id := range tc.not {
			mustNotContain(t, tc.query, p.body, `data-id="`+id+`"`)
		}
		mustContain(t, tc.query, p.body, `data-events="/inbox/events?`, "Clear filters")
	}
	mustContain(t, "route filter", b.get("/inbox/?route=ops").body, `<option value="ops" selected>ops</option>`, "1 of 3 waiting match the filter.")
	mustContain(t, "kind filter", b.get("/inbox/?kind=approval").body, "1 of 3 waiting match the filter.")
	// The filters offer what waits: every route, kind and sub-agent, and
	// the selected value even when nothing has it.
	mustContain(t, "choices", b.get("/inbox/?route=nowhere").body,
		`<option value="nowhere" selected>nowhere</option>`, `<option value="approvals">approvals</option>`, `<option value="ops">ops</option>`,
		`<option value="approval">Approval</option>`, `<option value="decision">Decision</option>`, `<option value="information">Information</option>`,
		`<option value="asker">asker</option>`, `<option value="ops-asker">ops-asker</option>`, "0 of 3 waiting match the filter.")
	// Once the one information question is answered, that kind is no
	// longer offered; the route and sub-agent that still have a question
	// (q4) are.
	_, q4 := s.ask("ops-asker", sentinel{Question: "Roll back or forward?", Options: []string{"back", "forward"}, Kind: "decision"}, 1)
	if p := b.api(http.MethodPost, "/inbox/api/questions/"+q2+"/answer", map[string]string{"answer": "eu-west"}, true); p.status != http.StatusOK {
		t.Fatalf("answer %s: %d %s", q2, p.status, p.body)
	}
	s.waitQuestion(q2, func(q *inbox.Question) bool { return q.Status == "answered" })
	var after page
	testkit.Eventually(t, 10*time.Second, "the pending page without "+q2, func() bool {
		after = b.get("/inbox/")
		return !strings.Contains(after.body, `data-id="`+q2+`"`)
	})
	mustContain(t, "after the answer", after.body, `<span class="count" id="pending-count">3</span>`, `data-id="`+q4+`"`,
		`<option value="approval">Approval</option>`, `<option value="decision">Decision</option>`,
		`<option value="asker">asker</option>`, `<option value="ops-asker">ops-asker</option>`, `<option value="ops">ops</option>`)
	mustNotContain(t, "after the answer", after.body, `data-id="`+q2+`"`, `value="information"`)
}

// TestQuestionPage: the question, its context as text, options as
// buttons, a free-text answer without options, approve and reject for an
// approval, the deadline, and the earlier rounds of the thread.
func TestQuestionPage(t *testing.T) {
	s := start(t, options{})
	b := s.browser()
	b.login("alice", password)

	_, qOpt := s.ask("asker", sentinel{Question: "Rewrite function A or B?", Options: []string{"A", "B", "neither"}, Context: "Same signature.\n  Different call sites.", Kind: "decision"}, 1)
	p := b.get("/inbox/questions/" + qOpt)
	mustContain(t, "options page", p.body,
		`<h1 class="q-text">Rewrite function A or B?</h1>`,
		"<div class=\"context md\" id=\"context\"><p>Same signature.\nDifferent call sites.</p>",
		`<button type="submit" class="option" name="answer" value="A" data-key="1"><kbd>1</kbd>`,
		`value="B" data-key="2"`, `value="neither" data-key="3"`,
		`action="/inbox/questions/`+qOpt+`/answer"`, "No deadline", "Add a comment", `name="comment"`,
		`<section class="block" id="thread"`, "asked a question", "this question")
	mustNotContain(t, "options page", p.body, `<textarea name="answer"`, `value="approve"`)

	_, qFree := s.ask("ops-asker", sentinel{Question: "Which region is primary?"}, 1)
	p = b.get("/inbox/questions/" + qFree)
	mustContain(t, "free-text page", p.body, `<textarea id="answer-text" name="answer" rows="5" required autofocus>`, "Send answer", "Clarification")
	mustNotContain(t, "free-text page", p.body, `class="option"`, `<pre class="context">`)

	_, qApp := s.ask("asker", sentinel{Question: "Approve the migration?", Kind: "approval"}, 1)
	p = b.get("/inbox/questions/" + qApp)
	mustContain(t, "approval page", p.body, `name="decision" value="approve"`, `name="decision" value="reject"`,
		`<textarea name="comment" rows="3">`, "Deadline", " left</span>", "route approvals")
	mustNotContain(t, "approval page", p.body, `class="option"`)

	// A thread that asks twice shows round 0's question and answer on
	// round 1's page.
	d, q0 := s.ask("asker", sentinel{Question: "Which database?", Options: []string{"postgres", "sqlite"}}, 2)
	if p := b.post("/inbox/questions/"+q0+"/answer", url.Values{"answer": {"postgres"}, "comment": {"we run it already"}}); p.status != http.StatusSeeOther {
		t.Fatalf("answer round 0: %d %s", p.status, clipBody(p.body))
	}
	q1 := s.nextRoundQuestion(d.ThreadID, 1)
	p = b.get("/inbox/questions/" + q1)
	mustContain(t, "round 1 page", p.body, "Earlier rounds", "Round 0", "<strong>postgres</strong>", "— alice,", "“we run it already”",
		`href="/inbox/questions/`+q0+`"`, "round 1")
	if p := b.get("/inbox/questions/q-nothing"); p.status != http.StatusNotFound {
		t.Errorf("unknown question: %d", p.status)
	}
}

// TestAnswerResumesThread: an option chosen on the page is the answer the
// resumed sub-agent gets, with answered_by the signed-in user; the page
// then shows it answered, the pending list drops it and the history lists
// it.
func TestAnswerResumesThread(t *testing.T) {
	s := start(t, options{})
	b := s.browser()
	b.login("alice", password)
	d, qid := s.ask("asker", sentinel{Question: "Rewrite function A or B?", Options: []string{"A", "B"}, Kind: "decision"}, 1)

	p := b.post("/inbox/questions/"+qid+"/answer", url.Values{"answer": {"B"}, "comment": {"B keeps the API"}})
	if p.status != http.StatusSeeOther || p.location != "/inbox/questions/"+qid+"?sent=1" {
		t.Fatalf("answer: %d %q %s", p.status, p.location, clipBody(p.body))
	}
	out := s.finished(d.ThreadID)
	if string(out["answer"]) != `"B"` || string(out["answered_by"]) != `"alice"` || string(out["comment"]) != `"B keeps the API"` {
		t.Errorf("round 1 input = %v", out)
	}
	p = b.get(p.location)
	mustContain(t, "answered page", p.body, "Your answer was sent.", `<p class="outcome-answer">B</p>`,
		`<strong class="answered-by">alice</strong>`, "B keeps the API")
	mustNotContain(t, "answered page", p.body, `id="answer-form"`)
	mustNotContain(t, "pending", b.get("/inbox/").body, `data-id="`+qid+`"`)
	mustContain(t, "history", b.get("/inbox/history").body, `data-id="`+qid+`"`, `<strong class="answer-text">B</strong>`,
		`<span class="answered-by">alice</span>`, "status-answered")
	// The thread view follows the resumed round to its end.
	var det *inbox.Detail
	testkit.Eventually(t, waitFor, "the thread view to show the thread finished", func() bool {
		det = s.waitQuestion(qid, func(*inbox.Question) bool { return true })
		return det.Thread != nil && det.Thread.Status == "finished"
	})
	if det.Thread == nil || len(det.Thread.Rounds) != 2 || det.Thread.Rounds[1].Status != "finished" {
		t.Errorf("thread = %+v", det.Thread)
	}
}

// TestConflict: a second person answering an answered question sees who
// answered it and when, on the page and through the API.
func TestConflict(t *testing.T) {
	s := start(t, options{})
	alice, bob := s.browser(), s.browser()
	alice.login("alice", password)
	bob.login("bob", password)
	_, qid := s.ask("asker", sentinel{Question: "Rewrite function A or B?", Options: []string{"A", "B"}}, 1)
	bob.get("/inbox/questions/" + qid) // bob has the form open

	if p := alice.post("/inbox/questions/"+qid+"/answer", url.Values{"answer": {"A"}}); p.status != http.StatusSeeOther {
		t.Fatalf("alice: %d", p.status)
	}
	p := bob.post("/inbox/questions/"+qid+"/answer", url.Values{"answer": {"B"}})
	if p.status != http.StatusConflict {
		t.Fatalf("bob: %d %s", p.status, clipBody(p.body))
	}
	mustContain(t, "bob's page", p.body, "This question was already answered by alice at ", `<p class="outcome-answer">A</p>`)
	mustNotContain(t, "bob's page", p.body, `id="answer-form"`)

	r := bob.api(http.MethodPost, "/inbox/api/questions/"+qid+"/answer", map[string]string{"answer": "B"}, true)
	var rep client.AnswerReply
	if err := json.Unmarshal([]byte(r.body), &rep); err != nil || r.status != http.StatusConflict {
		t.Fatalf("bob through the API: %d %s", r.status, r.body)
	}
	if rep.Status != client.AnswerAlreadyAnswered || rep.AnsweredBy != "alice" || rep.AnsweredAt == nil || !strings.Contains(rep.Reason, "already answered by alice at") {
		t.Errorf("reply = %+v", rep)
	}
	q, _ := s.c.Questions(t.Context(), client.QuestionFilter{DispatchID: strings.TrimPrefix(qid, "q-")})
	if len(q) != 1 || q[0].Answer != "A" || q[0].AnsweredBy != "alice" {
		t.Errorf("record = %+v", q)
	}
}

// TestRoutes: a user limited to some routes sees only those; another
// route is 403 on the page, the form and the API. An inbox limited to some
// routes shows nothing else.
func TestRoutes(t *testing.T) {
	s := start(t, options{})
	carol := s.browser()
	carol.login("carol", password)
	_, qHuman := s.ask("asker", sentinel{Question: "Rewrite function A or B?", Options: []string{"A", "B"}}, 1)
	dApp, qApp := s.ask("asker", sentinel{Question: "Approve the migration?", Kind: "approval"}, 1)

	p := carol.get("/inbox/")
	mustContain(t, "carol's pending", p.body, `data-id="`+qApp+`"`, `id="pending-count">1<`)
	mustNotContain(t, "carol's pending", p.body, `data-id="`+qHuman+`"`)
	if p := carol.get("/inbox/questions/" + qHuman); p.status != http.StatusForbidden || !strings.Contains(p.body, "route human") {
		t.Errorf("carol on a human question: %d", p.status)
	}
	if p := carol.post("/inbox/questions/"+qHuman+"/answer", url.Values{"answer": {"A"}}); p.status != http.StatusForbidden {
		t.Errorf("carol answers a human question: %d", p.status)
	}
	if p := carol.api(http.MethodGet, "/inbox/api/questions/"+qHuman, nil, false); p.status != http.StatusForbidden || !strings.Contains(p.body, inbox.ProblemForbidden) {
		t.Errorf("carol GET through the API: %d %s", p.status, p.body)
	}
	if p := carol.api(http.MethodPost, "/inbox/api/questions/"+qHuman+"/answer", map[string]string{"answer": "A"}, true); p.status != http.StatusForbidden {
		t.Errorf("carol POST through the API: %d %s", p.status, p.body)
	}
	if p := carol.api(http.MethodGet, "/inbox/api/questions?status=all", nil, false); strings.Contains(p.body, qHuman) || !strings.Contains(p.body, qApp) {
		t.Errorf("carol's list: %s", p.body)
	}
	st, _ := s.apiCall(http.MethodGet, "/inbox/api/questions/"+qHuman, nil, map[string]string{"Authorization": "Bearer " + s.bearer})
	if st != http.StatusOK {
		t.Errorf("alice GET: %d", st)
	}

	// carol may approve.
	if p := carol.post("/inbox/questions/"+qApp+"/answer", url.Values{"decision": {"approve"}, "comment": {"after the freeze"}}); p.status != http.StatusSeeOther {
		t.Fatalf("carol approves: %d %s", p.status, clipBody(p.body))
	}
	out := s.finished(dApp.ThreadID)
	if string(out["answer"]) != `"approve"` || string(out["decision"]) != `"approve"` || string(out["answered_by"]) != `"carol"` {
		t.Errorf("round 1 input = %v", out)
	}

	// An inbox for the ops route only.
	ops, err := inbox.New(inbox.Config{DevToken: true, Routes: []string{"ops"}}, inbox.Deps{Conn: s.srv.Conn(t), Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- ops.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	<-ops.Ready()
	_, qOps := s.ask("ops-asker", sentinel{Question: "Which region is primary?"}, 1)
	web := httptest.NewServer(ops.Handler())
	t.Cleanup(web.Close)
	get := func(path string) (int, string) {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, web.URL+path, nil)
		req.Header.Set("Authorization", "Bearer "+ops.DevToken())
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var sb strings.Builder
		_, _ = bufio.NewReader(resp.Body).WriteTo(&sb)
		return resp.StatusCode, sb.String()
	}
	testkit.Eventually(t, waitFor, "the ops inbox to show the ops question", func() bool {
		st, _ := get("/inbox/api/questions/" + qOps)
		return st == http.StatusOK
	})
	if st, _ := get("/inbox/api/questions/" + qHuman); st != http.StatusNotFound {
		t.Errorf("the ops inbox on a human question: %d", st)
	}
	if st, body := get("/inbox/"); st != http.StatusOK || strings.Contains(body, qHuman) || !strings.Contains(body, qOps) {
		t.Errorf("the ops inbox's pending page: %d", st)
	}

	// The ops inbox answers through the route's door, the inbox for every
	// route through the generic one.
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, web.URL+"/inbox/api/questions/"+qOps+"/answer", strings.NewReader(`{"answer":"eu"}`))
	req.Header.Set("Authorization", "Bearer "+ops.DevToken())
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the ops inbox answers: %d", resp.StatusCode)
	}
	if d := s.doors(qOps); len(d) != 1 || d[0] != "agora.api.answer.ops" {
		t.Errorf("ops answer came through %q", d)
	}
	if d := s.doors(qApp); len(d) != 1 || d[0] != "agora.api.answer" {
		t.Errorf("carol's answer came through %q", d)
	}
}

// doors lists the doors of the question's history, as the router records
// them.
func (s *system) doors(qid string) []string {
	s.t.Helper()
	kv := s.bucket(lifecycle.BucketQuestions)
	en, err := kv.Get(s.t.Context(), qid)
	if err != nil {
		s.t.Fatal(err)
	}
	var rec struct {
		History []struct {
			Door string `json:"door"`
		} `json:"history"`
	}
	if err := json.Unmarshal(en.Value(), &rec); err != nil {
		s.t.Fatal(err)
	}
	var out []string
	for _, h := range rec.History {
		out = append(out, h.Door)
	}
	return out
}

// TestCSRF: forms and cookie-authenticated API calls without the right
// token are refused and change nothing; a bearer token needs none.
func TestCSRF(t *testing.T) {
	s := start(t, options{})
	b := s.browser()
	b.login("alice", password)
	_, qid := s.ask("asker", sentinel{Question: "Rewrite function A or B?", Options: []string{"A", "B"}}, 1)

	for _, tok := range []string{"", "forged", b.csrf + "x"} {
		if p := b.post("/inbox/questions/"+qid+"/answer", url.Values{"answer": {"A"}, "csrf": {tok}}); p.status != http.StatusForbidden || !strings.Contains(p.body, "This form has expired") {
			t.Errorf("form with csrf %q: %d", tok, p.status)
		}
	}
	if p := b.api(http.MethodPost, "/inbox/api/questions/"+qid+"/answer", map[string]string{"answer": "A"}, false); p.status != http.StatusForbidden || !strings.Contains(p.body, inbox.CSRFHeader) {
		t.Errorf("API POST without the header: %d %s", p.status, p.body)
	}
	good := b.csrf
	b.csrf = "forged"
	if p := b.api(http.MethodPost, "/inbox/api/questions/"+qid+"/answer", map[string]string{"answer": "A"}, true); p.status != http.StatusForbidden {
		t.Errorf("API POST with a forged header: %d", p.status)
	}
	b.csrf = good
	// Another session's token is not this session's.
	other := s.browser()
	other.login("bob", password)
	if p := b.post("/inbox/questions/"+qid+"/answer", url.Values{"answer": {"A"}, "csrf": {other.csrf}}); p.status != http.StatusForbidden {
		t.Errorf("form with another session's token: %d", p.status)
	}
	s.waitQuestion(qid, func(q *inbox.Question) bool { return q.Pending() })
	if d := s.waitQuestion(qid, func(*inbox.Question) bool { return true }); !d.Question.Pending() {
		t.Fatal("a refused request answered the question")
	}

	if p := b.api(http.MethodPost, "/inbox/api/questions/"+qid+"/answer", map[string]string{"answer": "A"}, true); p.status != http.StatusOK {
		t.Errorf("API POST with the header: %d %s", p.status, p.body)
	}
	_, q2 := s.ask("asker", sentinel{Question: "Again?", Options: []string{"yes", "no"}}, 1)
	if st, body := s.apiCall(http.MethodPost, "/inbox/api/questions/"+q2+"/answer", map[string]string{"answer": "no"}, map[string]string{"Authorization": "Bearer " + s.bearer}); st != http.StatusOK {
		t.Errorf("bearer POST without CSRF: %d %s", st, body)
	}
}

// TestEscaping: sub-agent content is text on every page and in the live
// rows: a question or context with markup is shown, never run.
func TestEscaping(t *testing.T) {
	s := start(t, options{})
	b := s.browser()
	b.login("alice", password)
	evil := sentinel{
		Question: `<script>alert("q")</script> A or B?`,
		Context:  `</pre><img src=x onerror=alert(1)><script>document.title='x'</script>`,
		Options:  []string{`<b>bold</b>`, `"quoted" & 'apos'`},
		Kind:     "decision",
	}
	stream := openStream(t, b, "/inbox/events")
	stream.next("sync")
	d, qid := s.ask("asker", evil, 1)
	live := stream.next("upsert")

	bad := []string{"<script>alert", "<img src=x", "<b>bold</b>", `onerror=alert(1)>`}
	pending := b.get("/inbox/")
	question := b.get("/inbox/questions/" + qid)
	for name, body := range map[string]string{"pending": pending.body, "question": question.body, "live row": live["html"].(string)} {
		mustNotContain(t, name, body, bad...)
		mustContain(t, name, body, "&lt;script&gt;alert(&#34;q&#34;)&lt;/script&gt; A or B?")
	}
	mustContain(t, "question", question.body,
		// Context is Markdown with raw HTML dropped, then sanitised.
		`<div class="context md" id="context"><p>document.title=&#39;x&#39;</p>`,
		`value="&lt;b&gt;bold&lt;/b&gt;"`, "&#34;quoted&#34; &amp; &#39;apos&#39;")
	if csp := question.header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe-inline") {
		t.Errorf("Content-Security-Policy = %q", csp)
	}

	// The option with markup is still a valid answer, and the history shows it as text.
	if p := b.post("/inbox/questions/"+qid+"/answer", url.Values{"answer": {`<b>bold</b>`}}); p.status != http.StatusSeeOther {
		t.Fatalf("answer: %d %s", p.status, clipBody(p.body))
	}
	if out := s.finished(d.ThreadID); string(out["answer"]) != `"\u003cb\u003ebold\u003c/b\u003e"` && string(out["answer"]) != `"<b>bold</b>"` {
		t.Errorf("answer = %s", out["answer"])
	}
	h := b.get("/inbox/history")
	mustNotContain(t, "history", h.body, bad...)
	mustContain(t, "history", h.body, "&lt;b&gt;bold&lt;/b&gt;")
	mustNotContain(t, "answered page", b.get("/inbox/questions/"+qid).body, bad...)
}

// TestAPI: the JSON API lists, reads and answers questions.
func TestAPI(t *testing.T) {
	s := start(t, options{})
	auth := map[string]string{"Authorization": "Bearer " + s.bearer}
	d, qid := s.ask("asker", sentinel{Question: "Rewrite function A or B?", Options: []string{"A", "B"}, Context: "ctx", Kind: "decision"}, 1)
	_, qFree := s.ask("ops-asker", sentinel{Question: "Which region?"}, 1)

	st, body := s.apiCall(http.MethodGet, "/inbox/api/questions", nil, auth)
	var list inbox.List
	if err := json.Unmarshal([]byte(body), &list); err != nil || st != http.StatusOK {
		t.Fatalf("list: %d %s", st, body)
	}
	if list.Count != 2 || len(list.Questions) != 2 || list.Questions[0].QuestionID != qFree || list.Questions[1].QuestionID != qid {
		t.Errorf("list = %+v", list)
	}
	if q := list.Questions[1]; q.Question.Question != "Rewrite function A or B?" || q.Route != "human" || q.Context != "ctx" || q.Status != "asked" || q.Revision == 0 {
		t.Errorf("question = %+v", q)
	}
	if st, body := s.apiCall(http.MethodGet, "/inbox/api/questions?route=ops", nil, auth); st != http.StatusOK || strings.Contains(body, qid) || !strings.Contains(body, qFree) {
		t.Errorf("list route=ops: %d %s", st, body)
	}
	if st, body := s.apiCall(http.MethodGet, "/inbox/api/questions?status=bogus", nil, auth); st != http.StatusUnprocessableEntity || !strings.Contains(body, `"field":"status"`) {
		t.Errorf("list status=bogus: %d %s", st, body)
	}
	if st, _ := s.apiCall(http.MethodGet, "/inbox/api/questions/q-unknown", nil, auth); st != http.StatusNotFound {
		t.Errorf("unknown question: %d", st)
	}
	if st, _ := s.apiCall(http.MethodGet, "/inbox/api/nothing", nil, auth); st != http.StatusNotFound {
		t.Errorf("unknown API call: %d", st)
	}

	det := s.waitQuestion(qid, func(*inbox.Question) bool { return true })
	if det.Thread == nil || det.Thread.ThreadID != d.ThreadID || len(det.Thread.Rounds) != 1 || det.Thread.Rounds[0].QuestionID != qid {
		t.Errorf("detail thread = %+v", det.Thread)
	}

	answer := func(body any) (int, client.AnswerReply, string) {
		st, raw := s.apiCall(http.MethodPost, "/inbox/api/questions/"+qid+"/answer", body, auth)
		var rep client.AnswerReply
		_ = json.Unmarshal([]byte(raw), &rep)
		return st, rep, raw
	}
	if st, rep, raw := answer(map[string]string{"answer": "C"}); st != http.StatusUnprocessableEntity || rep.Status != client.AnswerInvalid || !strings.Contains(rep.Reason, "not one of the options") {
		t.Errorf("answer C: %d %s", st, raw)
	}
	if st, _, raw := answer(map[string]string{"answr": "A"}); st != http.StatusUnprocessableEntity || !strings.Contains(raw, "answr") {
		t.Errorf("misspelt field: %d %s", st, raw)
	}
	if st, _ := s.apiCall(http.MethodPost, "/inbox/api/questions/q-unknown/answer", map[string]string{"answer": "A"}, auth); st != http.StatusNotFound {
		t.Errorf("answer to an unknown question: %d", st)
	}
	st, rep, raw := answer(map[string]string{"answer": "A", "comment": "A is smaller"})
	if st != http.StatusOK || rep.Status != client.AnswerAccepted || rep.AnsweredBy != "alice" || rep.AnsweredAt == nil {
		t.Fatalf("answer A: %d %s", st, raw)
	}
	if out := s.finished(d.ThreadID); string(out["answer"]) != `"A"` || string(out["comment"]) != `"A is smaller"` {
		t.Errorf("round 1 input = %v", out)
	}
	det = s.waitQuestion(qid, func(q *inbox.Question) bool { return q.Status == "answered" })
	if det.Question.AnsweredBy != "alice" || det.Question.Answer != "A" || det.Question.Comment != "A is smaller" || det.Question.Outcome != "redispatched" {
		t.Errorf("answered question = %+v", det.Question)
	}
	if e, err := s.bucket(lifecycle.BucketQuestions).Get(t.Context(), qid); err != nil {
		t.Fatal(err)
	} else if !strings.Contains(string(e.Value()), `"named_door":"inbox"`) {
		t.Errorf("the record does not say the answer came through the inbox: %s", e.Value())
	}
	if st, body := s.apiCall(http.MethodGet, "/inbox/api/questions?status=answered", nil, auth); st != http.StatusOK || !strings.Contains(body, qid) || strings.Contains(body, qFree) {
		t.Errorf("list answered: %d %s", st, body)
	}
}

// TestHistory: answered, expired and withdrawn questions, with who
// answered what and when.
func TestHistory(t *testing.T) {
	s := start(t, options{})
	b := s.browser()
	b.login("alice", password)
	_, qAns := s.ask("asker", sentinel{Question: "Rewrite function A or B?", Options: []string{"A", "B"}}, 1)
	if p := b.post("/inbox/questions/"+qAns+"/answer", url.Values{"answer": {"B"}}); p.status != http.StatusSeeOther {
		t.Fatalf("answer: %d", p.status)
	}
	_, qExp := s.ask("quick-asker", sentinel{Question: "Quick, A or B?", Options: []string{"A", "B"}}, 1) // expires after 1s
	dW, qW := s.ask("asker", sentinel{Question: "Still needed?"}, 1)
	if _, err := s.c.CancelThread(t.Context(), dW.ThreadID, client.CancelBy("alice", "not needed")); err != nil {
		t.Fatal(err)
	}
	s.waitQuestion(qExp, func(q *inbox.Question) bool { return q.Status == "expired" })
	s.waitQuestion(qW, func(q *inbox.Question) bool { return q.Status == "withdrawn" })

	p := b.get("/inbox/history")
	mustContain(t, "history", p.body, "3 closed on this page, latest first.",
		`data-id="`+qAns+`"`, `data-id="`+qExp+`"`, `data-id="`+qW+`"`,
		`<span class="tag status-answered">Answered</span>`, `<span class="tag status-expired">Expired</span>`, `<span class="tag status-withdrawn">Withdrawn</span>`,
		`<strong class="answer-text">B</strong> by <span class="answered-by">alice</span>`)
	p = b.get("/inbox/history?status=expired")
	mustContain(t, "expired history", p.body, `data-id="`+qExp+`"`, `<option value="expired" selected>Expired</option>`)
	mustNotContain(t, "expired history", p.body, `data-id="`+qAns+`"`, `data-id="`+qW+`"`)
	mustContain(t, "expired page", b.get("/inbox/questions/"+qExp).body, "outcome-expired", "Expired")
	mustContain(t, "withdrawn page", b.get("/inbox/questions/"+qW).body, "outcome-withdrawn", "Withdrawn")
	// Answering an expired question says it is closed.
	p = b.post("/inbox/questions/"+qExp+"/answer", url.Values{"answer": {"A"}})
	if p.status != http.StatusConflict || !strings.Contains(p.body, "This question is closed: the question expired") {
		t.Errorf("answer an expired question: %d %s", p.status, clipBody(p.body))
	}
}

// TestLive: the event stream announces a new question with its rendered
// row and a question answered elsewhere with who answered it; a filtered
// stream only counts questions outside its filter.
func TestLive(t *testing.T) {
	s := start(t, options{})
	b := s.browser()
	b.login("alice", password)
	_, q0 := s.ask("asker", sentinel{Question: "Already waiting?", Options: []string{"yes"}}, 1)

	all := openStream(t, b, "/inbox/events")
	ops := openStream(t, b, "/inbox/events?route=ops")
	sync := all.next("sync")
	if items := sync["items"].([]any); len(items) != 1 || items[0].(map[string]any)["id"] != q0 || sync["pending"] != float64(1) {
		t.Errorf("sync = %v", sync)
	}
	if items := ops.next("sync")["items"].([]any); len(items) != 0 {
		t.Errorf("ops sync = %v", items)
	}

	_, qid := s.ask("asker", sentinel{Question: "Rewrite function A or B?", Options: []string{"A", "B"}}, 1)
	up := all.next("upsert")
	if up["id"] != qid || !strings.Contains(up["html"].(string), "Rewrite function A or B?") || !strings.Contains(up["html"].(string), `data-id="`+qid+`"`) || up["pending"] != float64(2) {
		t.Errorf("upsert = %v", up)
	}
	if c := ops.next("count"); c["pending"] != float64(2) {
		t.Errorf("ops count = %v", c)
	}
	if len(ops.seen) != 0 {
		t.Errorf("the ops stream got rows %v", ops.seen)
	}

	bob := s.browser()
	bob.login("bob", password)
	if p := bob.api(http.MethodPost, "/inbox/api/questions/"+qid+"/answer", map[string]string{"answer": "A"}, true); p.status != http.StatusOK {
		t.Fatalf("bob answers: %d %s", p.status, p.body)
	}
	rm := all.next("remove")
	if rm["id"] != qid || rm["status"] != "answered" || rm["answered_by"] != "bob" || !strings.HasPrefix(rm["message"].(string), "Answered by bob at ") || rm["pending"] != float64(1) {
		t.Errorf("remove = %v", rm)
	}

	// The question page's stream follows one question.
	one := openStream(t, b, "/inbox/events?question="+q0)
	if items := one.next("sync")["items"].([]any); len(items) != 1 {
		t.Errorf("question sync = %v", items)
	}
	if p := bob.api(http.MethodPost, "/inbox/api/questions/"+q0+"/answer", map[string]string{"answer": "yes"}, true); p.status != http.StatusOK {
		t.Fatalf("bob answers: %d", p.status)
	}
	if rm := one.next("remove"); rm["id"] != q0 || rm["answered_by"] != "bob" {
		t.Errorf("question remove = %v", rm)
	}
	// Opened after the question closed, its stream says so at once.
	late := openStream(t, b, "/inbox/events?question="+q0)
	if items := late.next("sync")["items"].([]any); len(items) != 0 {
		t.Errorf("closed question sync = %v", items)
	}
	if rm := late.next("remove"); rm["id"] != q0 || rm["status"] != "answered" || rm["answered_by"] != "bob" {
		t.Errorf("closed question remove = %v", rm)
	}
}

// stream reads Server-Sent Events.
type stream struct {
	t      *testing.T
	events chan sse
	done   chan struct{} // closed when the server ends the stream
	seen   []string      // ids of upserts received
}

type sse struct {
	event string
	data  map[string]any
}

func openStream(t *testing.T, b *browser, path string) *stream {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, b.s.web.URL+path, nil)
	resp, err := b.hc.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		cancel()
		t.Fatalf("stream %s: %d %s", path, resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	st := &stream{t: t, events: make(chan sse, 64), done: make(chan struct{})}
	t.Cleanup(func() { cancel(); resp.Body.Close(); <-st.done })
	go func() {
		defer close(st.done)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		var ev string
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "event: "):
				ev = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				var m map[string]any
				_ = json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &m)
				select {
				case st.events <- sse{ev, m}:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return st
}

// next returns the data of the next event of kind want. Other events
// before it may only be upserts of rows already sent (a record's new
// revision) or counts.
func (st *stream) next(want string) map[string]any {
	st.t.Helper()
	timeout := time.After(waitFor)
	for {
		select {
		case e := <-st.events:
			if e.event == want {
				if e.event == "upsert" {
					st.seen = append(st.seen, e.data["id"].(string))
				}
				return e.data
			}
			if e.event == "count" || (e.event == "upsert" && slices.Contains(st.seen, fmt.Sprint(e.data["id"]))) {
				continue
			}
			st.t.Fatalf("event %s %v, want %s", e.event, e.data, want)
		case <-timeout:
			st.t.Fatalf("no %s event", want)
		}
	}
}

// TestRunWithoutBucket: Run fails at once, naming the bucket, on a server
// that was never provisioned.
func TestRunWithoutBucket(t *testing.T) {
	srv := natstest.Start(t)
	s, err := inbox.New(inbox.Config{DevToken: true}, inbox.Deps{Conn: srv.Conn(t), Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), waitFor)
	defer cancel()
	if err := s.Run(ctx); err == nil || !strings.Contains(err.Error(), "agora_questions") {
		t.Errorf("Run = %v", err)
	}
	// Before any load, pages say the inbox is starting rather than empty.
	req := httptest.NewRequest(http.MethodGet, "/inbox/healthz", nil)
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, req)
	if rec.Code != http.StatusServiceUnavailable {
		t.Errorf("healthz before a load: %d", rec.Code)
	}
}

// The inbox keeps only pending questions in memory; history is read from
// the bucket a page at a time, with a cursor, without gaps or repeats.
func TestMemoryFollowsPendingWork(t *testing.T) {
	s := start(t, options{})
	const n = 7
	var answered []string
	for i := range n {
		_, qid := s.ask("asker", sentinel{Question: fmt.Sprintf("Question %d?", i), Options: []string{"A", "B"}}, 1)
		if _, err := s.c.Answer(t.Context(), qid, lifecycle.Answer{Answer: "A", AnsweredBy: "bob"}); err != nil {
			t.Fatal(err)
		}
		answered = append(answered, qid)
	}
	_, pending := s.ask("asker", sentinel{Question: "Still waiting?"}, 1)
	for _, qid := range answered {
		s.waitQuestion(qid, func(q *inbox.Question) bool { return q.Status == inbox.StatusAnswered })
	}
	// Memory: the one pending question.
	var health struct{ Questions int }
	_, body := s.apiCall(http.MethodGet, "/inbox/healthz", nil, nil)
	if err := json.Unmarshal([]byte(body), &health); err != nil || health.Questions != 1 {
		t.Errorf("the inbox holds %d questions in memory (%s), want the 1 pending", health.Questions, body)
	}
	// History, three at a time.
	auth := map[string]string{"Authorization": "Bearer " + s.bearer}
	seen := map[string]bool{}
	cursor, pages := "", 0
	for {
		l := s.listAPI("status=answered&limit=3&cursor=" + url.QueryEscape(cursor))
		pages++
		if len(l.Questions) > 3 {
			t.Errorf("page of %d, limit 3", len(l.Questions))
		}
		for _, q := range l.Questions {
			if seen[q.QuestionID] {
				t.Errorf("%s on two pages", q.QuestionID)
			}
			seen[q.QuestionID] = true
			if q.Status != inbox.StatusAnswered || q.AnsweredBy != "bob" {
				t.Errorf("history row %+v", q.Question)
			}
		}
		if l.NextCursor == "" || pages > 10 {
			break
		}
		cursor = l.NextCursor
	}
	for _, qid := range answered {
		if !seen[qid] {
			t.Errorf("%s missing from the history", qid)
		}
	}
	if seen[pending] {
		t.Error("a pending question in the history")
	}
	if pages < 3 {
		t.Errorf("%d pages for %d questions at 3 a page", pages, n)
	}
	if status, body := s.apiCall(http.MethodGet, "/inbox/api/questions?status=answered&cursor=nope", nil, auth); status != http.StatusUnprocessableEntity || !strings.Contains(body, "cursor") {
		t.Errorf("bad cursor: %d %s", status, body)
	}
	// A closed question still reads in full: the API and its page.
	d := s.waitQuestion(answered[0], func(q *inbox.Question) bool { return true })
	if d.Question.AnsweredBy != "bob" {
		t.Errorf("detail of a closed question: %+v", d.Question)
	}
	b := s.browser()
	b.login("alice", password)
	mustContain(t, "closed question page", b.get("/inbox/questions/"+answered[0]).body, "Question 0?", "bob")
	// The history page pages too.
	p := b.get("/inbox/history?limit=3")
	mustContain(t, "history page", p.body, "3 closed on this page, latest first.", `id="history-next"`)
}

// Pending questions come a page at a time, newest first, with a cursor: no
// row twice, none left out, a question asked meanwhile does not shift the
// later pages, and a cursor the inbox did not give is refused.
func TestPendingPages(t *testing.T) {
	s := start(t, options{})
	var asked []string
	for i := range 7 {
		_, qid := s.ask("asker", sentinel{Question: fmt.Sprintf("Pending %d?", i)}, 1)
		s.waitQuestion(qid, func(q *inbox.Question) bool { return q.Status == inbox.StatusAsked })
		asked = append(asked, qid)
	}
	auth := map[string]string{"Authorization": "Bearer " + s.bearer}
	list := func(cursor string) inbox.List {
		t.Helper()
		return s.listAPI("limit=3&cursor=" + url.QueryEscape(cursor))
	}
	var got []*inbox.Question
	first := list("")
	if first.Count != 7 || len(first.Questions) != 3 || first.NextCursor == "" {
		t.Fatalf("first page: count %d, %d rows, next %q; want 7, 3 and a cursor", first.Count, len(first.Questions), first.NextCursor)
	}
	got = append(got, first.Questions...)
	// Asked after the first page was read: newer than all of it.
	_, late := s.ask("asker", sentinel{Question: "Asked late?"}, 1)
	s.waitQuestion(late, func(q *inbox.Question) bool { return q.Status == inbox.StatusAsked })
	cursor := first.NextCursor
	for pages := 1; cursor != ""; pages++ {
		if pages > 5 {
			t.Fatal("more pages than questions")
		}
		l := list(cursor)
		if l.Count != 8 {
			t.Errorf("count %d after the late question, want 8", l.Count)
		}
		got = append(got, l.Questions...)
		cursor = l.NextCursor
	}
	seen := map[string]bool{}
	for i, q := range got {
		if seen[q.QuestionID] {
			t.Errorf("%s on two pages", q.QuestionID)
		}
		seen[q.QuestionID] = true
		if q.QuestionID == late {
			t.Errorf("the late question shifted into a later page")
		}
		if i > 0 && q.AskedAt.After(got[i-1].AskedAt) {
			t.Errorf("row %d asked at %v after row %d (%v): not newest first", i, q.AskedAt, i-1, got[i-1].AskedAt)
		}
	}
	for _, qid := range asked {
		if !seen[qid] {
			t.Errorf("%s on no page", qid)
		}
	}
	if len(got) != 7 {
		t.Errorf("%d rows over the pages, want 7", len(got))
	}
	// Counts by route and by who may see what: two approvals join the
	// eight waiting questions (two different ones: the same one would
	// join the first); carol may answer on approvals only.
	for i := range 2 {
		_, qid := s.ask("asker", sentinel{Question: fmt.Sprintf("Approve %d?", i), Kind: "approval"}, 1)
		s.waitQuestion(qid, func(q *inbox.Question) bool { return q.Status == inbox.StatusAsked })
	}
	carol := s.browser()
	carol.login("carol", password)
	for _, c := range []struct {
		who         string
		query       string
		count, rows int
	}{
		{"alice", "limit=3", 10, 3},
		{"alice", "route=approvals&limit=1", 2, 1},
		{"alice", "kind=approval&limit=5", 2, 2},
		{"carol", "limit=50", 2, 2},
		{"carol", "route=human", 0, 0},
	} {
		var l inbox.List
		if c.who == "carol" {
			p := carol.api(http.MethodGet, "/inbox/api/questions?"+c.query, nil, false)
			if err := json.Unmarshal([]byte(p.body), &l); err != nil {
				t.Fatalf("carol %s: %v: %s", c.query, err, p.body)
			}
		} else {
			l = s.listAPI(c.query)
		}
		if l.Count != c.count || len(l.Questions) != c.rows {
			t.Errorf("%s ?%s: count %d with %d rows, want %d with %d", c.who, c.query, l.Count, len(l.Questions), c.count, c.rows)
		}
		for _, q := range l.Questions {
			if c.who == "carol" && q.Route != "approvals" {
				t.Errorf("carol sees %s on route %s", q.QuestionID, q.Route)
			}
		}
	}
	for _, bad := range []string{"p123", "pnope.Q", "12x", "p.Q"} {
		status, body := s.apiCall(http.MethodGet, "/inbox/api/questions?cursor="+url.QueryEscape(bad), nil, auth)
		if status != http.StatusUnprocessableEntity || !strings.Contains(body, "cursor") {
			t.Errorf("cursor %q: %d %s, want 422 naming the cursor", bad, status, body)
		}
	}
}

// The pending page and its live stream list the newest PendingRows waiting
// questions and say so; the API still pages through every one.
func TestPendingPageIsCapped(t *testing.T) {
	s := start(t, options{pendingRows: 2})
	var asked []string
	for i := range 3 {
		_, qid := s.ask("asker", sentinel{Question: fmt.Sprintf("Capped %d?", i)}, 1)
		s.waitQuestion(qid, func(q *inbox.Question) bool { return q.Status == inbox.StatusAsked })
		asked = append(asked, qid)
	}
	b := s.browser()
	b.login("alice", password)
	p := b.get("/inbox/")
	if n := strings.Count(p.body, `<li class="row`); n != 2 {
		t.Errorf("the page lists %d rows, want 2", n)
	}
	mustContain(t, "capped page", p.body, "3 waiting, newest first.", "Showing the newest 2", asked[1], asked[2])
	mustNotContain(t, "capped page", p.body, asked[0])
	live := openStream(t, b, "/inbox/events")
	sync := live.next("sync")
	items, _ := sync["items"].([]any)
	if len(items) != 2 || sync["pending"] != float64(3) {
		t.Errorf("live sync: %d items, pending %v; want 2 and 3", len(items), sync["pending"])
	}
	_, body := s.apiCall(http.MethodGet, "/inbox/api/questions", nil, map[string]string{"Authorization": "Bearer " + s.bearer})
	for _, qid := range asked {
		if !strings.Contains(body, qid) {
			t.Errorf("the API lists no %s", qid)
		}
	}
}
