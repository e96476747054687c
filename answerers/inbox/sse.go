package inbox

import (
	"bytes"
	"context"
	"net/http"
	"time"

	"github.com/agora-dispatch/agora/internal/answertext"
	"github.com/agora-dispatch/agora/internal/sse"
)

// Live updates (GET /inbox/events) are Server-Sent Events fed by the
// store's watch of the agora_questions bucket. A stream follows the
// pending questions the user sees that match its filter (query route,
// kind, subagent), or one question (query question), or only the count
// (query count: the pages with no live rows, such as history, keep the
// header's count and Live mark current). Events:
//
//	sync    {"items": [item…], "pending": n}  first, and the whole set: the page drops rows not in it
//	upsert  item, "pending"                   a question now waiting (new, or changed)
//	remove  {"id", "status", "message", "answer", "answered_by", "answered_at", "pending"}  no longer waiting, or out of the filter
//	count   {"pending"}                       the count changed by a question not shown here
//
// where item is {"id", "asked_at", "threads", "html"}: threads is how many
// threads wait on the question, html the row as the
// pending page renders it (escaped by html/template). "pending" counts the
// questions waiting for the user, every filter off. A comment is sent
// every keepalive; a stream that falls behind is closed, and the browser's
// reconnect starts with a fresh sync.

// keepalive is the interval of comment lines on an idle stream.
const keepalive = 25 * time.Second

// sseWriteTimeout bounds one write to a stream.
const sseWriteTimeout = 30 * time.Second

type liveItem struct {
	ID      string `json:"id"`
	AskedAt string `json:"asked_at"`
	Threads int    `json:"threads"`
	HTML    string `json:"html"`
	Pending int    `json:"pending"`
}

type liveRemoval struct {
	ID      string `json:"id"`
	Status  string `json:"status"`
	Message string `json:"message"`
	// Answer is the answer as one line (the decision of an approval).
	Answer     string     `json:"answer,omitempty"`
	AnsweredBy string     `json:"answered_by,omitempty"`
	AnsweredAt *time.Time `json:"answered_at,omitempty"`
	Pending    int        `json:"pending"`
}

type liveSync struct {
	Items   []liveItem `json:"items"`
	Pending int        `json:"pending"`
}

// live is one event stream's view: which questions it follows and what it
// has sent.
type live struct {
	s       *Server
	id      *identity
	f       filter
	only    string // the one question followed, if any
	count   bool   // the count only, no rows
	waiting int    // the count last sent
	shown   map[string]string
	stream  *sse.Stream
}

// match reports whether q is a row of this stream.
func (l *live) match(q *Question) bool {
	if l.count || q == nil || !q.Pending() || !l.s.visible(l.id.user, q) {
		return false
	}
	if l.only != "" {
		return q.QuestionID == l.only
	}
	return l.f.match(q)
}

// sees reports whether the stream's user sees route.
func (l *live) sees(route string) bool { return l.s.shows(route) && l.id.user.may(route) }

func (s *Server) events(w http.ResponseWriter, r *http.Request, id *identity) {
	if !s.awaitReady(r.Context()) {
		http.Error(w, "inbox: still loading the questions", http.StatusServiceUnavailable)
		return
	}
	l := &live{s: s, id: id, f: filterFrom(r.URL.Query()), only: r.URL.Query().Get("question"), count: r.URL.Query().Has("count"), shown: map[string]string{}}
	// Subscribed first, then read: a change in between comes again on
	// the subscription, and an upsert or removal is idempotent.
	sub := s.store.subscribe()
	defer s.store.unsubscribe(sub)
	items := l.rows()
	l.stream = sse.Start(w, "no-store", sseWriteTimeout)
	if !l.sync(r.Context(), items) {
		return
	}
	tick := time.NewTicker(keepalive)
	defer tick.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-s.stopping:
			return
		case <-id.signedOut():
			return // the browser's reconnect goes to the login page
		case <-tick.C:
			if !id.valid() || !l.stream.Comment("keepalive") {
				return
			}
		case c, ok := <-sub.ch:
			if !ok {
				return // fell behind: the browser reconnects and resyncs
			}
			if !id.valid() {
				return // expired
			}
			if !l.changed(c) {
				return
			}
		}
	}
}

// rows reads the questions the stream starts with.
func (l *live) rows() []*Question {
	var items []*Question
	switch {
	case l.count:
		l.only = "" // no rows: the count wins over a question named too
	case l.only != "":
		if q, ok := l.s.store.get(l.only); ok && l.match(q) {
			items = append(items, q)
		}
	default:
		items, _, _ = l.s.store.pendingPage(nil, l.s.cfg.PendingRows, l.match, l.s.routeOnly(l.f, l.sees)) // newest first
	}
	return items
}

// sync sends the stream's first events: the retry interval, the whole
// set of rows, and, for one question that closed before the stream
// opened, its removal at once.
func (l *live) sync(ctx context.Context, items []*Question) bool {
	// waiting counts what the user waits on, from the store's per-route
	// counts: a count event goes out when it changes.
	l.waiting = l.s.store.pendingOf(l.sees)
	now := time.Now()
	first := liveSync{Items: []liveItem{}, Pending: l.waiting}
	for _, q := range items {
		it, err := l.s.liveItem(q, now)
		if err != nil {
			l.s.log.Error("live: render row", "question_id", q.QuestionID, "err", err)
			continue
		}
		first.Items = append(first.Items, it)
		l.shown[q.QuestionID] = it.HTML
	}
	if !l.stream.Retry(2*time.Second) || !l.stream.JSON("sync", first) {
		return false
	}
	if l.only != "" && len(items) == 0 {
		if q, ok := l.s.lookup(ctx, l.only); ok && !q.Pending() && l.s.visible(l.id.user, q) {
			return l.stream.JSON("remove", l.s.removal(q.QuestionID, q, l.waiting))
		}
	}
	return true
}

// changed sends what a change of the store means to this stream: an
// upsert, a removal, a new count, or nothing. It reports false when the
// stream cannot be written.
func (l *live) changed(c change) bool {
	before := l.waiting
	l.waiting = l.s.store.pendingOf(l.sees)
	switch {
	case l.match(c.q):
		it, err := l.s.liveItem(c.q, time.Now())
		if err != nil {
			l.s.log.Error("live: render row", "question_id", c.id, "err", err)
			return true
		}
		if l.shown[c.id] == it.HTML && l.waiting == before {
			return true // a new revision that changes nothing shown
		}
		it.Pending = l.waiting
		l.shown[c.id] = it.HTML
		return l.stream.JSON("upsert", it)
	case l.shown[c.id] != "" || (l.only != "" && c.id == l.only):
		delete(l.shown, c.id)
		if c.q != nil && !l.s.visible(l.id.user, c.q) && l.only == "" {
			// Moved to a route the user does not see.
			return l.stream.JSON("remove", liveRemoval{ID: c.id, Status: c.q.Status, Message: "Moved to route " + c.q.Route, Pending: l.waiting})
		}
		return l.stream.JSON("remove", l.s.removal(c.id, c.q, l.waiting))
	case l.waiting != before:
		// Not shown here, but the count in the header changed.
		return l.stream.JSON("count", map[string]int{"pending": l.waiting})
	}
	return true
}

func (s *Server) removal(id string, q *Question, pending int) liveRemoval {
	if q == nil {
		return liveRemoval{ID: id, Status: "deleted", Message: "This question was removed.", Pending: pending}
	}
	msg := closedMessage(q)
	if q.Pending() {
		msg = "No longer matches the filter."
	}
	return liveRemoval{ID: id, Status: q.Status, Message: msg, Answer: answertext.Line(q.Answer, q.Decision), AnsweredBy: q.AnsweredBy, AnsweredAt: q.AnsweredAt, Pending: pending}
}

// liveItem renders q's row as on the pending page.
func (s *Server) liveItem(q *Question, now time.Time) (liveItem, error) {
	var buf bytes.Buffer
	if err := s.pages["pending"].ExecuteTemplate(&buf, "row", newQView(q, now)); err != nil {
		return liveItem{}, err
	}
	return liveItem{ID: q.QuestionID, AskedAt: isoTime(q.AskedAt), Threads: threadsWaiting(q), HTML: buf.String()}, nil
}
