package inbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/agora-dispatch/agora/internal/clip"
	"github.com/agora-dispatch/agora/internal/problem"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/trace"

	"github.com/agora-dispatch/agora/internal/telemetry"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// Limits on what a browser or script sends.
const (
	maxFormBytes = 64 << 10
	// answerTimeout bounds one answer's trip to the router.
	answerTimeout = 15 * time.Second
	// threadTimeout bounds the dispatcher's thread view for a page.
	threadTimeout = 3 * time.Second
	// settleWait bounds the wait for the watch to show an answered
	// question closed, so the next page shows what the person just did.
	settleWait = 3 * time.Second
)

func (s *Server) routesHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET "+Prefix+"/{$}", s.page(s.pendingPage))
	mux.HandleFunc("GET "+Prefix, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, Prefix+"/", http.StatusMovedPermanently)
	})
	mux.Handle("GET "+Prefix+"/questions/{id}", s.page(s.questionPage))
	mux.Handle("POST "+Prefix+"/questions/{id}/answer", s.form(s.answerForm))
	mux.Handle("POST "+Prefix+"/questions/{id}/decline", s.form(s.declineForm))
	mux.Handle("POST "+Prefix+"/questions/{id}/reverse", s.form(s.reverseForm))
	mux.Handle("GET "+Prefix+"/questions/{id}/artifacts/{name...}", s.page(s.artifactFile))
	mux.Handle("GET "+Prefix+"/history", s.page(s.historyPage))
	mux.Handle("GET "+Prefix+"/decisions", s.page(s.decisionsPage))
	mux.Handle("POST "+Prefix+"/decisions/{id}/forget", s.form(s.forgetForm))
	mux.Handle("GET "+Prefix+"/events", s.page(s.events))
	mux.HandleFunc("GET "+Prefix+"/login", s.loginPage)
	mux.HandleFunc("POST "+Prefix+"/login", s.loginForm)
	mux.Handle("POST "+Prefix+"/logout", s.form(s.logout))
	mux.HandleFunc("GET "+Prefix+"/static/{file}", s.serveStatic)
	mux.HandleFunc("GET "+Prefix+"/healthz", s.health)

	mux.Handle("GET "+Prefix+"/api/questions", s.api(s.apiList))
	mux.Handle("GET "+Prefix+"/api/questions/{id}", s.api(s.apiGet))
	mux.Handle("POST "+Prefix+"/api/questions/{id}/answer", s.api(s.apiAnswer))
	mux.Handle("POST "+Prefix+"/api/questions/{id}/reverse", s.api(s.apiReverse))
	mux.HandleFunc("POST "+Prefix+"/api/login", s.apiLogin)
	mux.Handle("POST "+Prefix+"/api/questions/{id}/links", s.api(s.apiLinks))
	mux.Handle("GET "+Prefix+"/api/decisions", s.api(s.apiDecisions))
	mux.Handle("DELETE "+Prefix+"/api/decisions/{id}", s.api(s.apiForget))
	mux.HandleFunc("GET "+Prefix+"/a/{token}", s.linkPage)
	mux.HandleFunc("POST "+Prefix+"/a/{token}", s.linkAnswer)
	mux.HandleFunc(Prefix+"/api/", func(w http.ResponseWriter, r *http.Request) {
		problem.Write(w, r, &client.Problem{Type: client.ProblemNotFound, Title: "Not found", Status: http.StatusNotFound, Detail: "no such API call: " + r.Method + " " + r.URL.Path})
	})
	mux.Handle(Prefix+"/", s.page(func(w http.ResponseWriter, r *http.Request, id *identity) {
		s.errorPage(w, r, id, http.StatusNotFound, "Page not found", "There is nothing at "+r.URL.Path+".")
	}))
	// Cross-origin POSTs are refused before anything else (Go's check of
	// Sec-Fetch-Site and Origin), on top of the forms' CSRF tokens, which
	// also cover browsers that send neither header (docs/inbox.md).
	return securityHeaders(s.crossOrigin().Handler(mux))
}

// crossOrigin is the inbox's http.CrossOriginProtection. The public URL's
// origin is trusted: behind a proxy that rewrites Host, a browser on plain
// HTTP sends no Sec-Fetch-Site and its Origin (the public one) would not
// match the Host the inbox sees.
func (s *Server) crossOrigin() *http.CrossOriginProtection {
	cop := http.NewCrossOriginProtection()
	if u, err := url.Parse(s.cfg.PublicURL); err == nil && u.Scheme != "" && u.Host != "" {
		if err := cop.AddTrustedOrigin(u.Scheme + "://" + u.Host); err != nil {
			s.log.Warn("public URL not trusted as an origin", "public_url", s.cfg.PublicURL, "err", err)
		}
	}
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.metrics.csrfRefused.Inc()
		http.Error(w, "Refused: this request came from another site. Open the inbox and send the form from there.", http.StatusForbidden)
	}))
	return cop
}

// csp allows only the inbox's own script and style: content from
// sub-agents is escaped by the templates, and even if some slipped through
// no inline script would run.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
	"form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

func securityHeaders(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", csp)
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("X-Frame-Options", "DENY")
		hd.Set("Referrer-Policy", "same-origin")
		h.ServeHTTP(w, r)
	})
}

func (s *Server) health(w http.ResponseWriter, _ *http.Request) {
	status, code := "ok", http.StatusOK
	select {
	case <-s.store.ready:
	default:
		status, code = "loading", http.StatusServiceUnavailable
	}
	if s.nc.Status() != nats.CONNECTED {
		status, code = "nats "+strings.ToLower(s.nc.Status().String()), http.StatusServiceUnavailable
	}
	writeJSON(w, code, map[string]any{"status": status, "questions": s.store.pendingCount()})
}

// pendingData is the pending page's data.
type pendingData struct {
	Rows                     []qview
	Filter                   filter
	Routes, Kinds, Subagents []choice
	EventsURL                string
	Total, Shown             int
	// Capped is set when Shown is more than the page lists
	// (Config.PendingRows); Listed is how many it lists then.
	Capped bool
	Listed int
}

func (s *Server) pendingPage(w http.ResponseWriter, r *http.Request, id *identity) {
	if !s.awaitReady(r.Context()) {
		s.errorPage(w, r, id, http.StatusServiceUnavailable, "The inbox is starting", "The questions are still loading. Reload the page in a moment.")
		return
	}
	f := filterFrom(r.URL.Query())
	f.Thread = ""
	now := time.Now()
	// The count and the filter's choices come from the store's per-route
	// counts, and the rows from a walk of the newest: the page costs its
	// rows, not every question waiting (docs/inbox.md).
	sees := func(route string) bool { return s.shows(route) && id.user.may(route) }
	total, routes, kinds, subagents := s.store.pendingFacets(sees)
	rows, shown, more := s.store.pendingPage(nil, s.cfg.PendingRows,
		func(q *Question) bool { return s.visible(id.user, q) && f.match(q) }, s.routeOnly(f, sees))
	d := pendingData{Filter: f, Total: total, Shown: shown, EventsURL: Prefix + "/events"}
	if q := f.values().Encode(); q != "" {
		d.EventsURL += "?" + q
	}
	if more {
		d.Capped, d.Listed = true, len(rows)
	}
	for _, q := range rows {
		d.Rows = append(d.Rows, newQView(q, now))
	}
	d.Routes = choices(with(routes, f.Route), f.Route, nil)
	d.Kinds = choices(with(kinds, f.Kind), f.Kind, kindLabel)
	d.Subagents = choices(with(subagents, f.Subagent), f.Subagent, nil)
	v := s.baseView(id, "Pending questions")
	v.Data = d
	s.render(w, http.StatusOK, "pending", v)
}

// historyData is the history page's data.
type historyData struct {
	Rows                     []qview
	Filter                   filter
	Status                   string
	Statuses                 []choice
	Routes, Kinds, Subagents []choice
	Total, Limit             int
	// Older: this page follows a cursor; Next is the next page's URL.
	Older bool
	Next  string
}

// historyLimit is the rows of one history page (and of a closed-list API
// call without a limit); historyMax the most a caller may ask for.
const (
	historyLimit = 50
	historyMax   = 200
)

func (s *Server) historyPage(w http.ResponseWriter, r *http.Request, id *identity) {
	if !s.awaitReady(r.Context()) {
		s.errorPage(w, r, id, http.StatusServiceUnavailable, "The inbox is starting", "The questions are still loading. Reload the page in a moment.")
		return
	}
	query := r.URL.Query()
	f := filterFrom(query)
	status := query.Get("status")
	if status != StatusAnswered && status != StatusExpired && status != StatusWithdrawn {
		status = ""
	}
	limit := parseLimit(query.Get("limit"), historyLimit, historyMax)
	page, err := s.history(r.Context(), query.Get("cursor"), limit, func(q *Question) bool {
		return s.visible(id.user, q) && f.match(q) && q.Closed() && (status == "" || q.Status == status)
	})
	var p *client.Problem
	switch {
	case errors.As(err, &p):
		s.errorPage(w, r, id, http.StatusBadRequest, "This page does not exist", "The history link is not one this inbox made. Start again from the first page.")
		return
	case err != nil:
		s.log.Warn("history page", "err", err)
		s.errorPage(w, r, id, http.StatusServiceUnavailable, "History is unavailable", "The questions bucket could not be read. Try again in a moment.")
		return
	}
	now := time.Now()
	d := historyData{Filter: f, Status: status, Total: len(page.Rows), Limit: limit, Older: query.Get("cursor") != ""}
	for _, q := range page.Rows {
		d.Rows = append(d.Rows, newQView(q, now))
	}
	if page.Next != "" {
		next := f.values()
		if status != "" {
			next.Set("status", status)
		}
		next.Set("cursor", page.Next)
		d.Next = Prefix + "/history?" + next.Encode()
	}
	d.Statuses = choices([]string{StatusAnswered, StatusExpired, StatusWithdrawn}, status, statusLabel)
	d.Routes = choices(distinct(page.Rows, func(q *Question) string { return q.Route }, f.Route), f.Route, nil)
	d.Kinds = choices(distinct(page.Rows, kindOf, f.Kind), f.Kind, kindLabel)
	d.Subagents = choices(distinct(page.Rows, func(q *Question) string { return q.Subagent }, f.Subagent), f.Subagent, nil)
	v := s.baseView(id, "History")
	v.Data = d
	s.render(w, http.StatusOK, "history", v)
}

func parseLimit(s string, def, max int) int {
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		return def
	}
	return min(n, max)
}

// questionData is the question page's data.
type questionData struct {
	Q   qview
	Run runView
	// ContextHTML is the context rendered as sanitised Markdown.
	ContextHTML template.HTML
	// FreeText: the options are suggestions (clarification, information),
	// so the form also takes an answer in the person's own words.
	FreeText  bool
	Earlier   []qview
	Thread    *threadView
	CanAnswer bool
	// Closed says how the question closed, when it did.
	Closed string
	// Notice is a message about the last action; NoticeKind is ok, warn
	// or error.
	Notice, NoticeKind string
	// Form holds what was typed, kept when an answer is refused.
	Form      answerInput
	EventsURL string
	APIURL    string
	// Trail is the thread's decision trail; CanReverse offers to reverse
	// the accepted suggestion that answered the question.
	Trail      []stepView
	CanReverse bool
}

// find looks a question up for u. The status is 200 when found, else 503
// (before the first load), 404 (unknown, or on a route the inbox does not
// show) or 403 (on a route u may not answer; q is then set); msg explains.
func (s *Server) find(ctx context.Context, u *user, qid string) (q *Question, status int, msg string) {
	if !s.awaitReady(ctx) {
		return nil, http.StatusServiceUnavailable, "the inbox is still loading the questions; try again in a moment"
	}
	q, ok := s.lookup(ctx, qid)
	if !ok || !s.shows(q.Route) {
		return nil, http.StatusNotFound, "there is no question " + qid + " in this inbox"
	}
	if !u.may(q.Route) {
		return q, http.StatusForbidden, fmt.Sprintf("%s may not answer questions on route %s", u.name, q.Route)
	}
	return q, http.StatusOK, ""
}

func (s *Server) findPage(w http.ResponseWriter, r *http.Request, id *identity) (*Question, bool) {
	q, status, msg := s.find(r.Context(), id.user, r.PathValue("id"))
	switch status {
	case http.StatusOK:
		return q, true
	case http.StatusForbidden:
		s.errorPage(w, r, id, status, "Not your route",
			"You ("+id.user.name+") may not answer questions on route "+q.Route+". An administrator can add the route to your entry in the users file.")
	case http.StatusNotFound:
		s.errorPage(w, r, id, status, "Question not found", "There is no question "+r.PathValue("id")+" in this inbox.")
	default:
		s.errorPage(w, r, id, status, "The inbox is starting", msg)
	}
	return nil, false
}

// thread fetches the thread from the dispatcher; nil when it does not
// answer in time (the page then shows the question alone).
func (s *Server) thread(ctx context.Context, threadID string) *client.Thread {
	ctx, cancel := context.WithTimeout(ctx, threadTimeout)
	defer cancel()
	th, err := s.c.Thread(ctx, threadID)
	if err != nil {
		s.log.Debug("thread view unavailable", "thread_id", threadID, "err", err)
		return nil
	}
	return th
}

func (s *Server) questionData(ctx context.Context, id *identity, q *Question) questionData {
	now := time.Now()
	d := questionData{Q: newQView(q, now), CanAnswer: q.Pending(), APIURL: Prefix + "/api/questions/" + q.QuestionID,
		EventsURL: Prefix + "/events?question=" + q.QuestionID, ContextHTML: markdown(q.Context),
		FreeText: len(q.Options) > 0 && (q.Kind == "clarification" || q.Kind == "information")}
	d.Run = s.runData(ctx, q)
	if !q.Pending() {
		d.Closed = closedMessage(q)
	}
	if sg := d.Q.Suggestion; sg != nil && q.Pending() {
		// The suggestion, preselected: the option (the template marks
		// it), or the text in the field it would be typed into.
		switch {
		case sg.Option:
			d.Form.Answer = sg.Answer
		case len(q.Options) == 0:
			d.Form.Answer = sg.Answer
		case d.FreeText:
			d.Form.Free = sg.Answer
		}
	}
	th := s.thread(ctx, q.ThreadID)
	d.Trail = newStepViews(s.trail(ctx, id.user, q, th))
	d.CanReverse = q.Reversible()
	for _, e := range s.earlier(ctx, id.user, q, th) {
		d.Earlier = append(d.Earlier, newQView(e, now))
	}
	if th != nil {
		d.Thread = newThreadView(summarize(th), q.QuestionID)
	}
	return d
}

func (s *Server) questionPage(w http.ResponseWriter, r *http.Request, id *identity) {
	q, ok := s.findPage(w, r, id)
	if !ok {
		return
	}
	d := s.questionData(r.Context(), id, q)
	if r.URL.Query().Get("sent") == "1" && q.Status == StatusAnswered && q.AnsweredBy == id.user.name {
		d.Notice, d.NoticeKind = "Your answer was sent. The sub-agent resumes with it.", "ok"
	}
	if r.URL.Query().Get("reversed") == "1" && q.Reversal != nil && q.Reversal.By == id.user.name {
		d.Notice, d.NoticeKind = "The suggestion is reversed: its dispatch "+q.Reversal.CancelledDispatchID+" is cancelled and the thread resumes as "+q.Reversal.NextDispatchID+" with your answer.", "ok"
	}
	v := s.baseView(id, clip.Line(q.Question.Question, 60))
	v.Data = d
	s.render(w, http.StatusOK, "question", v)
}

// answerInput is an answer as a form or script sends it.
type answerInput struct {
	Answer   string `json:"answer"`
	Decision string `json:"decision,omitempty"`
	Comment  string `json:"comment,omitempty"`
	// ShownDigest is the shown digest of the question as the page or
	// script showed it (its shown_digest); the router refuses the answer
	// when the question no longer shows that (docs/inbox.md).
	ShownDigest string `json:"shown_digest,omitempty"`
	// Free is the form's answer in the person's own words, beside the
	// options of a clarification or information question.
	Free string `json:"-"`
}

// submit sends an answer to the router as u and returns the router's
// reply and the HTTP status that goes with it.
// door is the door the answer names: lifecycle.DoorInbox for the page and
// the API, lifecycle.DoorLink for a signed link.
func (s *Server) submit(ctx context.Context, u *user, q *Question, in answerInput, door string) (client.AnswerReply, int) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), answerTimeout)
	defer cancel()
	ctx, span := telemetry.Tracer().Start(telemetry.Remote(ctx, q.Traceparent), "agora.inbox.answer", trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(telemetry.KeyQuestionID.String(q.QuestionID), telemetry.KeyRoute.String(q.Route), telemetry.KeyAnsweredBy.String(u.name)))
	defer span.End()
	a := lifecycle.Answer{Route: q.Route, Answer: strings.TrimSpace(in.Answer), Decision: strings.TrimSpace(in.Decision),
		AnsweredBy: u.name, Comment: strings.TrimSpace(in.Comment), ShownDigest: strings.TrimSpace(in.ShownDigest), Door: door}
	log := s.log.With("question_id", q.QuestionID, "route", q.Route, "answered_by", u.name)
	var opts []client.AnswerOption
	if s.routes != nil {
		// Restricted to routes: answer through the question's route door,
		// the only one a route's NATS user may request (see Config.Routes).
		opts = append(opts, client.AnswerVia(q.Route))
	}
	rep, err := s.c.Answer(ctx, q.QuestionID, a, opts...)
	var out client.AnswerReply
	var ae *client.AnswerError
	switch {
	case err == nil:
		out = *rep
	case errors.As(err, &ae):
		out = ae.Reply
	default:
		log.Warn("answer not delivered", "err", err)
		out = client.AnswerReply{Status: client.AnswerRetry, Reason: "the router did not answer: " + err.Error()}
	}
	s.metrics.answers.WithLabelValues(string(out.Status)).Inc()
	span.SetAttributes(telemetry.KeyOutcome.String(string(out.Status)))
	log.Info("answer sent", "status", out.Status, "reason", out.Reason)
	if out.Status == client.AnswerAccepted || out.Status == client.AnswerAlreadyAnswered {
		// Let the watch catch up, so the next page shows the question closed.
		wctx, cancel := context.WithTimeout(ctx, settleWait)
		s.store.waitUntil(wctx, q.QuestionID, func(q *Question) bool { return q == nil || !q.Pending() })
		cancel()
	}
	return out, replyStatus(out.Status)
}

func replyStatus(st client.AnswerStatus) int {
	switch st {
	case client.AnswerAccepted:
		return http.StatusOK
	case client.AnswerAlreadyAnswered, client.AnswerChanged:
		return http.StatusConflict
	case client.AnswerInvalid:
		return http.StatusUnprocessableEntity
	case client.AnswerNotFound:
		return http.StatusNotFound
	}
	return http.StatusServiceUnavailable
}

// refusal says why an answer was not taken, for people.
func refusal(rep client.AnswerReply) string {
	switch rep.Status {
	case client.AnswerAlreadyAnswered:
		if rep.AnsweredBy != "" && rep.AnsweredAt != nil {
			return fmt.Sprintf("This question was already answered by %s at %s.", rep.AnsweredBy, fmtTime(*rep.AnsweredAt))
		}
		return "This question is closed: " + rep.Reason + "."
	case client.AnswerInvalid:
		return "The answer was refused: " + rep.Reason + "."
	case client.AnswerChanged:
		return "Nothing was sent: this question changed after it was shown to you (reworded, or asked anew). Look at it again and answer what it asks now."
	case client.AnswerNotFound:
		return "The router does not know this question any more."
	}
	return "The answer did not get through (" + rep.Reason + "). Nothing was lost: send it again."
}

func (s *Server) answerForm(w http.ResponseWriter, r *http.Request, id *identity) {
	q, ok := s.findPage(w, r, id)
	if !ok {
		return
	}
	in := answerInput{Answer: r.PostForm.Get("answer"), Decision: r.PostForm.Get("decision"), Comment: r.PostForm.Get("comment"),
		Free: r.PostForm.Get("free_answer"), ShownDigest: r.PostForm.Get("shown_digest")}
	if r.PostForm.Get("free") == "1" {
		in.Answer = in.Free
	}
	rep, status := s.submit(r.Context(), id.user, q, in, lifecycle.DoorInbox)
	if rep.Status == client.AnswerAccepted {
		http.Redirect(w, r, questionURL(q.QuestionID)+"?sent=1", http.StatusSeeOther)
		return
	}
	if now, ok := s.lookup(r.Context(), q.QuestionID); ok {
		q = now
	}
	d := s.questionData(r.Context(), id, q)
	d.Notice, d.NoticeKind, d.Form = refusal(rep), "warn", in
	if rep.Status == client.AnswerChanged {
		// What was chosen was chosen for what the page showed then.
		d.Form = answerInput{}
	}
	if rep.Status == client.AnswerRetry {
		d.NoticeKind = "error"
	}
	v := s.baseView(id, clip.Line(q.Question.Question, 60))
	v.Data = d
	s.render(w, status, "question", v)
}

// loginData is the login page's data.
type loginData struct {
	Dev   bool
	Name  string
	Next  string
	Error string
}

func (s *Server) loginCSRF(w http.ResponseWriter, r *http.Request) string {
	if c, err := r.Cookie(loginCookie); err == nil && len(c.Value) >= 32 {
		return c.Value
	}
	tok := randomToken()
	s.setCookie(w, r, loginCookie, tok, time.Hour)
	return tok
}

func (s *Server) renderLogin(w http.ResponseWriter, r *http.Request, status int, d loginData) {
	v := view{Title: "Sign in", CSRF: s.loginCSRF(w, r), Data: d}
	s.render(w, status, "login", v)
}

func (s *Server) loginPage(w http.ResponseWriter, r *http.Request) {
	next := safeNext(r.URL.Query().Get("next"))
	if id, ok := s.authenticate(r); ok && !id.bearer {
		http.Redirect(w, r, next, http.StatusSeeOther)
		return
	}
	s.renderLogin(w, r, http.StatusOK, loginData{Dev: s.devToken != "", Next: next})
}

func (s *Server) loginForm(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	if err := r.ParseForm(); err != nil {
		http.Error(w, "inbox: the form could not be read", http.StatusBadRequest)
		return
	}
	d := loginData{Dev: s.devToken != "", Next: safeNext(r.PostForm.Get("next")), Name: r.PostForm.Get("name")}
	c, err := r.Cookie(loginCookie)
	if err != nil || !equal(r.PostForm.Get(csrfField), c.Value) {
		s.metrics.csrfRefused.Inc()
		d.Error = "The sign-in form expired. Please try again."
		s.renderLogin(w, r, http.StatusForbidden, d)
		return
	}
	name := r.PostForm.Get("name")
	if wait, why, ok := s.logins.check(r, name, time.Now()); !ok {
		s.metrics.logins.WithLabelValues("limited").Inc()
		s.log.Warn("sign-in refused: too many failures", "remote", r.RemoteAddr, "name", name)
		w.Header().Set("Retry-After", strconv.Itoa(int(wait.Seconds())+1))
		d.Error = why + " " + waitText(wait)
		s.renderLogin(w, r, http.StatusTooManyRequests, d)
		return
	}
	u, ok := s.checkCredentials(name, r.PostForm.Get("password"), strings.TrimSpace(r.PostForm.Get("token")))
	s.logins.result(r, name, ok, time.Now())
	if !ok {
		s.metrics.logins.WithLabelValues("refused").Inc()
		s.log.Info("sign-in refused", "remote", r.RemoteAddr)
		d.Error = "Wrong name or password."
		if d.Dev {
			d.Error = "Wrong token. It is printed where the inbox was started."
		}
		s.renderLogin(w, r, http.StatusUnauthorized, d)
		return
	}
	tok, _, err := s.sessions.create(r.Context(), u.name)
	if err != nil {
		s.log.Error("sign-in failed", "user", u.name, "err", err)
		d.Error = "Signing in failed: the inbox could not store the session. Try again in a moment."
		s.renderLogin(w, r, http.StatusServiceUnavailable, d)
		return
	}
	s.metrics.logins.WithLabelValues("ok").Inc()
	s.setCookie(w, r, sessionCookie, tok, s.cfg.SessionTTL)
	s.setCookie(w, r, loginCookie, "", -1)
	s.log.Info("signed in", "user", u.name)
	http.Redirect(w, r, d.Next, http.StatusSeeOther)
}

func (s *Server) logout(w http.ResponseWriter, r *http.Request, id *identity) {
	if c, err := r.Cookie(sessionCookie); err == nil {
		if err := s.sessions.delete(r.Context(), c.Value); err != nil {
			// Ended here; other replicas keep it until it expires.
			s.log.Error("sign-out not recorded in the sessions bucket", "user", id.user.name, "err", err)
		}
	}
	s.setCookie(w, r, sessionCookie, "", -1)
	s.log.Info("signed out", "user", id.user.name)
	http.Redirect(w, r, Prefix+"/login", http.StatusSeeOther)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
