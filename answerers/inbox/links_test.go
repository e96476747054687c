package inbox_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
	"golang.org/x/crypto/bcrypt"

	"github.com/agora-dispatch/agora/answerers/inbox"
	"github.com/agora-dispatch/agora/pkg/answerlink"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/seal"
)

// linkCall GETs or POSTs (a form) an answer link; it does not follow
// redirects and sends no cookie.
func linkCall(t *testing.T, method, link string, form url.Values) (int, string) {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequestWithContext(t.Context(), method, link, body)
	if err != nil {
		t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	return send(t, http.DefaultClient, req)
}

// mintLinks asks the inbox's API for the links of qid for audience.
func (s *system) mintLinks(qid, audience string) map[string]string {
	s.t.Helper()
	status, body := s.apiCall(http.MethodPost, "/inbox/api/questions/"+qid+"/links", inbox.LinksRequest{Audience: audience},
		map[string]string{"Authorization": "Bearer " + s.bearer})
	if status != http.StatusOK {
		s.t.Fatalf("mint links: %d %s", status, body)
	}
	var rep inbox.LinksReply
	if err := json.Unmarshal([]byte(body), &rep); err != nil {
		s.t.Fatal(err)
	}
	out := map[string]string{}
	for _, l := range rep.Links {
		if !strings.HasPrefix(l.URL, s.web.URL+"/inbox/a/") {
			s.t.Fatalf("link %q is not under %s", l.URL, s.web.URL)
		}
		key := l.Option
		if l.Open {
			key = "open"
		}
		out[key] = l.URL
	}
	return out
}

func TestAnswerLinks(t *testing.T) {
	s := start(t, options{linkKey: seal.NewKey()})
	d, qid := s.ask("asker", sentinel{Question: "Which function?", Options: []string{"A", "B"}, Kind: "decision"}, 1)
	links := s.mintLinks(qid, "dana@example.com")
	if len(links) != 2 || links["A"] == "" || links["B"] == "" {
		t.Fatalf("links = %v, want one per option", links)
	}

	// Opening a link (twice, as a mail scanner and then the person would)
	// answers nothing.
	for range 2 {
		status, body := linkCall(t, http.MethodGet, links["A"], nil)
		if status != http.StatusOK {
			t.Fatalf("GET link: %d %s", status, body)
		}
		mustContain(t, "link page", body, "Which function?", "dana@example.com", "Confirm: A", `method="post"`)
	}
	// A GET that answered would have done so before it returned: the
	// record in the bucket, not the inbox's view of it, says.
	if q, err := s.c.Question(t.Context(), qid); err != nil || q.Status != "asked" {
		t.Fatalf("the question is %q after GETs of its link (%v)", q.Status, err)
	}

	// Tampered and foreign links change nothing.
	tampered := links["A"][:len(links["A"])-3] + "AAA"
	other, _ := answerlink.New(seal.NewKey())
	foreign, _ := other.ForQuestion(s.web.URL, lifecycleQuestion(qid), "mallory", "inbox:mallory", time.Now().Add(time.Hour))
	for name, l := range map[string]string{"tampered": tampered, "another key": foreign[0].URL} {
		status, body := linkCall(t, http.MethodPost, l, url.Values{})
		if status != http.StatusNotFound {
			t.Errorf("%s link: %d, want 404", name, status)
		}
		mustContain(t, name+" page", body, "This link is not valid", "Nothing was sent")
	}

	status, body := linkCall(t, http.MethodPost, links["A"], url.Values{"comment": {"from my phone"}})
	if status != http.StatusOK {
		t.Fatalf("POST link: %d %s", status, body)
	}
	mustContain(t, "answered page", body, "Thank you", "dana@example.com")
	q := s.waitQuestion(qid, func(q *inbox.Question) bool { return q.Status == inbox.StatusAnswered })
	if q.Question.Answer != "A" || q.Question.AnsweredBy != "dana@example.com (link from inbox:alice)" || q.Question.Comment != "from my phone" {
		t.Errorf("answered %q by %q comment %q, want A by dana@example.com", q.Question.Answer, q.Question.AnsweredBy, q.Question.Comment)
	}
	out := s.finished(d.ThreadID)
	if string(out["answer"]) != `"A"` {
		t.Errorf("resumed with %s, want A", out["answer"])
	}

	// Single use, and the other option's link finds the question closed.
	status, body = linkCall(t, http.MethodPost, links["A"], url.Values{})
	if status != http.StatusConflict && status != http.StatusGone {
		t.Errorf("second POST: %d, want 409 or 410", status)
	}
	mustContain(t, "second POST page", body, "Nothing was sent")
	status, body = linkCall(t, http.MethodPost, links["B"], url.Values{})
	if status != http.StatusConflict {
		t.Errorf("other option after the answer: %d, want 409", status)
	}
	mustContain(t, "closed page", body, "already answered by dana@example.com")
}

// A link cannot be used twice even while its question still waits (the
// router's own once-only answer is not what stops it).
func TestAnswerLinkSingleUse(t *testing.T) {
	key := seal.NewKey()
	s := start(t, options{linkKey: key})
	_, qid := s.ask("asker", sentinel{Question: "Free text?"}, 1)
	links := s.mintLinks(qid, "erin")
	if len(links) != 1 || links["open"] == "" {
		t.Fatalf("links = %v, want one open link", links)
	}
	// An empty answer is refused and the link stays usable.
	status, body := linkCall(t, http.MethodPost, links["open"], url.Values{"answer": {"  "}})
	if status != http.StatusUnprocessableEntity {
		t.Fatalf("empty answer: %d %s", status, body)
	}
	mustContain(t, "empty answer page", body, "Write an answer first")
	status, body = linkCall(t, http.MethodPost, links["open"], url.Values{"answer": {"use B"}})
	if status != http.StatusOK {
		t.Fatalf("answer: %d %s", status, body)
	}
	q := s.waitQuestion(qid, func(q *inbox.Question) bool { return q.Status == inbox.StatusAnswered })
	if q.Question.Answer != "use B" || q.Question.AnsweredBy != "erin (link from inbox:alice)" {
		t.Errorf("answer %q by %q", q.Question.Answer, q.Question.AnsweredBy)
	}
	status, body = linkCall(t, http.MethodPost, links["open"], url.Values{"answer": {"again"}})
	if status != http.StatusConflict && status != http.StatusGone {
		t.Errorf("reuse: %d, want 409/410", status)
	}
	mustContain(t, "reuse page", body, "Nothing was sent")
}

func TestAnswerLinkExpired(t *testing.T) {
	key := seal.NewKey()
	s := start(t, options{linkKey: key})
	_, qid := s.ask("asker", sentinel{Question: "Soon?", Options: []string{"yes", "no"}, Kind: "decision"}, 1)
	m, err := answerlink.New(key)
	if err != nil {
		t.Fatal(err)
	}
	links, err := m.ForQuestion(s.web.URL+"/inbox", lifecycleQuestion(qid), "frank", "", time.Now().Add(1100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	for _, method := range []string{http.MethodGet, http.MethodPost} {
		status, body := linkCall(t, method, links[0].URL, url.Values{})
		if status != http.StatusGone {
			t.Errorf("%s expired link: %d, want 410", method, status)
		}
		mustContain(t, "expired page", body, "This link has expired", "Nothing was sent")
	}
	if q := s.waitQuestion(qid, func(*inbox.Question) bool { return true }); !q.Question.Pending() {
		t.Errorf("question %s after an expired link", q.Question.Status)
	}
}

func TestAnswerLinkWithdrawn(t *testing.T) {
	s := start(t, options{linkKey: seal.NewKey()})
	d, qid := s.ask("asker", sentinel{Question: "Approve?", Kind: "approval"}, 1)
	links := s.mintLinks(qid, "gina")
	if len(links) != 2 || links["approve"] == "" || links["reject"] == "" {
		t.Fatalf("approval links = %v", links)
	}
	if _, err := s.c.CancelThread(t.Context(), d.ThreadID, client.CancelBy("alice", "not needed")); err != nil {
		t.Fatal(err)
	}
	s.waitQuestion(qid, func(q *inbox.Question) bool { return q.Status == inbox.StatusWithdrawn })
	status, body := linkCall(t, http.MethodPost, links["approve"], url.Values{})
	if status != http.StatusConflict {
		t.Errorf("withdrawn: %d, want 409", status)
	}
	mustContain(t, "withdrawn page", body, "It was withdrawn", "Nothing was sent")
	// Links are not minted for a closed question.
	st, body := s.apiCall(http.MethodPost, "/inbox/api/questions/"+qid+"/links", inbox.LinksRequest{Audience: "gina"},
		map[string]string{"Authorization": "Bearer " + s.bearer})
	if st != http.StatusConflict {
		t.Errorf("mint for a withdrawn question: %d %s, want 409", st, body)
	}
}

// An approval link carries the decision.
func TestAnswerLinkApproval(t *testing.T) {
	s := start(t, options{linkKey: seal.NewKey()})
	d, qid := s.ask("asker", sentinel{Question: "Deploy?", Kind: "approval"}, 1)
	links := s.mintLinks(qid, "hana")
	status, body := linkCall(t, http.MethodGet, links["reject"], nil)
	if status != http.StatusOK {
		t.Fatalf("GET: %d %s", status, body)
	}
	mustContain(t, "reject page", body, "Confirm: reject", `name="comment"`)
	if status, body = linkCall(t, http.MethodPost, links["reject"], url.Values{"comment": {"not on a Friday"}}); status != http.StatusOK {
		t.Fatalf("POST: %d %s", status, body)
	}
	q := s.waitQuestion(qid, func(q *inbox.Question) bool { return q.Status == inbox.StatusAnswered })
	if q.Question.Decision != "reject" || q.Question.AnsweredBy != "hana (link from inbox:alice)" {
		t.Errorf("decision %q by %q", q.Question.Decision, q.Question.AnsweredBy)
	}
	s.finished(d.ThreadID)
}

func TestMintLinksRefusals(t *testing.T) {
	s := start(t, options{linkKey: seal.NewKey()})
	_, qid := s.ask("asker", sentinel{Question: "Which?", Options: []string{"A"}, Kind: "decision"}, 1)
	auth := map[string]string{"Authorization": "Bearer " + s.bearer}
	for name, tc := range map[string]struct {
		body   any
		status int
		want   string
	}{
		"no audience":   {inbox.LinksRequest{}, http.StatusUnprocessableEntity, "audience is empty"},
		"bad ttl":       {inbox.LinksRequest{Audience: "x", TTL: "forever"}, http.StatusUnprocessableEntity, "ttl"},
		"ttl too long":  {inbox.LinksRequest{Audience: "x", TTL: "1000h"}, http.StatusUnprocessableEntity, "ttl"},
		"unknown field": {map[string]string{"audiance": "x"}, http.StatusUnprocessableEntity, "audiance"},
	} {
		st, body := s.apiCall(http.MethodPost, "/inbox/api/questions/"+qid+"/links", tc.body, auth)
		if st != tc.status || !strings.Contains(body, tc.want) {
			t.Errorf("%s: %d %s, want %d naming %q", name, st, body, tc.status, tc.want)
		}
	}
	if st, _ := s.apiCall(http.MethodPost, "/inbox/api/questions/"+qid+"/links", inbox.LinksRequest{Audience: "x"}, nil); st != http.StatusUnauthorized {
		t.Errorf("without a sign-in: %d, want 401", st)
	}
	// carol may answer approvals only.
	carol := s.apiLogin("carol", password)
	if st, _ := s.apiCall(http.MethodPost, "/inbox/api/questions/"+qid+"/links", inbox.LinksRequest{Audience: "x"},
		map[string]string{"Authorization": "Bearer " + carol}); st != http.StatusForbidden {
		t.Errorf("carol on route human: %d, want 403", st)
	}
}

// Without a link key the inbox serves no links.
func TestAnswerLinksOff(t *testing.T) {
	s := start(t, options{noWorker: true})
	m, _ := answerlink.New(seal.NewKey())
	links, _ := m.ForQuestion(s.web.URL, lifecycleQuestion("q-1"), "x", "", time.Now().Add(time.Hour))
	status, body := linkCall(t, http.MethodGet, links[0].URL, nil)
	if status != http.StatusNotFound {
		t.Errorf("GET: %d", status)
	}
	mustContain(t, "links off page", body, "Answer links are off")
}

// A link is sealed to its question's route and its minter: it answers
// while the question is on the route it was made for and its minter may
// answer there, and records who minted it for whom. A question moved to
// another route (declined to a fallback) and a minter removed from the
// users file make its links answer nothing.
func TestAnswerLinksSealedToRouteAndMinter(t *testing.T) {
	s := start(t, options{linkKey: seal.NewKey()})

	t.Run("recorded as minted by whom for whom", func(t *testing.T) {
		_, qid := s.ask("asker", sentinel{Question: "Ship it?", Options: []string{"yes", "no"}, Kind: "decision"}, 1)
		status, body := s.apiCall(http.MethodPost, "/inbox/api/questions/"+qid+"/links", inbox.LinksRequest{Audience: "bob@corp (teamB lead)"},
			map[string]string{"Authorization": "Bearer " + s.bearer})
		var rep inbox.LinksReply
		if status != http.StatusOK || json.Unmarshal([]byte(body), &rep) != nil {
			t.Fatalf("mint: %d %s", status, body)
		}
		want := "bob@corp (teamB lead) (link from inbox:alice)"
		if rep.MintedBy != "inbox:alice" || rep.AnsweredBy != want || rep.Route != "human" {
			t.Errorf("links reply: %+v", rep)
		}
		for _, l := range rep.Links {
			if l.Option == "yes" {
				if st, body := linkCall(t, http.MethodPost, l.URL, url.Values{}); st != http.StatusOK {
					t.Fatalf("answer: %d %s", st, body)
				}
			}
		}
		if q := s.waitQuestion(qid, func(q *inbox.Question) bool { return q.Status == inbox.StatusAnswered }); q.Question.AnsweredBy != want {
			t.Errorf("answered_by = %q, want %q", q.Question.AnsweredBy, want)
		}
	})

	t.Run("the question moved to another route", func(t *testing.T) {
		_, qid := s.ask("ops-asker", sentinel{Question: "Restart the cluster?", Options: []string{"yes", "no"}, Kind: "decision"}, 1)
		links := s.mintLinks(qid, "dana@example.com")
		if _, err := s.c.Decline(t.Context(), qid, "ops-bot", "not mine", client.AnswerVia("ops")); err != nil {
			t.Fatal(err)
		}
		s.waitQuestion(qid, func(q *inbox.Question) bool { return q.Route == "human" })
		for _, method := range []string{http.MethodGet, http.MethodPost} {
			st, body := linkCall(t, method, links["yes"], url.Values{})
			if st != http.StatusConflict {
				t.Errorf("%s of a link made on ops after the move: %d, want 409", method, st)
			}
			mustContain(t, "moved page", body, "This question moved", "route ops", "route human", "Nothing was sent")
		}
		if q, err := s.c.Question(t.Context(), qid); err != nil || q.Status != "asked" {
			t.Errorf("the question after the moved link: %q %v, want asked", q.Status, err)
		}
	})

	t.Run("its minter may no longer answer", func(t *testing.T) {
		_, qid := s.ask("asker", sentinel{Question: "Tag the release?", Options: []string{"yes", "no"}, Kind: "decision"}, 1)
		links := s.mintLinks(qid, "erin@example.com") // minted by alice
		h, _ := bcrypt.GenerateFromPassword([]byte(password), bcrypt.MinCost)
		b, _ := yaml.Marshal([]inbox.User{{Name: "alice", Bcrypt: string(h), Routes: []string{"approvals"}}, {Name: "bob", Bcrypt: string(h)}})
		if err := os.WriteFile(s.cfg.UsersFile, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := s.inbox.ReloadUsers(); err != nil {
			t.Fatal(err)
		}
		st, body := linkCall(t, http.MethodPost, links["yes"], url.Values{})
		if st != http.StatusForbidden {
			t.Errorf("a link of a minter who may no longer answer: %d, want 403", st)
		}
		mustContain(t, "revoked page", body, "This link no longer answers", "alice", "route human", "Nothing was sent")
		if q, err := s.c.Question(t.Context(), qid); err != nil || q.Status != "asked" {
			t.Errorf("the question after the revoked link: %q %v, want asked", q.Status, err)
		}
	})
}
