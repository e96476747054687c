package genclient_test

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"path"
	"strings"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/schema/openapi/genclient"
)

func ptr[T any](v T) *T { return &v }

// sse follows GET /v1/events through the generated client and sends each
// frame's event type (the CloudEvent type) on the channel it returns.
func sse(t *testing.T, s *stack, params genclient.EventsParams) <-chan string {
	t.Helper()
	resp, err := s.api.Events(t.Context(), &params)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("events: %d %s", resp.StatusCode, b)
	}
	t.Cleanup(func() { resp.Body.Close() })
	types := make(chan string, 64)
	go func() {
		defer close(types)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 0, 1<<16), 1<<22)
		for sc.Scan() {
			if typ, ok := strings.CutPrefix(sc.Text(), "event: "); ok {
				select {
				case types <- typ:
				case <-t.Context().Done():
					return
				}
			}
		}
	}()
	return types
}

// awaitEvent reads types until want arrives.
func awaitEvent(t *testing.T, types <-chan string, want string) {
	t.Helper()
	for typ := range types {
		if typ == want {
			return
		}
	}
	t.Fatalf("the event stream ended before %s", want)
}

// pendingQuestion waits until the inbox's JSON API lists a pending
// question of thread, and returns it.
func pendingQuestion(t *testing.T, s *stack, thread string) genclient.InboxQuestion {
	t.Helper()
	var q genclient.InboxQuestion
	testkit.Eventually(t, waitFor, "a pending question of thread "+thread, func() bool {
		r, err := s.inbox.ListQuestionsWithResponse(t.Context(), &genclient.ListQuestionsParams{Thread: &thread})
		if err != nil || r.JSON200 == nil {
			t.Fatalf("list questions: %v %v", err, r)
		}
		if len(r.JSON200.Questions) == 0 {
			return false
		}
		q = r.JSON200.Questions[0]
		return true
	})
	return q
}

// A program drives a whole thread through the client generated from
// schema/openapi/agora.json: it dispatches a sub-agent that asks, finds
// the question through the inbox's JSON API, answers it, answers the
// next round's question through a signed answer link, and reads the
// finished thread, its result and its artifact. Every exchange is checked
// against the document by the contract; then the documented refusals are
// provoked, and every operation of the document must have been reached.
func TestGeneratedClientAgainstAgora(t *testing.T) {
	s := start(t)
	ctx := t.Context()
	var thread, lastRound string

	threadOK := t.Run("ask-answer-finish", func(t *testing.T) {
		// Dispatch: a sub-agent that asks in rounds 0 and 1.
		input := map[string]any{"question": "Ship the release?", "options": []any{"yes", "no"}, "kind": "decision"}
		d, err := s.api.DispatchWithResponse(ctx, nil, genclient.DispatchRequested{
			DispatchId: ptr("gen-thread-1"), Subagent: "asker", Input: &input, Env: &map[string]string{"ASK_ROUNDS": "2"},
		})
		if err != nil || d.JSON201 == nil {
			t.Fatalf("dispatch: %v %d %s", err, d.StatusCode(), d.Body)
		}
		thread = d.JSON201.ThreadId
		t.Logf("dispatched %s (thread %s): %s", d.JSON201.DispatchId, thread, d.JSON201.Status)
		events := sse(t, s, genclient.EventsParams{Thread: &thread})

		// Round 0 asks; the inbox lists the question.
		awaitEvent(t, events, "dev.agora.dispatch.needs_input")
		q := pendingQuestion(t, s, thread)
		t.Logf("asked %s: %q %v (round %d)", q.QuestionId, q.Question, *q.Options, q.Round)
		g, err := s.inbox.GetQuestionWithResponse(ctx, q.QuestionId)
		if err != nil || g.JSON200 == nil {
			t.Fatalf("get question: %v %d %s", err, g.StatusCode(), g.Body)
		}
		if g.JSON200.Question.Question != "Ship the release?" || g.JSON200.Thread == nil || g.JSON200.Thread.ThreadId != thread {
			t.Errorf("question detail: %s", g.Body)
		}

		// Answer it through the JSON API.
		a, err := s.inbox.AnswerQuestionWithResponse(ctx, q.QuestionId, genclient.AnswerRequest{Answer: ptr("yes"), Comment: ptr("ship it")})
		if err != nil || a.JSON200 == nil || a.JSON200.Status != genclient.AnswerReplyStatusAccepted {
			t.Fatalf("answer: %v %d %s", err, a.StatusCode(), a.Body)
		}
		t.Logf("answered %s: yes → %s by %s", q.QuestionId, a.JSON200.Status, *a.JSON200.AnsweredBy)
		again, err := s.inbox.AnswerQuestionWithResponse(ctx, q.QuestionId, genclient.AnswerRequest{Answer: ptr("no")})
		if err != nil || again.JSON409 == nil || again.JSON409.Status != genclient.AnswerReplyStatusAlreadyAnswered {
			t.Errorf("a second answer: %v %d %s, want 409 already_answered", err, again.StatusCode(), again.Body)
		}

		// Round 1 asks again; answer it through a signed answer link.
		awaitEvent(t, events, "dev.agora.dispatch.needs_input")
		q2 := pendingQuestion(t, s, thread)
		if q2.QuestionId == q.QuestionId || q2.Round != 1 {
			t.Fatalf("second question %s round %d", q2.QuestionId, q2.Round)
		}
		l, err := s.inbox.CreateAnswerLinksWithResponse(ctx, q2.QuestionId, genclient.LinksRequest{Audience: "dana@example.com", Ttl: ptr("1h")})
		if err != nil || l.JSON200 == nil {
			t.Fatalf("links: %v %d %s", err, l.StatusCode(), l.Body)
		}
		var yes string
		for _, link := range l.JSON200.Links {
			if link.Option != nil && *link.Option == "yes" {
				yes = link.Url
			}
		}
		u, err := url.Parse(yes)
		if err != nil || yes == "" {
			t.Fatalf("no link for yes in %s", l.Body)
		}
		token := path.Base(u.Path)
		page, err := s.inbox.GetAnswerLinkWithResponse(ctx, token)
		if err != nil || page.StatusCode() != http.StatusOK || !strings.Contains(string(page.Body), "Ship the release?") {
			t.Fatalf("link page: %v %d", err, page.StatusCode())
		}
		used, err := s.inbox.UseAnswerLinkWithFormdataBodyWithResponse(ctx, token, genclient.LinkForm{Comment: ptr("from the link")})
		if err != nil || used.StatusCode() != http.StatusOK {
			t.Fatalf("answer through the link: %v %d %s", err, used.StatusCode(), used.Body)
		}
		t.Logf("asked %s in round %d; answered yes through a link as dana@example.com", q2.QuestionId, q2.Round)
		reused, err := s.inbox.UseAnswerLinkWithFormdataBodyWithResponse(ctx, token, genclient.LinkForm{})
		if err != nil || reused.StatusCode() != http.StatusConflict {
			t.Errorf("a link used again: %v %d, want 409 (its question is closed)", err, reused.StatusCode())
		}

		// Round 2 finishes.
		awaitEvent(t, events, "dev.agora.dispatch.finished")
		// The records follow the events (the dispatcher's projection):
		// the thread reads finished once it has caught up.
		var th *genclient.GetThreadResponse
		testkit.Eventually(t, 10*time.Second, "the thread record to read finished", func() bool {
			th, err = s.api.GetThreadWithResponse(ctx, thread)
			if err != nil || th.JSON200 == nil {
				t.Fatalf("thread: %v %d %s", err, th.StatusCode(), th.Body)
			}
			return th.JSON200.Status == genclient.KindFinished
		})
		if th.JSON200.Status != genclient.KindFinished || len(th.JSON200.Rounds) != 3 {
			t.Fatalf("thread %s: %s with %d rounds, want finished with 3", thread, th.JSON200.Status, len(th.JSON200.Rounds))
		}
		lastRound = th.JSON200.Rounds[2].DispatchId
		rec, err := s.api.GetDispatchWithResponse(ctx, lastRound)
		if err != nil || rec.JSON200 == nil || rec.JSON200.Result == nil {
			t.Fatalf("last round: %v %d %s", err, rec.StatusCode(), rec.Body)
		}
		out, _ := json.Marshal(rec.JSON200.Result.Output)
		if !strings.Contains(string(out), `"answer"`) || !strings.Contains(string(out), `yes`) {
			t.Errorf("the last round's output carries no answer: %s", out)
		}
		t.Logf("finished: thread %s, %d rounds, last %s output %s", thread, len(th.JSON200.Rounds), lastRound, out)

		// The artifact the last round left, listed and read (whole and a
		// range), its name holding a slash.
		arts, err := s.api.ListArtifactsWithResponse(ctx, lastRound)
		if err != nil || arts.JSON200 == nil || len(arts.JSON200.Artifacts) != 1 || arts.JSON200.Artifacts[0].Name != "notes/answer.json" {
			t.Fatalf("artifacts: %v %d %s", err, arts.StatusCode(), arts.Body)
		}
		art, err := s.api.GetArtifactWithResponse(ctx, lastRound, "notes/answer.json", nil)
		if err != nil || art.StatusCode() != http.StatusOK || !json.Valid(art.Body) || len(art.Body) != arts.JSON200.Artifacts[0].Size {
			t.Fatalf("artifact: %v %d %s", err, art.StatusCode(), art.Body)
		}
		part, err := s.api.GetArtifactWithResponse(ctx, lastRound, "notes/answer.json", &genclient.GetArtifactParams{Range: ptr("bytes=0-0")})
		if err != nil || part.StatusCode() != http.StatusPartialContent || string(part.Body) != "{" {
			t.Errorf("artifact range: %v %d %q", err, part.StatusCode(), part.Body)
		}

		// Both questions are answered now.
		answered := genclient.ListQuestionsParamsStatus("answered")
		list, err := s.inbox.ListQuestionsWithResponse(ctx, &genclient.ListQuestionsParams{Status: &answered, Thread: &thread})
		if err != nil || list.JSON200 == nil || len(list.JSON200.Questions) != 2 {
			t.Fatalf("answered questions: %v %d %s", err, list.StatusCode(), list.Body)
		}
		for _, q := range list.JSON200.Questions {
			t.Logf("closed %s: %q answered %q by %s", q.QuestionId, q.Question, *q.Answer, *q.AnsweredBy)
		}
	})

	refusalsOK := t.Run("documented-refusals", func(t *testing.T) { refusals(t, s, thread, lastRound) })

	t.Run("every-operation-checked", func(t *testing.T) {
		if !threadOK || !refusalsOK {
			t.Skip("needs the subtests before it")
		}
		if _, err := s.api.GetOpenAPIWithResponse(ctx); err != nil {
			t.Fatal(err)
		}
		if r, err := s.api.GetSchemaWithResponse(ctx, "question.json"); err != nil || r.StatusCode() != http.StatusOK {
			t.Fatalf("schema: %v %d", err, r.StatusCode())
		}
		if r, err := s.api.GetSchemaWithResponse(ctx, "nope.json"); err != nil || r.ApplicationproblemJSON404 == nil {
			t.Fatalf("unknown schema: %v %d", err, r.StatusCode())
		}
		if missing := s.contract.unseen(); len(missing) > 0 {
			t.Errorf("operations of the document no exchange reached: %v", missing)
		}
		// The refusals a program meets are real: each one the document
		// lists was drawn from its operation.
		if missing := s.contract.unprovoked(304, 404, 409, 410, 413, 415, 416, 422); len(missing) > 0 {
			t.Errorf("documented statuses no exchange drew: %v", missing)
		}
	})
}
