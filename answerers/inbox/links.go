package inbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/agora-dispatch/agora/internal/problem"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/clip"
	"github.com/agora-dispatch/agora/pkg/answerlink"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// Signed answer links (docs/inbox.md, "Answer links"): GET /inbox/a/<token>
// shows what the link would send and never answers (mail scanners fetch
// links); POST answers once. The link's id is created in the KV bucket
// agora_answer_links before the answer is sent, so a second POST finds it
// and changes nothing; an answer that did not reach the router removes the
// id again, so the person can retry. answered_by is the link's audience.

// linkDoor holds what serving links needs.
type linkDoor struct {
	m     *answerlink.Minter
	ready chan struct{}
	kv    jetstream.KeyValue // agora_answer_links
}

func newLinkDoor(key string) (*linkDoor, error) {
	m, err := answerlink.New(key)
	if err != nil {
		return nil, fmt.Errorf("inbox: %w", err)
	}
	return &linkDoor{m: m, ready: make(chan struct{})}, nil
}

func (d *linkDoor) open(kv jetstream.KeyValue) {
	d.kv = kv
	close(d.ready)
}

// linkUse is the value of a used link's key.
type linkUse struct {
	QuestionID string    `json:"question_id"`
	Audience   string    `json:"audience"`
	MintedBy   string    `json:"minted_by,omitempty"`
	At         time.Time `json:"at"`
}

// linkData is the link page's data.
type linkData struct {
	Done              bool // a result page: no form
	Title, Notice     string
	NoticeKind        string // ok, warn, error
	Question, Context string
	Subagent, Route   string
	Audience, Option  string
	Open              bool
	Action, Expires   string
	Answer, Comment   string
}

// linkResult renders a page that ends the link's story (answered,
// refused); status is its HTTP status.
func (s *Server) linkResult(w http.ResponseWriter, status int, result, title, notice, kind string) {
	if s.links != nil {
		s.metrics.links.WithLabelValues(result).Inc()
	}
	s.render(w, status, "link", view{Title: title, Data: linkData{Done: true, Title: title, Notice: notice, NoticeKind: kind}})
}

// linkClaims opens the link of r, or writes the page that says why not.
func (s *Server) linkClaims(w http.ResponseWriter, r *http.Request) (answerlink.Claims, *Question, bool) {
	if s.links == nil {
		s.linkResult(w, http.StatusNotFound, "invalid", "Answer links are off",
			"This inbox does not serve answer links (it has no AGORA_ANSWER_LINK_KEY). Ask whoever sent it.", "error")
		return answerlink.Claims{}, nil, false
	}
	c, err := s.links.m.Open(r.PathValue("token"), time.Now())
	switch {
	case errors.Is(err, answerlink.ErrExpired):
		s.linkResult(w, http.StatusGone, "expired", "This link has expired",
			fmt.Sprintf("It was valid until %s. Nothing was sent. If the question still waits, answer it in the inbox.", fmtTime(c.Expires)), "warn")
		return c, nil, false
	case err != nil:
		s.linkResult(w, http.StatusNotFound, "invalid", "This link is not valid",
			"It is not a link this inbox issued, or it was changed or cut short (copy the whole link). Nothing was sent.", "error")
		return c, nil, false
	}
	if !s.awaitReady(r.Context()) {
		s.linkResult(w, http.StatusServiceUnavailable, "retry", "The inbox is starting", "Try the link again in a moment. Nothing was sent.", "error")
		return c, nil, false
	}
	q, ok := s.lookup(r.Context(), c.QuestionID)
	if !ok || !s.shows(q.Route) {
		s.linkResult(w, http.StatusNotFound, "closed", "This question is not here",
			"The inbox does not know this question (it may have been removed). Nothing was sent.", "warn")
		return c, nil, false
	}
	if !q.Pending() {
		s.linkResult(w, http.StatusConflict, "closed", "This question is closed", closedText(q), "warn")
		return c, nil, false
	}
	// A link answers on the route it was minted for, while its minter
	// may answer there (docs/inbox.md, "Answer links").
	if c.Route != "" && c.Route != q.Route {
		s.linkResult(w, http.StatusConflict, "moved", "This question moved",
			fmt.Sprintf("The link was made while the question was on route %s; it is on route %s now, where others answer it. Nothing was sent. Ask for a new link, or answer it in the inbox.", c.Route, q.Route), "warn")
		return c, nil, false
	}
	// A link answers the question as it was when minted
	// (docs/inbox.md, "Answer links").
	if c.ShownDigest != "" && c.ShownDigest != q.ShownDigest {
		s.linkResult(w, http.StatusConflict, "changed", "This question changed",
			"The question no longer shows what it showed when this link was made (it was reworded or asked anew), so the link's answer may not fit it. Nothing was sent. Look at the question again in the inbox, or ask for a new link.", "warn")
		return c, nil, false
	}
	if name, ok := strings.CutPrefix(c.MintedBy, "inbox:"); ok {
		if u, found := s.userNamed(name); !found || !u.may(q.Route) {
			s.linkResult(w, http.StatusForbidden, "revoked", "This link no longer answers",
				fmt.Sprintf("Whoever sent it (%s) may no longer answer questions on route %s. Nothing was sent. Answer it in the inbox, or ask someone who may for a new link.", name, q.Route), "error")
			return c, nil, false
		}
	}
	return c, q, true
}

// closedText says why a question no longer takes answers.
func closedText(q *Question) string {
	switch q.Status {
	case StatusAnswered:
		if q.AnsweredAt != nil {
			return fmt.Sprintf("It was already answered by %s at %s. Nothing was sent.", q.AnsweredBy, fmtTime(*q.AnsweredAt))
		}
		return "It was already answered. Nothing was sent."
	case StatusWithdrawn:
		return "It was withdrawn: the sub-agent's run no longer needs the answer. Nothing was sent."
	case StatusExpired:
		return "Its deadline passed before it was answered. Nothing was sent."
	}
	return "It no longer takes answers. Nothing was sent."
}

func (s *Server) linkForm(c answerlink.Claims, q *Question, path string) linkData {
	return linkData{
		Question: q.Question.Question, Context: clip.String(q.Context, 4000), Subagent: q.Subagent, Route: q.Route,
		Audience: c.Audience, Option: c.Option, Open: c.Open, Action: path, Expires: fmtTime(c.Expires),
	}
}

// linkPage is GET /inbox/a/{token}: it shows what the link would send.
func (s *Server) linkPage(w http.ResponseWriter, r *http.Request) {
	c, q, ok := s.linkClaims(w, r)
	if !ok {
		return
	}
	s.render(w, http.StatusOK, "link", view{Title: "Answer: " + clip.Line(q.Question.Question, 60), Data: s.linkForm(c, q, r.URL.Path)})
}

// linkAnswer is POST /inbox/a/{token}: it answers once.
func (s *Server) linkAnswer(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	if err := r.ParseForm(); err != nil {
		http.Error(w, "inbox: the form could not be read", http.StatusBadRequest)
		return
	}
	c, q, ok := s.linkClaims(w, r)
	if !ok {
		return
	}
	in := answerInput{Comment: r.PostForm.Get("comment"), ShownDigest: c.ShownDigest}
	switch {
	case c.Open:
		in.Answer = r.PostForm.Get("answer")
		if strings.TrimSpace(in.Answer) == "" {
			d := s.linkForm(c, q, r.URL.Path)
			d.Notice, d.NoticeKind, d.Comment = "Write an answer first.", "warn", in.Comment
			s.render(w, http.StatusUnprocessableEntity, "link", view{Title: "Answer", Data: d})
			return
		}
	case q.KindIs(lifecycle.QuestionApproval):
		in.Decision = c.Option
	default:
		in.Answer = c.Option
	}
	log := s.log.With("question_id", q.QuestionID, "audience", c.Audience, "minted_by", c.MintedBy, "link", c.ID)

	// Single use: the link's id is created before the answer goes out.
	uctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	use, _ := json.Marshal(linkUse{QuestionID: q.QuestionID, Audience: c.Audience, MintedBy: c.MintedBy, At: time.Now().UTC()})
	ttl := time.Until(c.Expires) + time.Minute
	rev, err := s.links.kv.Create(uctx, c.ID, use, jetstream.KeyTTL(ttl))
	switch {
	case errors.Is(err, jetstream.ErrKeyExists):
		log.Info("answer link used again; refused")
		s.linkResult(w, http.StatusGone, "used", "This link was already used",
			"Each link answers once. "+s.closedOr(r.Context(), q), "warn")
		return
	case err != nil:
		log.Error("answer link: record its use", "err", err)
		s.linkResult(w, http.StatusServiceUnavailable, "retry", "The answer did not get through",
			"The inbox could not record the link's use. Nothing was sent: try again in a moment.", "error")
		return
	}

	by := c.AnsweredBy()
	rep, status := s.submit(r.Context(), &user{name: by}, q, in, lifecycle.DoorLink)
	switch rep.Status {
	case client.AnswerAccepted:
		log.Info("answered through a link")
		s.linkResult(w, http.StatusOK, "accepted", "Thank you", "Your answer was sent as "+by+". The sub-agent resumes with it.", "ok")
	case client.AnswerRetry:
		// It did not reach the router: free the link for another try.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 5*time.Second)
		if err := s.links.kv.Delete(dctx, c.ID, jetstream.LastRevision(rev)); err != nil {
			log.Error("answer link: free it after a failed answer", "err", err)
		}
		cancel()
		s.linkResult(w, status, "retry", "The answer did not get through", refusal(rep), "error")
	case client.AnswerAlreadyAnswered:
		s.linkResult(w, status, "closed", "This question is closed", refusal(rep), "warn")
	case client.AnswerChanged:
		s.linkResult(w, status, "changed", "This question changed", refusal(rep), "warn")
	default:
		s.linkResult(w, status, "refused", "The answer was refused", refusal(rep), "error")
	}
}

// closedOr says how a question stands now, for a reused link.
func (s *Server) closedOr(ctx context.Context, q *Question) string {
	if now, ok := s.lookup(ctx, q.QuestionID); ok && !now.Pending() {
		return closedText(now)
	}
	return "Nothing was sent again."
}

// LinksRequest is the body of POST /inbox/api/questions/{id}/links.
type LinksRequest struct {
	// Audience is who the links are for (an e-mail address, a chat
	// handle); it becomes answered_by. Required.
	Audience string `json:"audience"`
	// TTL is how long the links last (a Go duration, as "72h"); default
	// until the question's deadline, or 7 days; at most 30 days.
	TTL string `json:"ttl,omitempty"`
}

// LinksReply is the reply of POST /inbox/api/questions/{id}/links.
type LinksReply struct {
	QuestionID string `json:"question_id"`
	Audience   string `json:"audience"`
	// MintedBy is who minted the links (inbox:<user>) and AnsweredBy who
	// an answer through them is recorded as; Route is the route they
	// answer on.
	MintedBy   string            `json:"minted_by"`
	AnsweredBy string            `json:"answered_by"`
	Route      string            `json:"route"`
	ExpiresAt  time.Time         `json:"expires_at"`
	Links      []answerlink.Link `json:"links"`
}

// apiLinks mints the links of a question for an audience: one per option
// (approve and reject for an approval), and one that opens a form when
// free text is allowed. The caller must be allowed to answer the route.
func (s *Server) apiLinks(w http.ResponseWriter, r *http.Request, id *identity) {
	if s.links == nil {
		problem.Write(w, r, statusProblem(http.StatusNotFound, "answer links are off: this inbox has no AGORA_ANSWER_LINK_KEY"))
		return
	}
	var in LinksRequest
	q, ok := s.decodeFor(w, r, id, &in)
	if !ok {
		return
	}
	if !q.Pending() {
		problem.Write(w, r, statusProblem(http.StatusConflict, "the question is "+q.Status+"; links are only for pending questions"))
		return
	}
	now := time.Now()
	exp := answerlink.Expiry(q.Question, now)
	if in.TTL != "" {
		d, err := time.ParseDuration(in.TTL)
		if err != nil || d <= 0 || d > answerlink.MaxTTL {
			problem.Write(w, r, problem.Invalid(client.FieldError{Field: "ttl", Message: fmt.Sprintf("%q: want a duration between 1s and %s, as 72h", in.TTL, answerlink.MaxTTL)}))
			return
		}
		exp = now.Add(d)
	}
	links, err := s.links.m.ForQuestion(s.baseURL(r), q.Question, in.Audience, "inbox:"+id.user.name, exp)
	if err != nil {
		problem.Write(w, r, problem.Invalid(client.FieldError{Field: "audience", Message: strings.TrimPrefix(err.Error(), "answerlink: ")}))
		return
	}
	s.log.Info("answer links minted", "question_id", q.QuestionID, "route", q.Route, "audience", in.Audience, "by", id.user.name, "links", len(links))
	c := answerlink.Claims{Audience: strings.TrimSpace(in.Audience), MintedBy: "inbox:" + id.user.name}
	writeJSON(w, http.StatusOK, LinksReply{QuestionID: q.QuestionID, Audience: c.Audience, MintedBy: c.MintedBy, AnsweredBy: c.AnsweredBy(), Route: q.Route,
		ExpiresAt: exp.UTC().Truncate(time.Second), Links: links})
}

// baseURL is the inbox as people open it: Config.PublicURL, or the
// request's own scheme and host.
func (s *Server) baseURL(r *http.Request) string {
	if s.cfg.PublicURL != "" {
		return s.cfg.PublicURL
	}
	scheme := "http"
	if secure(r) {
		scheme = "https"
	}
	return scheme + "://" + r.Host + Prefix
}
