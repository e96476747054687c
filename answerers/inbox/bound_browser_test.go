package inbox_test

import (
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/answerers/inbox"
	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// TestBrowserBoundAnswer: in real Chromium, a person opens an approval,
// the question is asked anew reworded while the page still shows the old
// words, and their click is refused as changed (nothing answered, the
// page shows the question as it stands and says to look again); the
// click on the page as it stands answers, bound to what it shows.
func TestBrowserBoundAnswer(t *testing.T) {
	s := start(t, options{dev: true})
	c := newChrome(t)
	_, qid := s.ask("asker", sentinel{Question: "Deploy build 41 to staging?", Kind: "approval"}, 1)
	c.do("sign in and open the question",
		chromedp.Navigate(inbox.LoginLink(s.web.URL, s.inbox.DevToken())),
		chromedp.WaitVisible(chromedp.CSS(`#pending`)),
		chromedp.Navigate(s.web.URL+"/inbox/questions/"+qid),
		chromedp.WaitVisible(chromedp.CSS(`#answer-form`)),
	)
	shownBefore := c.eval(`document.querySelector('#answer-form input[name="shown_digest"]').value`)
	if !strings.HasPrefix(shownBefore, "sha256:") {
		t.Fatalf("the answer form carries shown_digest %q", shownBefore)
	}

	js, err := jetstream.New(s.srv.Conn(t))
	if err != nil {
		t.Fatal(err)
	}
	now := natstest.RewordQuestion(t, js, qid, " And to PRODUCTION.")
	s.waitQuestion(qid, func(q *inbox.Question) bool { return q.ShownDigest == now })

	c.do("approve what the page showed",
		chromedp.Click(chromedp.CSS(`#answer-form button[value="approve"]`)),
		chromedp.WaitVisible(chromedp.CSS(`div.notice[role="status"]`)),
	)
	if notice := c.text(`div.notice[role="status"]`); !strings.Contains(notice, "changed") || !strings.Contains(notice, "Look at it again") {
		t.Errorf("refusal notice %q", notice)
	}
	if q := s.waitQuestion(qid, func(*inbox.Question) bool { return true }).Question; q.Status != "asked" {
		t.Fatalf("after the stale approval the question is %s, want still asked", q.Status)
	}
	if text := c.text(`h1`); !strings.Contains(text, "PRODUCTION") {
		t.Errorf("the page after the refusal shows %q, want the question as it stands", text)
	}
	if got := c.eval(`document.querySelector('#answer-form input[name="shown_digest"]').value`); got != now {
		t.Fatalf("the form after the refusal carries %q, want the question's %q", got, now)
	}

	c.do("approve what the page shows now",
		chromedp.Click(chromedp.CSS(`#answer-form button[value="approve"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#outcome`)),
	)
	rec := s.waitQuestion(qid, func(q *inbox.Question) bool { return q.Status == inbox.StatusAnswered })
	if rec.Question.Decision != "approve" {
		t.Errorf("answered %+v", rec.Question)
	}
	kv := s.bucket(lifecycle.BucketQuestions)
	e, err := kv.Get(t.Context(), qid)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(e.Value()), `"bound_digest":"`+now+`"`) {
		t.Errorf("the record does not say the answer was bound to %s: %s", now, e.Value())
	}
}
