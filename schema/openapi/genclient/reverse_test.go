package genclient_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/schema/openapi/genclient"
)

// suggest sends the answerer's suggestion for qid on route bots, whose
// auto_accept (0.9) takes it as the answer.
func suggest(t *testing.T, s *stack, qid, answer string, confidence float64) {
	t.Helper()
	body, _ := json.Marshal(client.Submission{QuestionID: qid, Answer: answer, AnsweredBy: "bot", Suggest: true, Confidence: &confidence, Reason: "the test names it so"})
	m, err := s.agora.Conn().Request("agora.api.answer.bots", body, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var rep client.AnswerReply
	if err := json.Unmarshal(m.Data, &rep); err != nil || rep.Status != client.AnswerAccepted {
		t.Fatalf("suggestion: %s %v", m.Data, err)
	}
}

// suggested asks thread's question through sub-agent name, has a
// suggestion answer it, and waits until the inbox shows it answered and
// its thread resumed; it returns the question and the resumed dispatch.
func suggested(t *testing.T, s *stack, thread, name string) (qid, resumed string) {
	t.Helper()
	input := map[string]any{"question": "Which cache policy?", "options": []any{"lru", "fifo"}, "kind": "decision"}
	d, err := s.api.DispatchWithResponse(t.Context(), nil, genclient.DispatchRequested{DispatchId: ptr(thread), Subagent: name, Input: &input})
	expect(t, "dispatch "+thread, d, err, http.StatusCreated)
	qid = pendingQuestion(t, s, thread).QuestionId
	suggest(t, s, qid, "fifo", 0.95)
	testkit.Eventually(t, waitFor, "the suggestion to answer "+qid+" and resume its thread", func() bool {
		g, err := s.inbox.GetQuestionWithResponse(t.Context(), qid)
		if err != nil || g.JSON200 == nil {
			t.Fatalf("get question: %v", err)
		}
		q := g.JSON200.Question
		if q.Outcome == nil || *q.Outcome != "redispatched" || q.NextDispatchId == nil {
			return false
		}
		resumed = *q.NextDispatchId
		return true
	})
	return qid, resumed
}

// reversals reverses an accepted suggestion through the generated client:
// once while its resumed run still runs (200), then the refusals — too
// late (409: the resumed run finished), nothing to reverse (422), an
// unknown question (404), a misspelt member (422), a body past 64 KiB
// (413), no sign-in (401) — and reads the decision trail.
func reversals(t *testing.T, s *stack) {
	ctx := t.Context()
	bad := wrongOnPurpose(ctx)

	qid, resumed := suggested(t, s, "gen-bot-1", "bot-slow")
	g, err := s.inbox.GetQuestionWithResponse(ctx, qid)
	expect(t, "the suggested question", g, err, http.StatusOK)
	if g != nil && g.JSON200 != nil && !hasStep(g.JSON200.Trail, genclient.StepHowSuggestion, true) {
		t.Errorf("the trail has no machine-made suggestion step: %s", g.Body)
	}

	r, err := s.inbox.ReverseSuggestionWithBodyWithResponse(bad, qid, "application/json", strings.NewReader(`{"anwser":"lru"}`))
	expect(t, "a reversal with an unknown member", r, err, http.StatusUnprocessableEntity)
	r, err = s.inbox.ReverseSuggestionWithBodyWithResponse(bad, qid, "application/json", strings.NewReader(`{"answer":"`+strings.Repeat("a", 64<<10)+`"}`))
	expect(t, "a reversal past 64 KiB", r, err, http.StatusRequestEntityTooLarge)
	r, err = s.client("").ReverseSuggestionWithResponse(ctx, qid, genclient.ReverseRequest{Answer: ptr("lru")})
	expect(t, "a reversal without a sign-in", r, err, http.StatusUnauthorized)
	r, err = s.inbox.ReverseSuggestionWithResponse(ctx, "q-gen-nope", genclient.ReverseRequest{Answer: ptr("lru")})
	expect(t, "a reversal of an unknown question", r, err, http.StatusNotFound)

	r, err = s.inbox.ReverseSuggestionWithResponse(ctx, qid, genclient.ReverseRequest{Answer: ptr("lru"), Comment: ptr("fifo thrashes")})
	expect(t, "the reversal", r, err, http.StatusOK)
	if r != nil && r.JSON200 != nil {
		if r.JSON200.QuestionId != qid || r.JSON200.CancelledDispatchId != resumed || r.JSON200.NextDispatchId == "" || r.JSON200.NextDispatchId == resumed {
			t.Errorf("the reversal's reply: %s (resumed %s)", r.Body, resumed)
		}
		t.Logf("reversed %s: cancelled %s, resumed with %s", qid, r.JSON200.CancelledDispatchId, r.JSON200.NextDispatchId)
	}
	r, err = s.inbox.ReverseSuggestionWithResponse(ctx, qid, genclient.ReverseRequest{Answer: ptr("lru")})
	expect(t, "a second reversal", r, err, http.StatusUnprocessableEntity)
	g, err = s.inbox.GetQuestionWithResponse(ctx, qid)
	expect(t, "the reversed question", g, err, http.StatusOK)
	if g != nil && g.JSON200 != nil {
		q := g.JSON200.Question
		if q.Reversal == nil || q.Reversal.By != "dev" || q.Reversal.SuggestionAnswer != "fifo" || q.Answer == nil || *q.Answer != "lru" {
			t.Errorf("the reversed question: %s", g.Body)
		}
		if !hasStep(g.JSON200.Trail, genclient.StepHowReversal, false) {
			t.Errorf("the trail has no reversal step: %s", g.Body)
		}
	}

	// A suggestion whose resumed run finished at once: too late.
	late, resumed := suggested(t, s, "gen-bot-2", "bot-quick")
	testkit.Eventually(t, waitFor, "the resumed run "+resumed+" to finish", func() bool {
		rec, err := s.api.GetDispatchWithResponse(ctx, resumed)
		return err == nil && rec.JSON200 != nil && rec.JSON200.Status == genclient.KindFinished
	})
	r, err = s.inbox.ReverseSuggestionWithResponse(ctx, late, genclient.ReverseRequest{Answer: ptr("lru")})
	expect(t, "a reversal after the thread went on", r, err, http.StatusConflict)
	if r != nil && (r.ApplicationproblemJSON409 == nil || r.ApplicationproblemJSON409.Detail == nil || !strings.Contains(*r.ApplicationproblemJSON409.Detail, resumed)) {
		t.Errorf("the 409 does not name the resumed dispatch %s: %s", resumed, r.Body)
	}
}

// hasStep reports whether trail has a step of how, made by a machine or
// not.
func hasStep(trail []genclient.Step, how genclient.StepHow, machine bool) bool {
	for _, st := range trail {
		if st.How == how && st.Machine == machine {
			return true
		}
	}
	return false
}
