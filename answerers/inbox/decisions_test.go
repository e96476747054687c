package inbox_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/answerers/inbox"
	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// decisionsAPI lists the remembered decisions as the bearer token's user.
func (s *system) decisionsAPI(token, query string) inbox.DecisionList {
	s.t.Helper()
	status, body := s.apiCall(http.MethodGet, "/inbox/api/decisions?"+query, nil, map[string]string{"Authorization": "Bearer " + token})
	if status != http.StatusOK {
		s.t.Fatalf("decisions ?%s: %d %s", query, status, body)
	}
	var l inbox.DecisionList
	if err := json.Unmarshal([]byte(body), &l); err != nil {
		s.t.Fatalf("decisions: %v: %s", err, body)
	}
	return l
}

// waitDecisions waits until the JSON API lists n remembered decisions:
// the router remembers an answer just after it replies to it.
func (s *system) waitDecisions(token string, n int) inbox.DecisionList {
	s.t.Helper()
	var l inbox.DecisionList
	testkit.Eventually(s.t, waitFor, fmt.Sprintf("%d remembered decisions", n), func() bool {
		l = s.decisionsAPI(token, "")
		return len(l.Decisions) == n
	})
	return l
}

// memoQuestion is what the memo-asker asks in these tests.
var memoQuestion = sentinel{Question: "Rename the config loader: readConfig or parseConfig?", Options: []string{"readConfig", "parseConfig"}, Kind: "decision"}

// TestDecisions: an answer on a route that remembers (memo) is listed by
// the JSON API with who and when and when it expires; the same question
// asked again is answered from it at once, and its page says whose
// decision it reused; forgetting it (DELETE, a session needs the CSRF
// header) lists it no more, and the question is asked again. People see
// and forget only decisions of routes they may answer; errors are
// problem documents.
func TestDecisions(t *testing.T) {
	s := start(t, options{})
	auth := map[string]string{"Authorization": "Bearer " + s.bearer}
	_, q1 := s.ask("memo-asker", memoQuestion, 1)
	if st, body := s.apiCall(http.MethodPost, "/inbox/api/questions/"+q1+"/answer", map[string]string{"answer": "parseConfig", "comment": "like the parse* helpers"}, auth); st != http.StatusOK {
		t.Fatalf("answer: %d %s", st, body)
	}
	l := s.waitDecisions(s.bearer, 1)
	if l.Count != 1 {
		t.Fatalf("decisions = %+v", l)
	}
	d := l.Decisions[0]
	if d.Route != "memo" || d.QuestionID != q1 || d.Answer != "parseConfig" || d.AnsweredBy != "alice" || d.Question != memoQuestion.Question ||
		d.ExpiresAt.Sub(d.AnsweredAt) != 720*time.Hour {
		t.Errorf("decision = %+v", d)
	}
	if l := s.decisionsAPI(s.bearer, "route=human"); l.Count != 0 {
		t.Errorf("route=human lists %+v", l.Decisions)
	}
	if st, body := s.apiCall(http.MethodGet, "/inbox/api/decisions?route=not+a+route", nil, auth); st != http.StatusUnprocessableEntity || !strings.Contains(body, `"route"`) {
		t.Errorf("a bad route: %d %s", st, body)
	}
	// carol answers approvals only: not hers to see or forget.
	carol := s.apiLogin("carol", password)
	if l := s.decisionsAPI(carol, ""); l.Count != 0 {
		t.Errorf("carol sees %+v", l.Decisions)
	}
	if st, body := s.apiCall(http.MethodDelete, "/inbox/api/decisions/"+d.ID, nil, map[string]string{"Authorization": "Bearer " + carol}); st != http.StatusForbidden || !strings.Contains(body, inbox.ProblemForbidden) {
		t.Errorf("carol forgets: %d %s", st, body)
	}

	// Asked again: answered at once from the decision, with provenance.
	d2, q2 := s.dispatchAndWait("memo-asker", memoQuestion)
	if out := s.finished(d2.ThreadID); string(out["answer"]) != `"parseConfig"` || string(out["answered_by"]) != `"memory:`+q1+`"` {
		t.Errorf("the second thread resumed with %s by %s", out["answer"], out["answered_by"])
	}
	got := s.waitQuestion(q2, func(q *inbox.Question) bool { return q.Status == inbox.StatusAnswered }).Question
	if got.Reused == nil || got.Reused.QuestionID != q1 || got.Reused.AnsweredBy != "alice" {
		t.Errorf("the second question's record = %+v (reused %+v)", got.Question, got.Reused)
	}
	b := s.browser()
	b.login("alice", password)
	mustContain(t, "the reused question's page", b.get("/inbox/questions/"+q2).body, `id="reused"`,
		`answered from the decision of <a href="/inbox/questions/`+q1+`">`+q1+`</a> by <strong>alice</strong>`)

	// Forget it: a session needs the CSRF header; then it is gone.
	if p := b.api(http.MethodDelete, "/inbox/api/decisions/"+d.ID, nil, false); p.status != http.StatusForbidden {
		t.Errorf("DELETE without the CSRF header: %d", p.status)
	}
	p := b.api(http.MethodDelete, "/inbox/api/decisions/"+d.ID, nil, true)
	var forgot client.Decision
	if p.status != http.StatusOK || json.Unmarshal([]byte(p.body), &forgot) != nil || forgot.ID != d.ID || forgot.QuestionID != q1 {
		t.Fatalf("forget: %d %s", p.status, p.body)
	}
	if l := s.decisionsAPI(s.bearer, ""); l.Count != 0 {
		t.Errorf("after forgetting: %+v", l.Decisions)
	}
	st, body := s.apiCall(http.MethodDelete, "/inbox/api/decisions/"+d.ID, nil, auth)
	if st != http.StatusNotFound || !strings.Contains(body, client.ProblemNotFound) {
		t.Errorf("forget again: %d %s", st, body)
	}
	// Asked a third time, it waits for a person again.
	s.ask("memo-asker", memoQuestion, 1)
}

// dispatchAndWait dispatches sub-agent sa asking q and waits until the
// inbox has its question record, in whatever state.
func (s *system) dispatchAndWait(sa string, q sentinel) (*client.Dispatch, string) {
	s.t.Helper()
	d, err := s.c.Dispatch(s.t.Context(), lifecycleRequest(sa, q))
	if err != nil {
		s.t.Fatal(err)
	}
	qid := lifecycle.QuestionID(d.DispatchID)
	s.waitQuestion(qid, func(*inbox.Question) bool { return true })
	return d, qid
}

// TestDecisionsPage: the page lists the remembered decisions with route,
// question, answer, who, when and expiry, and its forget button (a form
// with the session's CSRF token) forgets one.
func TestDecisionsPage(t *testing.T) {
	s := start(t, options{})
	b := s.browser()
	b.login("bob", password)
	_, q1 := s.ask("memo-asker", memoQuestion, 1)
	if p := b.post("/inbox/questions/"+q1+"/answer", url.Values{"answer": {"readConfig"}}); p.status != http.StatusSeeOther {
		t.Fatalf("answer: %d", p.status)
	}
	id := s.waitDecisions(s.bearer, 1).Decisions[0].ID
	p := b.get("/inbox/decisions")
	mustContain(t, "decisions page", p.body, `<tr data-id="`+id+`">`, "<td>memo</td>", memoQuestion.Question, `<strong class="decision-answer">readConfig</strong>`,
		`<td class="decision-by">bob</td>`, `action="/inbox/decisions/`+id+`/forget"`, `name="csrf" value="`+b.csrf+`"`, "(in 29d 23h)")
	if p := b.post("/inbox/decisions/"+id+"/forget", url.Values{"csrf": {"wrong"}}); p.status != http.StatusForbidden {
		t.Errorf("forget with a wrong token: %d", p.status)
	}
	if len(s.decisionsAPI(s.bearer, "").Decisions) != 1 {
		t.Error("a refused forget forgot")
	}
	p = b.post("/inbox/decisions/"+id+"/forget", url.Values{})
	if p.status != http.StatusSeeOther || p.location != "/inbox/decisions?forgot=1" {
		t.Fatalf("forget: %d %s", p.status, p.location)
	}
	p = b.get(p.location)
	mustContain(t, "decisions page after forgetting", p.body, `id="decisions-notice"`, "Forgotten", `id="no-decisions"`)
	mustNotContain(t, "decisions page after forgetting", p.body, `data-id="`+id+`"`)
	if p = b.post("/inbox/decisions/"+id+"/forget", url.Values{}); p.location != "/inbox/decisions?forgot=gone" {
		t.Errorf("forget twice: %d %s", p.status, p.location)
	}
}
