package genclient_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/go-faster/jx"
	"github.com/ogen-go/ogen/ogenerrors"

	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/schema/openapi/ogenclient"
)

// tokens is ogen's SecuritySource: the API token for /v1, the inbox's for
// its JSON API.
type tokens struct{ api, inbox string }

func (k tokens) BearerAuth(context.Context, ogenclient.OperationName) (ogenclient.BearerAuth, error) {
	return ogenclient.BearerAuth{Token: k.api}, nil
}

func (k tokens) InboxAuth(context.Context, ogenclient.OperationName) (ogenclient.InboxAuth, error) {
	return ogenclient.InboxAuth{Token: k.inbox}, nil
}

func (k tokens) InboxSession(context.Context, ogenclient.OperationName) (ogenclient.InboxSession, error) {
	return ogenclient.InboxSession{}, ogenerrors.ErrSkipClientSecurity // no cookie: the bearer tokens do
}

// A second, stricter generator reads the same document: ogen's client
// (schema/openapi/ogenclient, generated from agora.json unmodified)
// dispatches a sub-agent that asks, finds the question through the
// inbox's JSON API, answers it, is refused a reversal of that answer
// (no suggestion gave it), and reads the finished thread and its
// output, every exchange checked against the document by the contract.
func TestOgenClientAgainstAgora(t *testing.T) {
	s := start(t)
	ctx := t.Context()
	c, err := ogenclient.NewClient(s.web.URL, tokens{api: apiToken, inbox: s.devToken}, ogenclient.WithClient(&http.Client{Transport: s.contract}))
	if err != nil {
		t.Fatal(err)
	}

	input := ogenclient.DispatchRequestedInput{
		"question": jx.Raw(`"Tag the release?"`), "options": jx.Raw(`["yes","no"]`), "kind": jx.Raw(`"decision"`),
	}
	res, err := c.Dispatch(ctx, &ogenclient.DispatchRequested{
		DispatchID: ogenclient.NewOptCommonToken("ogen-thread-1"), Subagent: "asker", Input: ogenclient.NewOptDispatchRequestedInput(input),
	}, ogenclient.DispatchParams{})
	if err != nil {
		t.Fatalf("dispatch: %v", err)
	}
	created, ok := res.(*ogenclient.DispatchCreated)
	if !ok {
		t.Fatalf("dispatch answered %T %+v", res, res)
	}
	thread := created.ThreadID
	t.Logf("dispatched %s (thread %s): %s", created.DispatchID, thread, created.Status)

	var qid string
	testkit.Eventually(t, waitFor, "the question listed through ogen's client", func() bool {
		r, err := c.ListQuestions(ctx, ogenclient.ListQuestionsParams{Thread: ogenclient.NewOptString(thread)})
		if err != nil {
			t.Fatalf("list questions: %v", err)
		}
		l, ok := r.(*ogenclient.QuestionList)
		if !ok {
			t.Fatalf("list questions answered %T", r)
		}
		if len(l.Questions) == 1 {
			qid = string(l.Questions[0].QuestionID)
		}
		return qid != ""
	})
	ar, err := c.AnswerQuestion(ctx, &ogenclient.AnswerRequest{Answer: ogenclient.NewOptString("yes"), Comment: ogenclient.NewOptString("from ogen")},
		ogenclient.AnswerQuestionParams{ID: ogenclient.CommonToken(qid)})
	if err != nil {
		t.Fatalf("answer: %v", err)
	}
	if ok, isOK := ar.(*ogenclient.AnswerQuestionOK); !isOK || ok.Status != ogenclient.AnswerReplyStatusAccepted {
		t.Fatalf("answer answered %T %+v", ar, ar)
	}
	// A person answered it: a reversal has no suggestion to reverse.
	rr, err := c.ReverseSuggestion(ctx, &ogenclient.ReverseRequest{Answer: ogenclient.NewOptString("no")}, ogenclient.ReverseSuggestionParams{ID: ogenclient.CommonToken(qid)})
	if err != nil {
		t.Fatalf("reverse: %v", err)
	}
	if p, ok := rr.(*ogenclient.ReverseSuggestionUnprocessableEntity); !ok || !strings.Contains(p.Detail.Or(""), "nothing to reverse") {
		t.Errorf("a reversal of a person's answer answered %T %+v, want 422 nothing to reverse", rr, rr)
	}

	var th *ogenclient.Thread
	testkit.Eventually(t, waitFor, "the thread finished, read through ogen's client", func() bool {
		r, err := c.GetThread(ctx, ogenclient.GetThreadParams{ID: ogenclient.CommonToken(thread)})
		if err != nil {
			t.Fatalf("get thread: %v", err)
		}
		th, _ = r.(*ogenclient.Thread)
		return th != nil && th.Status == ogenclient.KindFinished
	})
	if len(th.Rounds) != 2 {
		t.Fatalf("rounds: %+v", th.Rounds)
	}
	last := th.Rounds[1]
	out, ok := last.Result.Get()
	if !ok || !strings.Contains(string(out.Output), `"answer":"yes"`) || !strings.Contains(string(out.Output), `"answered_by":"dev"`) {
		t.Errorf("the last round's result: %+v (output %s)", last.Result, out.Output)
	}
}
