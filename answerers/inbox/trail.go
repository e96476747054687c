package inbox

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/agora-dispatch/agora/internal/answertext"
	"github.com/agora-dispatch/agora/internal/clip"
	"github.com/agora-dispatch/agora/internal/problem"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// A thread's decision trail (docs/inbox.md, "Decision trail and
// machine-made answers"): every step its questions took, from the
// question records the router keeps — who asked and answered, when, and
// how (a person, memory, an accepted suggestion, a route's default, a
// timeout, the answer of a question it joined, a person's reversal).
// Steps of a question on a route the viewer may not see show only that a
// question was asked there, never what.

// How a step came about (Step.How).
const (
	HowAsked      = "asked"
	HowPerson     = "person"
	HowMemory     = "memory"
	HowSuggestion = "suggestion"
	HowDefault    = "default"
	HowTimeout    = "timeout"
	HowJoined     = "joined"
	HowDeclined   = "declined"
	HowWithdrawn  = "withdrawn"
	HowReversal   = "reversal"
)

// Step is one step of a thread's decision trail.
type Step struct {
	At         time.Time `json:"at"`
	QuestionID string    `json:"question_id,omitempty"`
	Round      int       `json:"round"`
	Route      string    `json:"route,omitempty"`
	// How is one of the How constants; Who did it; Answer is the answer
	// it gave (one line); Detail says more (the router's words).
	How    string `json:"how"`
	Who    string `json:"who,omitempty"`
	Answer string `json:"answer,omitempty"`
	Detail string `json:"detail,omitempty"`
	// Machine is set on a step no person made: memory, a suggestion, a
	// default, a timeout.
	Machine bool `json:"machine"`
	// Hidden is a question on a route the viewer may not see: its step
	// says only that it was asked in that round.
	Hidden bool `json:"hidden,omitempty"`
}

// historyEntry is one attempt in a question record's history, as the
// router writes it.
type historyEntry struct {
	At         time.Time `json:"at"`
	Via        string    `json:"via"`
	Route      string    `json:"route"`
	AnsweredBy string    `json:"answered_by"`
	Answer     string    `json:"answer"`
	Decision   string    `json:"decision"`
	Result     string    `json:"result"`
	Reason     string    `json:"reason"`
}

// Bounds on what a step shows: answers and reasons are the answerers' and
// sub-agents' text.
const (
	stepTextRunes   = 200
	stepDetailRunes = 300
	maxTrailSteps   = 200
)

// steps is the trail of one question, from its record.
func (q *Question) steps() []Step {
	base := Step{QuestionID: q.QuestionID, Round: q.Round, Route: q.Route}
	asked := base
	asked.At, asked.How, asked.Who = q.AskedAt, HowAsked, q.Subagent
	asked.Detail = clip.Line(q.Question.Question, stepDetailRunes)
	out := []Step{asked}
	for _, h := range q.history {
		st := base
		st.At, st.Who = h.At, clip.Line(h.AnsweredBy, 64)
		st.Answer = clip.Line(answertext.Line(h.Answer, h.Decision), stepTextRunes)
		st.Detail = clip.Line(h.Reason, stepDetailRunes)
		if h.Route != "" {
			st.Route = h.Route
		}
		switch h.Result {
		case "joined":
			st.How, st.Who, st.Detail = HowJoined, q.Subagent, "joined question "+q.JoinedTo+", asked earlier on route "+q.Route
		case "declined":
			st.How = HowDeclined
		case "withdrawn":
			st.How = HowWithdrawn
		case "expired":
			st.How, st.Machine, st.Who = HowTimeout, true, "agora"
		case "reversed":
			st.How = HowReversal
		case "accepted":
			st.How, st.Machine = answeredHow(h)
		default:
			continue // refused attempts change nothing
		}
		out = append(out, st)
	}
	return out
}

// answeredHow classifies an accepted answer.
func answeredHow(h historyEntry) (string, bool) {
	switch {
	case h.Via == "join":
		return HowJoined, strings.HasPrefix(h.AnsweredBy, suggestedPrefix) || strings.HasPrefix(h.AnsweredBy, "memory:")
	case h.Via == "memory" || strings.HasPrefix(h.AnsweredBy, "memory:"):
		return HowMemory, true
	case strings.HasPrefix(h.AnsweredBy, suggestedPrefix):
		return HowSuggestion, true
	case h.AnsweredBy == defaultAnsweredBy:
		return HowDefault, true
	}
	return HowPerson, false
}

// Answerers Agora names (services/router; docs/answering.md).
const (
	suggestedPrefix   = "suggested:"
	defaultAnsweredBy = "agora:default"
)

// Machine reports whether q was answered by an accepted suggestion that
// stands (not reversed): an answer no person gave. A question that joined
// one a suggestion answered is answered by it too.
func (q *Question) Machine() bool {
	return q.Status == StatusAnswered && q.Reversal == nil && strings.HasPrefix(q.AnsweredBy, suggestedPrefix)
}

// Reversible reports whether the page offers to reverse q's accepted
// suggestion: its own, answering its thread alone (the router decides
// whether it is still in time).
func (q *Question) Reversible() bool {
	sg := q.Suggestion
	return q.Machine() && sg != nil && sg.Accepted && q.JoinedTo == "" && q.Outcome == "redispatched" && q.NextDispatchID != "" && len(q.WaitingThreads) <= 1
}

// trail is the decision trail of q's thread for u: the steps of every
// question the thread asked (the dispatcher's view lists its rounds), in
// time order.
func (s *Server) trail(ctx context.Context, u *user, q *Question, th *client.Thread) []Step {
	qs := []*Question{q}
	if th != nil {
		for _, r := range th.Rounds {
			if r.Result == nil || r.Result.Kind != lifecycle.KindNeedsInput || r.DispatchID == q.DispatchID {
				continue
			}
			if o, ok := s.lookup(ctx, lifecycle.QuestionID(r.DispatchID)); ok && o.ThreadID == q.ThreadID {
				qs = append(qs, o)
			}
		}
	}
	var out []Step
	for _, o := range qs {
		if !s.visible(u, o) {
			out = append(out, Step{At: o.AskedAt, Round: o.Round, How: HowAsked, Hidden: true})
			continue
		}
		out = append(out, o.steps()...)
	}
	sortSteps(out)
	if len(out) > maxTrailSteps {
		out = out[len(out)-maxTrailSteps:]
	}
	return out
}

func sortSteps(s []Step) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && (s[j].At.Before(s[j-1].At) || (s[j].At.Equal(s[j-1].At) && s[j].Round < s[j-1].Round)); j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

// stepView is a step as the page shows it.
type stepView struct {
	Step
	ISO, AtText, Label, QuestionURL string
}

func newStepViews(steps []Step) []stepView {
	out := make([]stepView, 0, len(steps))
	for _, st := range steps {
		v := stepView{Step: st, ISO: isoTime(st.At), AtText: fmtTime(st.At), Label: howLabel(st)}
		if st.QuestionID != "" {
			v.QuestionURL = questionURL(st.QuestionID)
		}
		out = append(out, v)
	}
	return out
}

func howLabel(st Step) string {
	switch st.How {
	case HowAsked:
		if st.Hidden {
			return "asked on a route you may not see"
		}
		return "asked"
	case HowPerson:
		return "answered by a person"
	case HowMemory:
		return "answered from memory"
	case HowSuggestion:
		return "answered by an accepted suggestion"
	case HowDefault:
		return "answered with the route's default"
	case HowTimeout:
		return "expired"
	case HowJoined:
		return "joined"
	case HowDeclined:
		return "declined"
	case HowWithdrawn:
		return "withdrawn"
	case HowReversal:
		return "suggestion reversed by a person"
	}
	return st.How
}

// reverseInput is a person's reversal as a form or script sends it.
type reverseInput struct {
	Answer   string `json:"answer"`
	Decision string `json:"decision,omitempty"`
	Comment  string `json:"comment,omitempty"`
}

// reverse asks the router, through q's route door, to reverse q's
// accepted suggestion with u's answer. It returns the router's reply, or
// the refusal with the HTTP status that goes with it.
func (s *Server) reverse(ctx context.Context, u *user, q *Question, in reverseInput) (client.ReverseReply, int, string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), answerTimeout)
	defer cancel()
	log := s.log.With("question_id", q.QuestionID, "route", q.Route, "reversed_by", u.name)
	rep, err := s.c.Reverse(ctx, q.Route, client.ReverseRequest{QuestionID: q.QuestionID, Answer: strings.TrimSpace(in.Answer),
		Decision: strings.TrimSpace(in.Decision), Comment: strings.TrimSpace(in.Comment), ReversedBy: u.name})
	var p *client.Problem
	switch {
	case err == nil:
		log.Info("suggestion reversed", "cancelled_dispatch_id", rep.CancelledDispatchID, "next_dispatch_id", rep.NextDispatchID)
		wctx, cancel := context.WithTimeout(ctx, settleWait)
		s.store.waitUntil(wctx, q.QuestionID, func(q *Question) bool { return q == nil || q.Reversal != nil })
		cancel()
		return rep, http.StatusOK, ""
	case errors.As(err, &p):
		log.Info("reversal refused", "status", p.Status, "detail", p.Detail)
		return rep, p.Status, clip.Line(p.Detail, 400)
	}
	log.Warn("reversal not delivered", "err", err)
	return rep, http.StatusServiceUnavailable, "the router did not answer: nothing changed; try again"
}

// reverseForm serves POST /inbox/questions/{id}/reverse.
func (s *Server) reverseForm(w http.ResponseWriter, r *http.Request, id *identity) {
	q, ok := s.findPage(w, r, id)
	if !ok {
		return
	}
	in := reverseInput{Answer: r.PostForm.Get("answer"), Decision: r.PostForm.Get("decision"), Comment: r.PostForm.Get("comment")}
	_, status, why := s.reverse(r.Context(), id.user, q, in)
	if status == http.StatusOK {
		http.Redirect(w, r, questionURL(q.QuestionID)+"?reversed=1", http.StatusSeeOther)
		return
	}
	if now, ok := s.lookup(r.Context(), q.QuestionID); ok {
		q = now
	}
	d := s.questionData(r.Context(), id, q)
	d.Notice, d.NoticeKind = "Not reversed: "+why, "warn"
	v := s.baseView(id, clip.Line(q.Question.Question, 60))
	v.Data = d
	s.render(w, status, "question", v)
}

// apiReverse serves POST /inbox/api/questions/{id}/reverse: the body is
// {"answer", "decision", "comment"}; the reply is client.ReverseReply
// (200), or a problem: 409 too late, 422 nothing to reverse or an invalid
// answer, 403/404 as for answers, 503.
func (s *Server) apiReverse(w http.ResponseWriter, r *http.Request, id *identity) {
	var in reverseInput
	q, ok := s.decodeFor(w, r, id, &in)
	if !ok {
		return
	}
	rep, status, why := s.reverse(r.Context(), id.user, q, in)
	if status != http.StatusOK {
		p := statusProblem(status, why)
		if status == http.StatusConflict {
			p.Type = client.ProblemConflict
		}
		problem.Write(w, r, p)
		return
	}
	writeJSON(w, http.StatusOK, rep)
}

// machineText says who made a machine-made answer, for people.
func machineText(q *Question) string {
	sg := q.Suggestion
	if sg == nil || !sg.Accepted {
		return fmt.Sprintf("machine-made: the suggestion of %s, accepted by the route", clip.Line(strings.TrimPrefix(q.AnsweredBy, suggestedPrefix), 64))
	}
	return fmt.Sprintf("machine-made: suggested by %s at %.0f%% confidence and accepted by the route", clip.Line(sg.By, 64), sg.Confidence*100)
}
