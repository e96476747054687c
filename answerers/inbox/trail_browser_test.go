package inbox_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/agora-dispatch/agora/answerers/inbox"
	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// slowOnSuggestion asks its input in round 0; in round 1 it runs on for a
// minute when a suggestion answered it (a reversal has time to come), and
// finishes at once with a person's answer.
const slowOnSuggestion = `if [ "$AGORA_ROUND" -lt 1 ]; then
  cp "$AGORA_INPUT_FILE" "$AGORA_NEEDS_INPUT_FILE"
elif grep -q '"answered_by":"suggested:' "$AGORA_INPUT_FILE"; then
  sleep 60; cp "$AGORA_INPUT_FILE" "$AGORA_OUTPUT_FILE"
else
  cp "$AGORA_INPUT_FILE" "$AGORA_OUTPUT_FILE"
fi`

// suggest sends an answerer's suggestion for qid on route bots, whose
// auto_accept (0.9) takes it as the answer.
func (s *system) suggest(qid, answer string, confidence float64) {
	s.t.Helper()
	body, _ := json.Marshal(client.Submission{QuestionID: qid, Answer: answer, AnsweredBy: "bot", Suggest: true, Confidence: &confidence, Reason: "the tests name it so"})
	m, err := s.srv.Conn(s.t).Request("agora.api.answer.bots", body, 10*time.Second)
	if err != nil {
		s.t.Fatal(err)
	}
	var rep client.AnswerReply
	if err := json.Unmarshal(m.Data, &rep); err != nil || rep.Status != client.AnswerAccepted {
		s.t.Fatalf("suggestion: %s %v", m.Data, err)
	}
}

// terminalOf waits for dispatch id's terminal event and returns it as
// the dispatcher's thread view sums it up.
func (s *system) terminalOf(threadID, id string) *client.Result {
	s.t.Helper()
	var d *client.Result
	testkit.Eventually(s.t, waitFor, "the terminal event of "+id, func() bool {
		rec, err := s.c.Status(s.t.Context(), id)
		if err != nil || rec.ThreadID != threadID || rec.Result == nil {
			return false
		}
		d = rec.Result
		return true
	})
	return d
}

// TestBrowserTrailAndReversal drives the inbox in headless Chromium: a
// question an answerer's suggestion answered is marked machine-made on its
// page, in the History and in the thread's decision trail; alice reverses
// it while the resumed run still runs, which cancels that run and resumes
// the thread with her answer; a reversal after the thread went on is
// refused, saying so; carol, not allowed on the route, sees neither the
// trail nor can reverse. What the sub-agent wrote is shown escaped.
func TestBrowserTrailAndReversal(t *testing.T) {
	s := start(t, options{})
	c := newChrome(t)
	s.shell("bot-slow", slowOnSuggestion)
	hostile := `<img src=x onerror="document.title='pwned'">parseConfig`
	opts := []string{"readConfig", hostile}

	// A thread a suggestion answered, whose resumed run is still running.
	d, qid := s.ask("bot-slow", sentinel{Question: "Name the loader <b>now</b>?", Options: opts, Kind: "decision"}, 1)
	s.suggest(qid, hostile, 0.95)
	det := s.waitQuestion(qid, func(q *inbox.Question) bool { return q.Status == "answered" })
	resumed := det.Question.NextDispatchID
	testkit.Eventually(t, waitFor, "the resumed run to start", func() bool {
		rec, err := s.c.Status(t.Context(), resumed)
		return err == nil && rec.Status == lifecycle.KindStarted
	})

	c.do("sign in as alice",
		chromedp.Navigate(s.web.URL+"/inbox/login"),
		chromedp.WaitVisible(chromedp.CSS(`input[name="name"]`)),
		chromedp.SendKeys(chromedp.CSS(`input[name="name"]`), "alice"),
		chromedp.SendKeys(chromedp.CSS(`input[name="password"]`), password),
		chromedp.Click(chromedp.CSS(`button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#pending`)),
	)
	c.do("see it machine-made in the History",
		chromedp.Navigate(s.web.URL+"/inbox/history"),
		chromedp.WaitVisible(chromedp.CSS(`#history li[data-id="`+qid+`"] .machine .tag-machine`)),
	)
	c.do("open its page",
		chromedp.Navigate(s.web.URL+"/inbox/questions/"+qid),
		chromedp.WaitVisible(chromedp.CSS(`#machine-made`)),
		chromedp.WaitVisible(chromedp.CSS(`#trail li[data-how="suggestion"][data-machine="true"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#reverse-form`)),
	)
	if m := c.text(`#machine-made`); !strings.Contains(m, "suggested by bot at 95%") {
		t.Errorf("machine-made mark = %q", m)
	}
	trail := c.text(`#trail`)
	for _, want := range []string{"asked", "answered by an accepted suggestion", "bot-slow", "suggested:bot", "machine-made", hostile[:20]} {
		if !strings.Contains(trail, want) {
			t.Errorf("trail %q lacks %q", trail, want)
		}
	}
	if n := c.eval(`String(document.querySelectorAll('#question img').length) + document.title`); strings.Contains(n, "pwned") || !strings.HasPrefix(n, "0") {
		t.Fatalf("the sub-agent's text became markup: %s", n)
	}

	// carol may answer approvals only: neither the page, its trail nor a
	// reversal.
	carol := s.apiLogin("carol", password)
	if st, body := s.apiCall(http.MethodGet, "/inbox/api/questions/"+qid, nil, map[string]string{"Authorization": "Bearer " + carol}); st != http.StatusForbidden || strings.Contains(body, "trail") {
		t.Errorf("carol reads the question: %d %s", st, body)
	}
	if st, body := s.apiCall(http.MethodPost, "/inbox/api/questions/"+qid+"/reverse", map[string]string{"answer": "readConfig"}, map[string]string{"Authorization": "Bearer " + carol}); st != http.StatusForbidden {
		t.Errorf("carol's reversal: %d %s", st, body)
	}

	// alice reverses it.
	c.do("reverse with readConfig",
		chromedp.Click(chromedp.CSS(`#reverse-form button[value="readConfig"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#reversed`)),
	)
	if n := c.text(`.notice`); !strings.Contains(n, "reversed") || !strings.Contains(n, resumed) {
		t.Errorf("notice after the reversal = %q", n)
	}
	c.do("see the reversal in the trail and no more machine-made mark",
		chromedp.WaitVisible(chromedp.CSS(`#trail li[data-how="reversal"]`)),
		chromedp.WaitNotPresent(chromedp.CSS(`#machine-made`)),
		chromedp.WaitNotPresent(chromedp.CSS(`#reverse-form`)),
	)
	// The suggestion's run was cancelled, by alice…
	if end := s.terminalOf(d.ThreadID, resumed); end.Kind != lifecycle.KindCancelled || end.By != "alice" {
		t.Fatalf("the resumed dispatch ended %+v, want cancelled by alice", end)
	}
	// …and the thread resumed with her answer, in a new dispatch of the
	// same round, which finished.
	now := s.waitQuestion(qid, func(q *inbox.Question) bool { return q.Reversal != nil })
	rv := now.Question.Reversal
	if rv.CancelledDispatchID != resumed || rv.NextDispatchID == resumed || now.Question.NextDispatchID != rv.NextDispatchID || rv.By != "alice" {
		t.Errorf("reversal = %+v, next dispatch %s", rv, now.Question.NextDispatchID)
	}
	end := s.terminalOf(d.ThreadID, rv.NextDispatchID)
	var out map[string]json.RawMessage
	if err := json.Unmarshal(end.Output, &out); end.Kind != lifecycle.KindFinished || err != nil ||
		string(out["answer"]) != `"readConfig"` || string(out["answered_by"]) != `"alice"` {
		t.Errorf("the new dispatch ended %+v, want finished with alice's readConfig", end)
	}
	// A second reversal has nothing to reverse.
	if st, body := s.apiCall(http.MethodPost, "/inbox/api/questions/"+qid+"/reverse", map[string]string{"answer": "readConfig"}, map[string]string{"Authorization": "Bearer " + s.bearer}); st != http.StatusUnprocessableEntity {
		t.Errorf("second reversal: %d %s", st, body)
	}

	// Too late: a suggestion whose resumed run finished already.
	d2, q2 := s.ask("bot-asker", sentinel{Question: "Which region?", Options: []string{"eu", "us"}, Kind: "decision"}, 1)
	s.suggest(q2, "eu", 0.97)
	s.finished(d2.ThreadID)
	c.do("open the finished thread's question",
		chromedp.Navigate(s.web.URL+"/inbox/questions/"+q2),
		chromedp.WaitVisible(chromedp.CSS(`#machine-made`)),
		chromedp.Click(chromedp.CSS(`#reverse-form button[value="us"]`)),
		chromedp.WaitVisible(chromedp.CSS(`.notice-warn`)),
	)
	if n := c.text(`.notice-warn`); !strings.Contains(n, "too late") || !strings.Contains(n, "finished") {
		t.Errorf("late reversal notice = %q", n)
	}
	if m := c.text(`#machine-made`); m == "" {
		t.Error("the refused reversal removed the machine-made mark")
	}

	// Two threads asking the same question wait on one; a suggestion
	// answers both. Both are marked machine-made, and neither offers a
	// reversal: it would change one thread of the two.
	_, qA := s.ask("bot-slow", sentinel{Question: "Shared: which cache?", Options: []string{"lru", "lfu"}, Kind: "decision"}, 1)
	dB, err := s.c.Dispatch(t.Context(), lifecycle.Request{Subagent: "bot-slow", Input: mustJSON(t, sentinel{Question: "Shared: which cache?", Options: []string{"lru", "lfu"}, Kind: "decision"}),
		Target: "repo/agora", Labels: map[string]string{"team": "core"}})
	if err != nil {
		t.Fatal(err)
	}
	qB := lifecycle.QuestionID(dB.DispatchID)
	s.waitQuestion(qB, func(q *inbox.Question) bool { return q.JoinedTo == qA })
	s.suggest(qA, "lfu", 0.99)
	s.waitQuestion(qB, func(q *inbox.Question) bool { return q.Status == "answered" })
	for _, q := range []string{qA, qB} {
		c.do("open "+q,
			chromedp.Navigate(s.web.URL+"/inbox/questions/"+q),
			chromedp.WaitVisible(chromedp.CSS(`#machine-made`)),
			chromedp.WaitVisible(chromedp.CSS(`#trail`)),
		)
		if n := c.eval(`String(document.querySelectorAll('#reverse-form').length)`); n != "0" {
			t.Errorf("%s offers a reversal of an answer that resumed two threads", q)
		}
	}
	if st, body := s.apiCall(http.MethodPost, "/inbox/api/questions/"+qA+"/reverse", map[string]string{"answer": "lru"}, map[string]string{"Authorization": "Bearer " + s.bearer}); st != http.StatusUnprocessableEntity {
		t.Errorf("reversal of a shared answer: %d %s", st, body)
	}
}

func mustJSON(t *testing.T, v any) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// approvalNext asks its input in round 0 and an approval in round 1, then
// finishes: a thread whose questions go to two routes.
const approvalNext = `case "$AGORA_ROUND" in
0) cp "$AGORA_INPUT_FILE" "$AGORA_NEEDS_INPUT_FILE" ;;
1) printf '{"question":"Ship the rename?","kind":"approval"}' > "$AGORA_NEEDS_INPUT_FILE" ;;
*) cp "$AGORA_INPUT_FILE" "$AGORA_OUTPUT_FILE" ;;
esac`

// A thread's trail shows a person only the questions of the routes they
// may see: carol (approvals only) sees the approval and its answer, and
// that a question was asked in round 0 on a route she may not see — not
// what, nor who answered it, nor how.
func TestTrailHidesOtherRoutes(t *testing.T) {
	s := start(t, options{})
	s.shell("two-routes", approvalNext)
	secret := "Which customer's data may we delete: acme or globex?"
	d, q0 := s.ask("two-routes", sentinel{Question: secret, Options: []string{"acme", "globex"}, Kind: "decision"}, 1)
	if st, body := s.apiCall(http.MethodPost, "/inbox/api/questions/"+q0+"/answer", map[string]string{"answer": "globex"}, map[string]string{"Authorization": "Bearer " + s.bearer}); st != http.StatusOK {
		t.Fatalf("answer round 0: %d %s", st, body)
	}
	q1 := s.nextRoundQuestion(d.ThreadID, 1)
	carol := s.apiLogin("carol", password)
	var det inbox.Detail
	testkit.Eventually(t, waitFor, "carol's view of the approval with its thread", func() bool {
		st, body := s.apiCall(http.MethodGet, "/inbox/api/questions/"+q1, nil, map[string]string{"Authorization": "Bearer " + carol})
		if st != http.StatusOK {
			t.Fatalf("carol reads the approval: %d %s", st, body)
		}
		if strings.Contains(body, secret) || strings.Contains(body, "globex") {
			t.Fatalf("carol's view of the approval shows the other route's question: %s", body)
		}
		det = inbox.Detail{}
		return json.Unmarshal([]byte(body), &det) == nil && len(det.Trail) >= 2
	})
	var hidden, asked int
	for _, st := range det.Trail {
		switch {
		case st.Hidden:
			hidden++
			if st.QuestionID != "" || st.Detail != "" || st.Who != "" || st.Route != "" || st.Round != 0 {
				t.Errorf("hidden step shows %+v", st)
			}
		case st.How == inbox.HowAsked && st.QuestionID == q1:
			asked++
		}
	}
	if hidden != 1 || asked != 1 {
		t.Errorf("carol's trail = %+v, want round 0 hidden and the approval asked", det.Trail)
	}
	// alice, on every route, sees both questions and the person's answer.
	st, body := s.apiCall(http.MethodGet, "/inbox/api/questions/"+q1, nil, map[string]string{"Authorization": "Bearer " + s.bearer})
	if st != http.StatusOK || !strings.Contains(body, secret) || !strings.Contains(body, `"how":"person"`) {
		t.Errorf("alice's view: %d %s", st, body)
	}
}
