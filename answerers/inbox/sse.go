package inbox

import (
	"bytes"
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

func (s *Server) events(w http.ResponseWriter, r *http.Request, id *identity) {
	if !s.awaitReady(r.Context()) {
		http.Error(w, "inbox: still loading the questions", http.StatusServiceUnavailable)
		return
	}
	f := filterFrom(r.URL.Query())
	only := r.URL.Query().Get("question")
	countOnly := r.URL.Query().Has("count")
	match := func(q *Question) bool {
		if countOnly || q == nil || !q.Pending() || !s.visible(id.user, q) {
			return false
		}
		if only != "" {
			return q.QuestionID == only
		}
		return f.match(q)
	}
	sees := func(route string) bool { return s.shows(route) && id.user.may(route) }
	// Subscribed first, then read: a change in between comes again on
	// the subscription, and an upsert or removal is idempotent.
	sub := s.store.subscribe()
	defer s.store.unsubscribe(sub)
	var items []*Question
	switch {
	case countOnly:
		only = "" // no rows: the count wins over a question named too
	case only != "":
		if q, ok := s.store.get(only); ok && match(q) {
			items = append(items, q)
		}
	default:
		items, _, _ = s.store.pendingPage(nil, s.cfg.PendingRows, match, s.routeOnly(f, sees)) // newest first
	}

	stream := sse.Start(w, "no-store", sseWriteTimeout)

	// waiting counts what the user waits on, from the store's per-route
	// counts: a count event goes out when it changes.
	waiting := s.store.pendingOf(sees)
	now := time.Now()
	shown := map[string]string{} // id → the row last sent
	first := liveSync{Items: []liveItem{}, Pending: waiting}
	for _, q := range items {
		it, err := s.liveItem(q, now)
		if err != nil {
			s.log.Error("live: render row", "question_id", q.QuestionID, "err", err)
			continue
		}
		first.Items = append(first.Items, it)
		shown[q.QuestionID] = it.HTML
	}
	if !stream.Retry(2*time.Second) || !stream.JSON("sync", first) {
		return
	}
	// One question that closed before the stream opened: say so at once.
	if only != "" && len(items) == 0 {
		if q, ok := s.lookup(r.Context(), only); ok && !q.Pending() && s.visible(id.user, q) {
			if !stream.JSON("remove", s.removal(q.QuestionID, q, waiting)) {
				return
			}
		}
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
			if !id.valid() || !stream.Comment("keepalive") {
				return
			}
		case c, ok := <-sub.ch:
			if !ok {
				return // fell behind: the browser reconnects and resyncs
			}
			if !id.valid() {
				return // expired
			}
			before := waiting
			waiting = s.store.pendingOf(sees)
			switch {
			case match(c.q):
				it, err := s.liveItem(c.q, time.Now())
				if err != nil {
					s.log.Error("live: render row", "question_id", c.id, "err", err)
					continue
				}
				if shown[c.id] == it.HTML && waiting == before {
					continue // a new revision that changes nothing shown
				}
				it.Pending = waiting
				shown[c.id] = it.HTML
				if !stream.JSON("upsert", it) {
					return
				}
			case shown[c.id] != "" || (only != "" && c.id == only):
				delete(shown, c.id)
				if c.q != nil && !s.visible(id.user, c.q) && only == "" {
					// Moved to a route the user does not see.
					if !stream.JSON("remove", liveRemoval{ID: c.id, Status: c.q.Status, Message: "Moved to route " + c.q.Route, Pending: waiting}) {
						return
					}
					continue
				}
				if !stream.JSON("remove", s.removal(c.id, c.q, waiting)) {
					return
				}
			case waiting != before:
				// Not shown here, but the count in the header changed.
				if !stream.JSON("count", map[string]int{"pending": waiting}) {
					return
				}
			}
		}
	}
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
