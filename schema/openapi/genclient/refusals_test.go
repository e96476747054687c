package genclient_test

import (
	"bytes"
	"net/http"
	"net/url"
	"path"
	"strings"
	"testing"

	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/schema/openapi/genclient"
)

// status is what every generated response has.
type status interface{ StatusCode() int }

// expect fails unless r answered want (the contract has checked the rest:
// that want is documented for the operation, and the body).
func expect(t *testing.T, what string, r status, err error, want int) {
	t.Helper()
	switch {
	case err != nil:
		t.Errorf("%s: %v", what, err)
	case r.StatusCode() != want:
		t.Errorf("%s: %d, want %d", what, r.StatusCode(), want)
	}
}

// refusals provokes the refusals the document lists, through the
// generated client, each checked by the contract. thread and lastRound are
// the finished thread of the ask-answer-finish subtest and its last round.
func refusals(t *testing.T, s *stack, thread, lastRound string) {
	ctx := t.Context()
	bad := wrongOnPurpose(ctx)
	if thread == "" || lastRound == "" {
		t.Skip("needs the finished thread of ask-answer-finish")
	}

	t.Run("dispatcher", func(t *testing.T) {
		r, err := s.api.DispatchWithBodyWithResponse(bad, nil, "text/plain", strings.NewReader(`{"subagent":"asker"}`))
		expect(t, "dispatch as text/plain", r, err, http.StatusUnsupportedMediaType)
		if r != nil && (r.ApplicationproblemJSON415 == nil || r.ApplicationproblemJSON415.Detail == nil || !strings.Contains(*r.ApplicationproblemJSON415.Detail, "application/json")) {
			t.Errorf("the 415 does not name application/json: %s", r.Body)
		}
		big := `{"subagent":"asker","input":{"x":"` + strings.Repeat("a", 1<<20) + `"}}`
		r, err = s.api.DispatchWithBodyWithResponse(bad, nil, "application/json", strings.NewReader(big))
		expect(t, "a body past 1 MiB", r, err, http.StatusRequestEntityTooLarge)
		r, err = s.api.DispatchWithBodyWithResponse(bad, nil, "application/json", strings.NewReader(`{"subagent":"asker","inptu":{}}`))
		expect(t, "an unknown member", r, err, http.StatusUnprocessableEntity)
		if r != nil && !bytes.Contains(r.Body, []byte(`"field":"inptu"`)) {
			t.Errorf("the 422 does not name inptu: %s", r.Body)
		}
		r, err = s.api.DispatchWithResponse(ctx, nil, genclient.DispatchRequested{DispatchId: ptr(thread), Subagent: "sleeper"})
		expect(t, "a dispatch_id again with another request", r, err, http.StatusConflict)
		r, err = s.client("").DispatchWithResponse(ctx, nil, genclient.DispatchRequested{Subagent: "sleeper"})
		expect(t, "no token", r, err, http.StatusUnauthorized)

		// A running dispatch: the same request again, its artifacts
		// before it ends, then its cancel.
		req := genclient.DispatchRequested{DispatchId: ptr("gen-sleep-1"), Subagent: "sleeper"}
		r, err = s.api.DispatchWithResponse(ctx, nil, req)
		expect(t, "dispatch a sleeper", r, err, http.StatusCreated)
		r, err = s.api.DispatchWithResponse(ctx, nil, req)
		expect(t, "the same dispatch again", r, err, http.StatusOK)
		la, err := s.api.ListArtifactsWithResponse(ctx, "gen-sleep-1")
		expect(t, "artifacts before the end", la, err, http.StatusConflict)
		ga, err := s.api.GetArtifactWithResponse(ctx, "gen-sleep-1", "x.txt", nil)
		expect(t, "an artifact before the end", ga, err, http.StatusConflict)
		cb, err := s.api.CancelDispatchWithBodyWithResponse(bad, "gen-sleep-1", "application/json", strings.NewReader(`{"by":"gen","reasn":"typo"}`))
		expect(t, "a cancel with an unknown member", cb, err, http.StatusUnprocessableEntity)
		c, err := s.api.CancelDispatchWithResponse(ctx, "gen-sleep-1", genclient.CancelBody{By: ptr("gen"), Reason: ptr("test over")})
		expect(t, "cancel", c, err, http.StatusOK)
		if c != nil && c.JSON200 != nil && c.JSON200.Outcome == nil {
			t.Errorf("a cancel's record has no outcome: %s", c.Body)
		}
		c, err = s.api.CancelDispatchWithResponse(ctx, "gen-nope", genclient.CancelBody{})
		expect(t, "cancel an unknown dispatch", c, err, http.StatusNotFound)
		ct, err := s.api.CancelThreadWithResponse(ctx, "gen-nope", genclient.CancelBody{})
		expect(t, "cancel an unknown thread", ct, err, http.StatusNotFound)

		ctb, err := s.api.CancelThreadWithBodyWithResponse(bad, "gen-sleep-1", "application/json", strings.NewReader(`{"by":"gen","resaon":"typo"}`))
		expect(t, "a thread cancel with an unknown member", ctb, err, http.StatusUnprocessableEntity)
		for name, call := range map[string]func() (status, error){
			"dispatch":  func() (status, error) { return s.api.GetDispatchWithResponse(bad, "a.b") },
			"thread":    func() (status, error) { return s.api.GetThreadWithResponse(bad, "a.b") },
			"artifacts": func() (status, error) { return s.api.ListArtifactsWithResponse(bad, "a.b") },
			"artifact":  func() (status, error) { return s.api.GetArtifactWithResponse(bad, "a.b", "x.txt", nil) },
		} {
			r, err := call()
			expect(t, "an invalid id ("+name+")", r, err, http.StatusUnprocessableEntity)
		}
		g, err := s.api.GetDispatchWithResponse(ctx, "gen-nope")
		expect(t, "an unknown dispatch", g, err, http.StatusNotFound)
		th, err := s.api.GetThreadWithResponse(ctx, "gen-nope")
		expect(t, "an unknown thread", th, err, http.StatusNotFound)
		la, err = s.api.ListArtifactsWithResponse(ctx, "gen-nope")
		expect(t, "artifacts of an unknown dispatch", la, err, http.StatusNotFound)
		ga, err = s.api.GetArtifactWithResponse(ctx, lastRound, "nope.txt", nil)
		expect(t, "an unknown artifact", ga, err, http.StatusNotFound)
		ga, err = s.api.GetArtifactWithResponse(ctx, lastRound, "notes/answer.json", &genclient.GetArtifactParams{Range: ptr("bytes=100000-")})
		expect(t, "a range past the end", ga, err, http.StatusRequestedRangeNotSatisfiable)
		art, err := s.api.GetArtifactWithResponse(ctx, lastRound, "notes/answer.json", nil)
		expect(t, "the artifact", art, err, http.StatusOK)
		if art != nil {
			etag := art.HTTPResponse.Header.Get("ETag")
			nm, err := s.api.GetArtifactWithResponse(ctx, lastRound, "notes/answer.json", &genclient.GetArtifactParams{IfNoneMatch: &etag})
			expect(t, "the artifact with its ETag", nm, err, http.StatusNotModified)
		}
		// Its object gone from the store, as when it expires.
		arts, err := s.api.ListArtifactsWithResponse(ctx, lastRound)
		if err != nil || arts.JSON200 == nil || len(arts.JSON200.Artifacts) != 1 {
			t.Fatalf("artifacts: %v", err)
		}
		obs, err := s.agora.JetStream().ObjectStore(ctx, lifecycle.BucketArtifacts)
		if err != nil {
			t.Fatal(err)
		}
		if err := obs.Delete(ctx, arts.JSON200.Artifacts[0].Ref); err != nil {
			t.Fatal(err)
		}
		ga, err = s.api.GetArtifactWithResponse(ctx, lastRound, "notes/answer.json", nil)
		expect(t, "an expired artifact", ga, err, http.StatusGone)
		kind := genclient.EventsParamsKind("bogus")
		ev, err := s.api.EventsWithResponse(bad, &genclient.EventsParams{Kind: &kind})
		expect(t, "events of an unknown kind", ev, err, http.StatusUnprocessableEntity)

		// Another team's principal: the thread is not its own.
		other := s.client(otherTeamToken)
		ev, err = other.EventsWithResponse(bad, &genclient.EventsParams{Thread: &thread})
		expect(t, "another team following the thread's events", ev, err, http.StatusNotFound)
		ev, err = other.EventsWithResponse(bad, nil)
		expect(t, "another team following every thread's events", ev, err, http.StatusForbidden)
		th, terr := other.GetThreadWithResponse(ctx, thread)
		expect(t, "another team reading the thread", th, terr, http.StatusNotFound)
		ct, cerr := other.CancelThreadWithResponse(ctx, thread, genclient.CancelThreadJSONRequestBody{})
		expect(t, "another team cancelling the thread", ct, cerr, http.StatusNotFound)
		od, err := other.DispatchWithResponse(ctx, nil, genclient.DispatchRequested{Subagent: "asker"})
		expect(t, "another team dispatching outside its scope", od, err, http.StatusForbidden)
		od, err = other.DispatchWithResponse(ctx, nil, genclient.DispatchRequested{DispatchId: ptr(thread), Subagent: "sleeper"})
		expect(t, "another team reusing the thread's dispatch_id", od, err, http.StatusConflict)
	})

	t.Run("inbox", func(t *testing.T) {
		// A clarification waits: its options are suggestions, so its links
		// include an open one.
		input := map[string]any{"question": "Which environment?", "options": []any{"staging", "production"}, "kind": "clarification"}
		d, err := s.api.DispatchWithResponse(ctx, nil, genclient.DispatchRequested{DispatchId: ptr("gen-ask-2"), Subagent: "asker", Input: &input})
		expect(t, "dispatch gen-ask-2", d, err, http.StatusCreated)
		q := pendingQuestion(t, s, "gen-ask-2")

		a, err := s.inbox.AnswerQuestionWithResponse(ctx, q.QuestionId, genclient.AnswerRequest{})
		expect(t, "an empty answer", a, err, http.StatusUnprocessableEntity)
		if a != nil && (a.JSON422 == nil || a.JSON422.Status != genclient.AnswerReplyStatusInvalid) {
			t.Errorf("the router's refusal is not an AnswerReply: %s", a.Body)
		}
		a, err = s.inbox.AnswerQuestionWithBodyWithResponse(bad, q.QuestionId, "application/json", strings.NewReader(`{"anwser":"staging"}`))
		expect(t, "an answer with an unknown member", a, err, http.StatusUnprocessableEntity)
		if a != nil && a.ApplicationproblemJSON422 == nil {
			t.Errorf("a misspelt member is not a problem: %s", a.Body)
		}
		a, err = s.inbox.AnswerQuestionWithBodyWithResponse(bad, q.QuestionId, "application/json", strings.NewReader(`{"answer":"`+strings.Repeat("a", 64<<10)+`"}`))
		expect(t, "an answer past 64 KiB", a, err, http.StatusRequestEntityTooLarge)
		a, err = s.inbox.AnswerQuestionWithResponse(ctx, "q-gen-nope", genclient.AnswerRequest{Answer: ptr("x")})
		expect(t, "an answer to an unknown question", a, err, http.StatusNotFound)
		a, err = s.client("").AnswerQuestionWithResponse(ctx, q.QuestionId, genclient.AnswerRequest{Answer: ptr("x")})
		expect(t, "an answer without a sign-in", a, err, http.StatusUnauthorized)

		l, err := s.inbox.CreateAnswerLinksWithBodyWithResponse(bad, q.QuestionId, "application/json", strings.NewReader(`{"audience":"dana","tll":"1h"}`))
		expect(t, "links with an unknown member", l, err, http.StatusUnprocessableEntity)
		l, err = s.inbox.CreateAnswerLinksWithResponse(ctx, q.QuestionId, genclient.LinksRequest{Audience: "dana", Ttl: ptr("forever")})
		expect(t, "links with a bad ttl", l, err, http.StatusUnprocessableEntity)
		l, err = s.inbox.CreateAnswerLinksWithResponse(ctx, "q-gen-nope", genclient.LinksRequest{Audience: "dana"})
		expect(t, "links of an unknown question", l, err, http.StatusNotFound)
		l, err = s.inbox.CreateAnswerLinksWithResponse(ctx, q.QuestionId, genclient.LinksRequest{Audience: "dana"})
		expect(t, "links", l, err, http.StatusOK)
		var open string
		if l != nil && l.JSON200 != nil {
			for _, link := range l.JSON200.Links {
				if link.Open != nil && *link.Open {
					open = link.Url
				}
			}
		}
		u, err := url.Parse(open)
		if err != nil || open == "" {
			t.Fatalf("no open link: %s", l.Body)
		}
		token := path.Base(u.Path)
		used, err := s.inbox.UseAnswerLinkWithFormdataBodyWithResponse(ctx, token, genclient.LinkForm{Answer: ptr("  ")})
		expect(t, "an open link without an answer", used, err, http.StatusUnprocessableEntity)
		tampered := token[:len(token)-4] + "AAAA"
		page, err := s.inbox.GetAnswerLinkWithResponse(ctx, tampered)
		expect(t, "a tampered link", page, err, http.StatusNotFound)
		used, err = s.inbox.UseAnswerLinkWithFormdataBodyWithResponse(ctx, tampered, genclient.LinkForm{Answer: ptr("staging")})
		expect(t, "a tampered link used", used, err, http.StatusNotFound)
		l, err = s.inbox.CreateAnswerLinksWithBodyWithResponse(bad, q.QuestionId, "application/json", strings.NewReader(`{"audience":"`+strings.Repeat("a", 64<<10)+`"}`))
		expect(t, "links past 64 KiB", l, err, http.StatusRequestEntityTooLarge)

		// A link that lasts a second, once it has expired.
		short, err := s.inbox.CreateAnswerLinksWithResponse(ctx, q.QuestionId, genclient.LinksRequest{Audience: "dana", Ttl: ptr("1s")})
		if err != nil || short.JSON200 == nil || len(short.JSON200.Links) == 0 {
			t.Fatalf("a short link: %v", err)
		}
		su, _ := url.Parse(short.JSON200.Links[0].Url)
		testkit.Eventually(t, waitFor, "the short link expired", func() bool {
			p, err := s.inbox.GetAnswerLinkWithResponse(ctx, path.Base(su.Path))
			return err == nil && p.StatusCode() == http.StatusGone
		})
		used, err = s.inbox.UseAnswerLinkWithFormdataBodyWithResponse(ctx, path.Base(su.Path), genclient.LinkForm{})
		expect(t, "an expired link used", used, err, http.StatusGone)

		// The thread is cancelled while it waits: the question is
		// withdrawn, and what answers it now is refused.
		ct, err := s.api.CancelThreadWithResponse(ctx, "gen-ask-2", genclient.CancelBody{By: ptr("gen")})
		expect(t, "cancel the waiting thread", ct, err, http.StatusOK)
		testkit.Eventually(t, waitFor, "the question withdrawn", func() bool {
			g, err := s.inbox.GetQuestionWithResponse(ctx, q.QuestionId)
			return err == nil && g.JSON200 != nil && g.JSON200.Question.Status != "asked"
		})
		l, err = s.inbox.CreateAnswerLinksWithResponse(ctx, q.QuestionId, genclient.LinksRequest{Audience: "dana"})
		expect(t, "links of a closed question", l, err, http.StatusConflict)
		a, err = s.inbox.AnswerQuestionWithResponse(ctx, q.QuestionId, genclient.AnswerRequest{Answer: ptr("staging")})
		expect(t, "an answer to a closed question", a, err, http.StatusConflict)
		page, err = s.inbox.GetAnswerLinkWithResponse(ctx, token)
		expect(t, "the link of a closed question", page, err, http.StatusConflict)

		g, err := s.inbox.GetQuestionWithResponse(ctx, "q-gen-nope")
		expect(t, "an unknown question", g, err, http.StatusNotFound)

		// Remembered decisions: none on the built-in route (it remembers
		// nothing), and one that is not remembered cannot be forgotten.
		ds, err := s.inbox.ListDecisionsWithResponse(ctx, nil)
		expect(t, "the remembered decisions", ds, err, http.StatusOK)
		if ds != nil && ds.JSON200 != nil && (ds.JSON200.Count != 0 || len(ds.JSON200.Decisions) != 0) {
			t.Errorf("decisions: %s", ds.Body)
		}
		ds, err = s.inbox.ListDecisionsWithResponse(bad, &genclient.ListDecisionsParams{Route: ptr("not a route")})
		expect(t, "decisions of a bad route name", ds, err, http.StatusUnprocessableEntity)
		fd, err := s.inbox.ForgetDecisionWithResponse(ctx, "d-gen-nope")
		expect(t, "forget an unknown decision", fd, err, http.StatusNotFound)
		st := genclient.ListQuestionsParamsStatus("bogus")
		ls, err := s.inbox.ListQuestionsWithResponse(bad, &genclient.ListQuestionsParams{Status: &st})
		expect(t, "an unknown status", ls, err, http.StatusUnprocessableEntity)

		// Sign in through the API and use the session's token.
		lg, err := s.api.LoginWithResponse(ctx, genclient.LoginRequest{Token: ptr("wrong")})
		expect(t, "a wrong dev token", lg, err, http.StatusUnauthorized)
		lg, err = s.api.LoginWithBodyWithResponse(bad, "application/json", strings.NewReader(`{"tokn":"x"}`))
		expect(t, "a login with an unknown member", lg, err, http.StatusUnprocessableEntity)
		lg, err = s.api.LoginWithBodyWithResponse(bad, "application/json", strings.NewReader(`{"token":"`+strings.Repeat("a", 64<<10)+`"}`))
		expect(t, "a login past 64 KiB", lg, err, http.StatusRequestEntityTooLarge)
		lg, err = s.api.LoginWithResponse(ctx, genclient.LoginRequest{Token: ptr(s.devToken)})
		expect(t, "a login", lg, err, http.StatusOK)
		if lg == nil || lg.JSON200 == nil {
			t.FailNow()
		}
		all := genclient.ListQuestionsParamsStatus("all")
		ls, err = s.client(lg.JSON200.Token).ListQuestionsWithResponse(ctx, &genclient.ListQuestionsParams{Status: &all})
		expect(t, "list with the session's token", ls, err, http.StatusOK)
		if ls != nil && ls.JSON200 != nil && len(ls.JSON200.Questions) != 3 {
			t.Errorf("all questions: %d, want 3: %s", len(ls.JSON200.Questions), ls.Body)
		}
	})

	t.Run("reverse", func(t *testing.T) { reversals(t, s) })
}
