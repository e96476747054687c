package inbox

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/agora-dispatch/agora/pkg/client"
)

// ProblemForbidden is the problem type of a 403: a route the user may not
// answer, or a request made with the session cookie but without the CSRF
// header.
const ProblemForbidden = "urn:agora:problem:forbidden"

// List is the body of GET /inbox/api/questions.
type List struct {
	// Questions are the matching questions the user may see: pending ones
	// newest first, closed ones latest closed first, at most limit.
	Questions []*Question `json:"questions"`
	// Count is how many matched before the limit.
	Count int `json:"count"`
}

// Detail is the body of GET /inbox/api/questions/{id}.
type Detail struct {
	Question *Question `json:"question"`
	// Earlier are the questions of the same thread's earlier rounds, in
	// round order, with their answers.
	Earlier []*Question `json:"earlier"`
	// Thread is the dispatcher's view of the thread; absent when the
	// dispatcher did not answer in time.
	Thread *Thread `json:"thread,omitempty"`
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

func writeProblem(w http.ResponseWriter, r *http.Request, p *client.Problem) {
	out := *p
	if out.Instance == "" {
		out.Instance = r.URL.Path
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(out.Status)
	_ = json.NewEncoder(w).Encode(out)
}

func problem(status int, detail string) *client.Problem {
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
	"closed":        func(q *Question) bool { return !q.Pending() },
	"all":           func(*Question) bool { return true },
}

func (s *Server) apiList(w http.ResponseWriter, r *http.Request, id *identity) {
	query := r.URL.Query()
	status := query.Get("status")
	keep, ok := listStatuses[status]
	if !ok {
		writeProblem(w, r, client.Invalid(client.FieldError{Field: "status", Message: "want pending, answered, expired, withdrawn, closed or all"}))
		return
	}
	if !s.awaitReady(r.Context()) {
		writeProblem(w, r, problem(http.StatusServiceUnavailable, "the inbox is still loading the questions"))
		return
	}
	f := filterFrom(query)
	out := List{Questions: []*Question{}}
	for _, q := range s.store.all() {
		if keep(q) && f.match(q) && s.visible(id.user, q) {
			out.Questions = append(out.Questions, q)
		}
	}
	switch status {
	case "", "pending", StatusAsked, "all":
		sortNewest(out.Questions)
	default:
		sortClosed(out.Questions)
	}
	out.Count = len(out.Questions)
	if limit := parseLimit(query.Get("limit"), 1000, 10000); len(out.Questions) > limit {
		out.Questions = out.Questions[:limit]
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) apiGet(w http.ResponseWriter, r *http.Request, id *identity) {
	q, status, msg := s.find(r.Context(), id.user, r.PathValue("id"))
	if status != http.StatusOK {
		writeProblem(w, r, problem(status, msg))
		return
	}
	d := Detail{Question: q, Earlier: []*Question{}}
	for _, e := range s.store.thread(q.ThreadID) {
		if e.QuestionID != q.QuestionID && e.Round < q.Round {
			d.Earlier = append(d.Earlier, e)
		}
	}
	d.Thread = s.thread(r.Context(), q.ThreadID)
	writeJSON(w, http.StatusOK, d)
}

// apiAnswer answers a question. The body is {"answer", "decision",
// "comment"}; the reply is the router's client.AnswerReply with the status
// 200 (accepted), 409 (already_answered: answered_by and answered_at name
// the winner), 422 (invalid), 404 (not_found) or 503 (retry).
func (s *Server) apiAnswer(w http.ResponseWriter, r *http.Request, id *identity) {
	var in answerInput
	if p := decodeBody(w, r, &in); p != nil {
		writeProblem(w, r, p)
		return
	}
	q, status, msg := s.find(r.Context(), id.user, r.PathValue("id"))
	if status != http.StatusOK {
		writeProblem(w, r, problem(status, msg))
		return
	}
	rep, code := s.submit(r.Context(), id.user, q, in)
	writeJSON(w, code, rep)
}

func (s *Server) apiLogin(w http.ResponseWriter, r *http.Request) {
	var in LoginRequest
	if p := decodeBody(w, r, &in); p != nil {
		writeProblem(w, r, p)
		return
	}
	u, ok := s.checkCredentials(in.Name, in.Password, strings.TrimSpace(in.Token))
	if !ok {
		s.metrics.logins.WithLabelValues("refused").Inc()
		writeProblem(w, r, &client.Problem{Type: client.ProblemUnauthorized, Title: "Unauthorized", Status: http.StatusUnauthorized,
			Detail: "wrong name or password (or dev token)"})
		return
	}
	s.metrics.logins.WithLabelValues("ok").Inc()
	tok, sess := s.sessions.create(u)
	s.log.Info("signed in through the API", "user", u.name)
	writeJSON(w, http.StatusOK, LoginReply{Token: tok, User: u.name, ExpiresAt: sess.expires.UTC()})
}

// decodeBody reads a JSON body strictly into v.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) *client.Problem {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxFormBytes))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return problem(http.StatusRequestEntityTooLarge, "the body is larger than 64 KiB")
	case errors.Is(err, io.EOF):
		return client.Invalid(client.FieldError{Field: "request", Message: "the body is empty; want a JSON object"})
	case err != nil:
		return client.Invalid(client.FieldError{Field: "request", Message: "not a valid JSON body: " + err.Error()})
	}
	if dec.More() {
		return client.Invalid(client.FieldError{Field: "request", Message: "want one JSON object"})
	}
	return nil
}
