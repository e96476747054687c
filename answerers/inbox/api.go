package inbox

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/agora-dispatch/agora/internal/problem"

	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// ProblemForbidden is the problem type of a 403: a route the user may not
// answer, or a request made with the session cookie but without the CSRF
// header.
const ProblemForbidden = "urn:agora:problem:forbidden"

// ProblemTooManyLogins is the problem type of a 429 from POST
// /inbox/api/login: too many failed sign-ins for the name or from the
// address; Retry-After says when to try again.
const ProblemTooManyLogins = "urn:agora:problem:too-many-logins"

// List is the body of GET /inbox/api/questions.
type List struct {
	// Questions are the matching questions the user may see: pending ones
	// newest first, closed ones latest closed first, at most limit.
	Questions []*Question `json:"questions"`
	// Count is how many matched before the limit: of pending questions,
	// all of them; of closed ones, those on this page.
	Count int `json:"count"`
	// NextCursor continues the list: pass it as cursor for the next page
	// (of pending questions, the rows asked before this page's last; of
	// closed ones, the next page of history); absent on the last page.
	NextCursor string `json:"next_cursor,omitempty"`
}

// Detail is the body of GET /inbox/api/questions/{id}.
type Detail struct {
	Question *Question `json:"question"`
	// Earlier are the questions of the same thread's earlier rounds on
	// routes the caller may see, in round order, with their answers.
	Earlier []*Question `json:"earlier"`
	// Thread is the dispatcher's view of the thread; absent when the
	// dispatcher did not answer in time.
	Thread *Thread `json:"thread,omitempty"`
	// Trail is the thread's decision trail, oldest step first
	// (docs/inbox.md, "Decision trail and machine-made answers").
	Trail []Step `json:"trail"`
}

// LoginRequest is the body of POST /inbox/api/login: a name and password
// from the users file, or the dev token.
type LoginRequest struct {
	Name     string `json:"name,omitempty"`
	Password string `json:"password,omitempty"`
	Token    string `json:"token,omitempty"`
}

// LoginReply is the answer to a sign-in through the API: Token is a bearer
// token for Authorization: Bearer, valid until ExpiresAt or until the
// inbox restarts.
type LoginReply struct {
	Token     string    `json:"token"`
	User      string    `json:"user"`
	ExpiresAt time.Time `json:"expires_at"`
}

func statusProblem(status int, detail string) *client.Problem {
	p := &client.Problem{Status: status, Title: http.StatusText(status), Detail: detail}
	switch status {
	case http.StatusNotFound:
		p.Type = client.ProblemNotFound
	case http.StatusForbidden:
		p.Type = ProblemForbidden
	case http.StatusServiceUnavailable:
		p.Type = client.ProblemUnavailable
	case http.StatusRequestEntityTooLarge:
		p.Type = client.ProblemTooLarge
	default:
		p.Type = client.ProblemInvalidRequest
	}
	return p
}

// listStatuses maps the status query of the list call to a test.
var listStatuses = map[string]func(*Question) bool{
	"":              (*Question).Pending,
	"pending":       (*Question).Pending,
	StatusAsked:     (*Question).Pending,
	StatusAnswered:  func(q *Question) bool { return q.Status == StatusAnswered },
	StatusExpired:   func(q *Question) bool { return q.Status == StatusExpired },
	StatusWithdrawn: func(q *Question) bool { return q.Status == StatusWithdrawn },
	StatusJoined:    func(q *Question) bool { return q.Status == StatusJoined },
	"closed":        (*Question).Closed,
	"all":           func(*Question) bool { return true },
}

func (s *Server) apiList(w http.ResponseWriter, r *http.Request, id *identity) {
	query := r.URL.Query()
	status := query.Get("status")
	keep, ok := listStatuses[status]
	if !ok {
		problem.Write(w, r, problem.Invalid(client.FieldError{Field: "status", Message: "want pending, answered, expired, withdrawn, joined, closed or all"}))
		return
	}
	if !s.awaitReady(r.Context()) {
		problem.Write(w, r, statusProblem(http.StatusServiceUnavailable, "the inbox is still loading the questions"))
		return
	}
	f := filterFrom(query)
	match := func(q *Question) bool { return keep(q) && f.match(q) && s.visible(id.user, q) }
	out := List{Questions: []*Question{}}
	cursor := query.Get("cursor")
	pendingOnly := status == "" || status == "pending" || status == StatusAsked
	if pendingOnly || (status == "all" && cursor == "") {
		// Pending questions are in memory, newest first; a page of them
		// continues from the last row's position (pendingCursor).
		var after *pendingKey
		if pendingOnly && cursor != "" {
			k, ok := parsePendingCursor(cursor)
			if !ok {
				problem.Write(w, r, problem.Invalid(client.FieldError{Field: "cursor", Message: "not a cursor this inbox gave"}))
				return
			}
			after = &k
		}
		limit := parseLimit(query.Get("limit"), 1000, 10000)
		rows, total, more := s.store.pendingPage(after, limit, match, s.routeOnly(f, func(route string) bool { return s.shows(route) && id.user.may(route) }))
		out.Questions = append(out.Questions, rows...)
		out.Count = total
		if pendingOnly {
			if more {
				out.NextCursor = pendingCursor(rows[len(rows)-1])
			}
			writeJSON(w, http.StatusOK, out)
			return
		}
	}
	// Closed questions come from the bucket, a page at a time.
	page, err := s.history(r.Context(), cursor, parseLimit(query.Get("limit"), historyLimit, historyMax), match)
	var p *client.Problem
	switch {
	case errors.As(err, &p):
		problem.Write(w, r, p)
		return
	case err != nil:
		s.log.Warn("history list", "err", err)
		problem.Write(w, r, statusProblem(http.StatusServiceUnavailable, "the questions bucket could not be read; try again"))
		return
	}
	out.Questions = append(out.Questions, page.Rows...)
	out.Count += len(page.Rows)
	out.NextCursor = page.Next
	writeJSON(w, http.StatusOK, out)
}

// routeOnly returns, when f filters by route alone, the test of a route
// that store.pendingPage counts by (the routes the user sees, narrowed to
// f's); nil when f filters by more, and every record must be visited.
func (s *Server) routeOnly(f filter, sees func(string) bool) func(string) bool {
	if f.Kind != "" || f.Subagent != "" || f.Thread != "" {
		return nil
	}
	return func(route string) bool { return sees(route) && (f.Route == "" || route == f.Route) }
}

// pendingCursor is the position after q in the pending list: "p" then
// asked_at in Unix nanoseconds, a dot and the question id. (History
// cursors are stream sequences, digits only.)
func pendingCursor(q *Question) string {
	return "p" + strconv.FormatInt(q.AskedAt.UnixNano(), 10) + "." + q.QuestionID
}

func parsePendingCursor(c string) (pendingKey, bool) {
	rest, ok := strings.CutPrefix(c, "p")
	if !ok {
		return pendingKey{}, false
	}
	ns, id, ok := strings.Cut(rest, ".")
	n, err := strconv.ParseInt(ns, 10, 64)
	if !ok || err != nil || id == "" {
		return pendingKey{}, false
	}
	return pendingKey{AskedAt: time.Unix(0, n), ID: id}, true
}

func (s *Server) apiGet(w http.ResponseWriter, r *http.Request, id *identity) {
	q, ok := s.findAPI(w, r, id)
	if !ok {
		return
	}
	d := Detail{Question: q, Earlier: []*Question{}}
	th := s.thread(r.Context(), q.ThreadID)
	d.Earlier = append(d.Earlier, s.earlier(r.Context(), id.user, q, th)...)
	if th != nil {
		d.Thread = summarize(th)
	}
	d.Trail = append([]Step{}, s.trail(r.Context(), id.user, q, th)...)
	writeJSON(w, http.StatusOK, d)
}

// apiAnswer answers a question. The body is {"answer", "decision",
// "comment"}; the reply is the router's client.AnswerReply with the status
// 200 (accepted), 409 (already_answered: answered_by and answered_at name
// the winner), 422 (invalid), 404 (not_found) or 503 (retry).
func (s *Server) apiAnswer(w http.ResponseWriter, r *http.Request, id *identity) {
	var in answerInput
	q, ok := s.decodeFor(w, r, id, &in)
	if !ok {
		return
	}
	rep, code := s.submit(r.Context(), id.user, q, in, lifecycle.DoorInbox)
	writeJSON(w, code, rep)
}

func (s *Server) apiLogin(w http.ResponseWriter, r *http.Request) {
	var in LoginRequest
	if p := decodeBody(w, r, &in); p != nil {
		problem.Write(w, r, p)
		return
	}
	if wait, why, ok := s.logins.check(r, in.Name, time.Now()); !ok {
		s.metrics.logins.WithLabelValues("limited").Inc()
		w.Header().Set("Retry-After", strconv.Itoa(int(wait.Seconds())+1))
		problem.Write(w, r, &client.Problem{Type: ProblemTooManyLogins, Title: "Too many failed sign-ins", Status: http.StatusTooManyRequests,
			Detail: why + " " + waitText(wait)})
		return
	}
	u, ok := s.checkCredentials(in.Name, in.Password, strings.TrimSpace(in.Token))
	s.logins.result(r, in.Name, ok, time.Now())
	if !ok {
		s.metrics.logins.WithLabelValues("refused").Inc()
		problem.Write(w, r, &client.Problem{Type: client.ProblemUnauthorized, Title: "Unauthorized", Status: http.StatusUnauthorized,
			Detail: "wrong name or password (or dev token)"})
		return
	}
	tok, sess, err := s.sessions.create(r.Context(), u.name)
	if err != nil {
		s.log.Error("sign-in failed", "user", u.name, "err", err)
		problem.Write(w, r, statusProblem(http.StatusServiceUnavailable, "the session could not be stored; try again in a moment"))
		return
	}
	s.metrics.logins.WithLabelValues("ok").Inc()
	s.log.Info("signed in through the API", "user", u.name)
	writeJSON(w, http.StatusOK, LoginReply{Token: tok, User: u.name, ExpiresAt: sess.expires.UTC()})
}

// findAPI looks up the question of the path's id for the caller (find);
// when it is not there to answer, it writes the Problem and reports false.
func (s *Server) findAPI(w http.ResponseWriter, r *http.Request, id *identity) (*Question, bool) {
	q, status, msg := s.find(r.Context(), id.user, r.PathValue("id"))
	if status != http.StatusOK {
		problem.Write(w, r, statusProblem(status, msg))
		return nil, false
	}
	return q, true
}

// decodeFor decodes the request's JSON body into v (decodeBody), then
// looks up the question of the path's id (findAPI). On a refusal it writes
// the Problem and reports false.
func (s *Server) decodeFor(w http.ResponseWriter, r *http.Request, id *identity, v any) (*Question, bool) {
	if p := decodeBody(w, r, v); p != nil {
		problem.Write(w, r, p)
		return nil, false
	}
	return s.findAPI(w, r, id)
}

// decodeBody reads a JSON body strictly into v.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) *client.Problem {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxFormBytes))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return statusProblem(http.StatusRequestEntityTooLarge, "the body is larger than 64 KiB")
	case errors.Is(err, io.EOF):
		return problem.Invalid(client.FieldError{Field: "request", Message: "the body is empty; want a JSON object"})
	case err != nil:
		return problem.Invalid(client.FieldError{Field: "request", Message: "not a valid JSON body: " + err.Error()})
	}
	if dec.More() {
		return problem.Invalid(client.FieldError{Field: "request", Message: "want one JSON object"})
	}
	return nil
}
