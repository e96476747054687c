package inbox

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"time"

	"github.com/agora-dispatch/agora/internal/answertext"
	"github.com/agora-dispatch/agora/internal/problem"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// Remembered decisions (docs/inbox.md, "Remembered decisions"): the router
// keeps the answers of routes with `remember` and answers matching later
// questions with them. The inbox lists those of the routes a person may
// answer, and forgets one on request, through the router's
// agora.api.decisions and agora.api.decisions.forget.

// decisionsTimeout bounds one call to the router's decisions endpoints.
const decisionsTimeout = 5 * time.Second

// DecisionList is the body of GET /inbox/api/decisions: the remembered
// decisions of the routes the user may answer, newest answer first.
type DecisionList struct {
	Decisions []client.Decision `json:"decisions"`
	Count     int               `json:"count"`
}

// errDecisionHidden reports a decision on a route the user does not see.
var errDecisionHidden = errors.New("inbox: the decision is on a route you may not answer")

// decisions lists the remembered decisions u may see, of route when it is
// not empty.
func (s *Server) decisions(ctx context.Context, u *user, route string) ([]client.Decision, error) {
	ctx, cancel := context.WithTimeout(ctx, decisionsTimeout)
	defer cancel()
	all, err := s.c.Decisions(ctx, route)
	if err != nil {
		return nil, err
	}
	out := make([]client.Decision, 0, len(all))
	for _, d := range all {
		if s.shows(d.Route) && u.may(d.Route) {
			out = append(out, d)
		}
	}
	return out, nil
}

// forget forgets decision id as u: it must be one u sees. It returns what
// was forgotten; an id the router does not remember is a *client.Problem
// matching client.ErrNotFound, one on a route u may not answer
// errDecisionHidden.
func (s *Server) forget(ctx context.Context, u *user, id string) (client.Decision, error) {
	if lifecycle.ValidToken(id) != nil {
		return client.Decision{}, &client.Problem{Type: client.ProblemNotFound, Title: "Not found", Status: http.StatusNotFound, Detail: "no remembered decision " + id}
	}
	ctx, cancel := context.WithTimeout(ctx, decisionsTimeout)
	defer cancel()
	all, err := s.c.Decisions(ctx, "")
	if err != nil {
		return client.Decision{}, err
	}
	i := slices.IndexFunc(all, func(d client.Decision) bool { return d.ID == id })
	switch {
	case i < 0 || !s.shows(all[i].Route):
		return client.Decision{}, &client.Problem{Type: client.ProblemNotFound, Title: "Not found", Status: http.StatusNotFound, Detail: "no remembered decision " + id}
	case !u.may(all[i].Route):
		return client.Decision{}, errDecisionHidden
	}
	d, err := s.c.ForgetDecision(ctx, id)
	if err != nil {
		return client.Decision{}, err
	}
	s.log.Info("remembered decision forgotten", "decision_id", id, "route", d.Route, "question_id", d.QuestionID, "user", u.name)
	return d, nil
}

// decisionProblem is the problem document of a failed decisions call.
func decisionProblem(err error) *client.Problem {
	var p *client.Problem
	switch {
	case errors.Is(err, errDecisionHidden):
		return statusProblem(http.StatusForbidden, err.Error())
	case errors.As(err, &p):
		return p
	}
	return statusProblem(http.StatusServiceUnavailable, "the router did not answer: "+err.Error())
}

func (s *Server) apiDecisions(w http.ResponseWriter, r *http.Request, id *identity) {
	route := r.URL.Query().Get("route")
	if route != "" && lifecycle.ValidToken(route) != nil {
		problem.Write(w, r, problem.Invalid(client.FieldError{Field: "route", Message: "not a route name"}))
		return
	}
	ds, err := s.decisions(r.Context(), id.user, route)
	if err != nil {
		s.log.Warn("decisions list", "err", err)
		problem.Write(w, r, decisionProblem(err))
		return
	}
	writeJSON(w, http.StatusOK, DecisionList{Decisions: ds, Count: len(ds)})
}

// apiForget is DELETE /inbox/api/decisions/{id}: 200 with the forgotten
// decision; 404 when it is not remembered, 403 on a route the user may
// not answer, 503 when the router does not answer.
func (s *Server) apiForget(w http.ResponseWriter, r *http.Request, id *identity) {
	d, err := s.forget(r.Context(), id.user, r.PathValue("id"))
	if err != nil {
		problem.Write(w, r, decisionProblem(err))
		return
	}
	writeJSON(w, http.StatusOK, d)
}

// decisionsData is the decisions page's data.
type decisionsData struct {
	Rows   []decisionView
	Routes []choice
	Route  string
	// Error says why the list could not be read.
	Error string
	// Notice is the result of the last forget; NoticeKind ok or warn.
	Notice, NoticeKind string
}

// decisionView is one remembered decision as the page shows it.
type decisionView struct {
	ID, Route, Question, Kind string
	QuestionID, QuestionURL   string
	Answer                    string
	AnsweredBy                string
	AnsweredISO, AnsweredAt   string
	ExpiresISO, ExpiresAt     string
	ExpiresIn                 string
	Comment                   string
}

func (s *Server) decisionsPage(w http.ResponseWriter, r *http.Request, id *identity) {
	query := r.URL.Query()
	route := query.Get("route")
	if lifecycle.ValidToken(route) != nil {
		route = ""
	}
	d := decisionsData{Route: route}
	switch query.Get("forgot") {
	case "":
	case "1":
		d.Notice, d.NoticeKind = "Forgotten: a question like it is asked again. Threads it already answered are not changed.", "ok"
	default:
		d.Notice, d.NoticeKind = "That decision is no longer remembered (forgotten, or expired).", "warn"
	}
	ds, err := s.decisions(r.Context(), id.user, route)
	if err != nil {
		s.log.Warn("decisions page", "err", err)
		d.Error = "The router did not list the remembered decisions (" + err.Error() + "). Try again in a moment."
	}
	now := time.Now()
	routes := map[string]bool{}
	for _, x := range ds {
		routes[x.Route] = true
		v := decisionView{ID: x.ID, Route: x.Route, Question: x.Question, Kind: x.Kind, QuestionID: x.QuestionID,
			Answer: answertext.Line(x.Answer, x.Decision), AnsweredBy: x.AnsweredBy, Comment: x.Comment,
			AnsweredISO: isoTime(x.AnsweredAt), AnsweredAt: fmtTime(x.AnsweredAt),
			ExpiresISO: isoTime(x.ExpiresAt), ExpiresAt: fmtTime(x.ExpiresAt), ExpiresIn: span(x.ExpiresAt.Sub(now))}
		if lifecycle.ValidToken(x.QuestionID) == nil {
			v.QuestionURL = questionURL(x.QuestionID)
		}
		d.Rows = append(d.Rows, v)
	}
	var names []string
	for r := range routes {
		names = append(names, r)
	}
	slices.Sort(names)
	d.Routes = choices(with(names, route), route, nil)
	v := s.baseView(id, "Remembered decisions")
	v.Data = d
	s.render(w, http.StatusOK, "decisions", v)
}

// forgetForm is the decisions page's forget button.
func (s *Server) forgetForm(w http.ResponseWriter, r *http.Request, id *identity) {
	next := url.Values{}
	if route := r.PostForm.Get("route"); route != "" && lifecycle.ValidToken(route) == nil {
		next.Set("route", route)
	}
	_, err := s.forget(r.Context(), id.user, r.PathValue("id"))
	switch {
	case err == nil:
		next.Set("forgot", "1")
	case errors.Is(err, client.ErrNotFound):
		next.Set("forgot", "gone")
	case errors.Is(err, errDecisionHidden):
		s.errorPage(w, r, id, http.StatusForbidden, "Not your route", "You ("+id.user.name+") may not forget decisions on that route.")
		return
	default:
		s.log.Warn("forget decision", "decision_id", r.PathValue("id"), "err", err)
		s.errorPage(w, r, id, http.StatusServiceUnavailable, "Not forgotten", "The router did not answer ("+err.Error()+"). Nothing changed: try again in a moment.")
		return
	}
	http.Redirect(w, r, Prefix+"/decisions?"+next.Encode(), http.StatusSeeOther)
}
