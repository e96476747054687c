package client_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// testOnlyAnswerResponder is a TEST-ONLY stand-in for the router's
// agora.api.answer endpoint (services/router does not exist yet). It
// answers from a table keyed by question id, so the client's mapping of
// every reply can be checked. It validates nothing.
func testOnlyAnswerResponder(t *testing.T, nc *nats.Conn, replies map[string]func(lifecycle.Answer, micro.Request)) {
	t.Helper()
	svc, err := micro.AddService(nc, micro.Config{Name: "agora-test-only-router", Version: "0.0.0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop() })
	err = svc.AddGroup("agora.api").AddEndpoint("answer", micro.HandlerFunc(func(r micro.Request) {
		var a lifecycle.Answer
		if err := json.Unmarshal(r.Data(), &a); err != nil {
			_ = r.Error("400", "bad answer", nil)
			return
		}
		f, ok := replies[a.QuestionID]
		if !ok {
			_ = r.RespondJSON(client.AnswerReply{Status: client.AnswerNotFound, Reason: "no such question"})
			return
		}
		f(a, r)
	}))
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

func TestAnswer(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Conn(t)
	c, err := client.New(nc, client.WithTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Answer(t.Context(), "q-x", lifecycle.Answer{Answer: "A"}); !errors.Is(err, client.ErrUnavailable) {
		t.Errorf("no router: %v", err)
	}

	at := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	var received lifecycle.Answer
	reply := func(rep client.AnswerReply) func(lifecycle.Answer, micro.Request) {
		return func(a lifecycle.Answer, r micro.Request) {
			received = a
			_ = r.RespondJSON(rep)
		}
	}
	testOnlyAnswerResponder(t, srv.Conn(t), map[string]func(lifecycle.Answer, micro.Request){
		"q-ok":    reply(client.AnswerReply{Status: client.AnswerAccepted, AnsweredBy: "alice", AnsweredAt: &at}),
		"q-taken": reply(client.AnswerReply{Status: client.AnswerAlreadyAnswered, AnsweredBy: "bob", AnsweredAt: &at}),
		"q-bad":   reply(client.AnswerReply{Status: client.AnswerInvalid, Reason: `"C" is not one of A, B`}),
		"q-busy":  reply(client.AnswerReply{Status: client.AnswerRetry}),
		"q-odd":   reply(client.AnswerReply{Status: "maybe"}),
		"q-err":   func(_ lifecycle.Answer, r micro.Request) { _ = r.Error("404", "Not found: no question", nil) },
	})

	got, err := c.Answer(t.Context(), "q-ok", lifecycle.Answer{Answer: "B", AnsweredBy: "alice", Decision: "approve"})
	if err != nil || got.Status != client.AnswerAccepted || got.AnsweredBy != "alice" || !got.AnsweredAt.Equal(at) {
		t.Errorf("accepted: %+v %v", got, err)
	}
	if received.QuestionID != "q-ok" || received.Answer != "B" || received.Decision != "approve" {
		t.Errorf("the router received %+v", received)
	}

	cases := []struct {
		id     string
		want   error
		status client.AnswerStatus
	}{
		{"q-taken", client.ErrAlreadyAnswered, client.AnswerAlreadyAnswered},
		{"q-bad", client.ErrInvalidAnswer, client.AnswerInvalid},
		{"q-missing", client.ErrNotFound, client.AnswerNotFound},
		{"q-busy", client.ErrUnavailable, client.AnswerRetry},
		{"q-err", client.ErrNotFound, client.AnswerNotFound},
	}
	for _, tc := range cases {
		t.Run(tc.id, func(t *testing.T) {
			_, err := c.Answer(t.Context(), tc.id, lifecycle.Answer{Answer: "C"})
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			var ae *client.AnswerError
			if !errors.As(err, &ae) || ae.Reply.Status != tc.status || ae.QuestionID != tc.id {
				t.Errorf("answer error: %+v", ae)
			}
		})
	}
	var ae *client.AnswerError
	_, err = c.Answer(t.Context(), "q-taken", lifecycle.Answer{Answer: "C"})
	if errors.As(err, &ae); ae == nil || ae.Reply.AnsweredBy != "bob" {
		t.Errorf("already answered names the winner: %v", err)
	}
	if _, err := c.Answer(t.Context(), "q-odd", lifecycle.Answer{Answer: "C"}); err == nil {
		t.Error("an unknown reply status is not an error")
	}
	if _, err := c.Answer(t.Context(), "q-ok", lifecycle.Answer{QuestionID: "q-other", Answer: "C"}); err == nil {
		t.Error("an answer naming another question was sent")
	}
	if _, err := c.Answer(t.Context(), "bad id", lifecycle.Answer{Answer: "C"}); err == nil {
		t.Error("an invalid question id was sent")
	}
}

// TestAnswerVia: AnswerVia sends the answer to the route's endpoint,
// agora.api.answer.<route>, naming the route in the body.
func TestAnswerVia(t *testing.T) {
	srv := natstest.Start(t)
	c := srv.Client(t, client.WithTimeout(2*time.Second))
	type call struct {
		subject string
		answer  lifecycle.Answer
	}
	calls := make(chan call, 4)
	nc := srv.Conn(t)
	sub, err := nc.Subscribe(lifecycle.APIAnswer+".>", func(m *nats.Msg) {
		var a lifecycle.Answer
		_ = json.Unmarshal(m.Data, &a)
		calls <- call{m.Subject, a}
		b, _ := json.Marshal(client.AnswerReply{Status: client.AnswerAccepted, AnsweredBy: a.AnsweredBy})
		_ = m.Respond(b)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	if _, err := c.Answer(t.Context(), "q-1", lifecycle.Answer{Answer: "B", AnsweredBy: "alice"}, client.AnswerVia("human")); err != nil {
		t.Fatal(err)
	}
	got := <-calls
	if got.subject != "agora.api.answer.human" || got.answer.Route != "human" || got.answer.QuestionID != "q-1" {
		t.Errorf("sent %+v", got)
	}
	for name, tc := range map[string]struct {
		a     lifecycle.Answer
		route string
	}{
		"route with a dot":   {lifecycle.Answer{Answer: "B"}, "a.b"},
		"wildcard route":     {lifecycle.Answer{Answer: "B"}, "*"},
		"answer names route": {lifecycle.Answer{Answer: "B", Route: "data"}, "human"},
	} {
		if _, err := c.Answer(t.Context(), "q-1", tc.a, client.AnswerVia(tc.route)); err == nil {
			t.Errorf("%s: sent", name)
		}
	}
	select {
	case got := <-calls:
		t.Errorf("a refused answer reached %s", got.subject)
	default:
	}
}
