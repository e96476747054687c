package inbox_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/answerers/inbox"
	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/seal"
)

// TestAnswerLinkBound: a link is sealed to what its question showed when
// it was minted. Asked anew reworded, the question refuses the link's
// answer (opening it says so; confirming sends nothing); a link minted
// for the question as it stands answers it, bound to what it shows.
func TestAnswerLinkBound(t *testing.T) {
	s := start(t, options{linkKey: seal.NewKey()})
	_, qid := s.ask("asker", sentinel{Question: "Delete the staging bucket?", Options: []string{"yes", "no"}, Kind: "decision"}, 1)
	stale := s.mintLinks(qid, "dana@example.com")

	js, err := jetstream.New(s.srv.Conn(t))
	if err != nil {
		t.Fatal(err)
	}
	now := natstest.RewordQuestion(t, js, qid, " And the production one.")
	s.waitQuestion(qid, func(q *inbox.Question) bool { return q.ShownDigest == now })

	status, body := linkCall(t, http.MethodGet, stale["yes"], nil)
	if status != http.StatusConflict {
		t.Errorf("GET of a link minted before the question changed: %d, want 409", status)
	}
	mustContain(t, "stale link page", body, "This question changed", "Nothing was sent")
	status, body = linkCall(t, http.MethodPost, stale["yes"], url.Values{})
	if status != http.StatusConflict {
		t.Errorf("POST of a link minted before the question changed: %d, want 409", status)
	}
	mustContain(t, "stale link answer", body, "This question changed", "Nothing was sent")
	if q, err := s.c.Question(t.Context(), qid); err != nil || q.Status != "asked" {
		t.Fatalf("after the stale link the question is %q (%v), want asked", q.Status, err)
	}

	fresh := s.mintLinks(qid, "dana@example.com")
	status, body = linkCall(t, http.MethodPost, fresh["no"], url.Values{})
	if status != http.StatusOK {
		t.Fatalf("POST of a link minted for the question as it stands: %d %s", status, body)
	}
	s.waitQuestion(qid, func(q *inbox.Question) bool { return q.Status == inbox.StatusAnswered })
	e, err := s.bucket(lifecycle.BucketQuestions).Get(t.Context(), qid)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(e.Value()), `"bound_digest":"`+now+`"`) {
		t.Errorf("the record does not say the link's answer was bound to %s: %s", now, e.Value())
	}
	if !strings.Contains(string(e.Value()), `"named_door":"link"`) {
		t.Errorf("the record does not say the answer came through a link: %s", e.Value())
	}
}
