package inbox

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/kvwatch"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// Question statuses (lifecycle.Question.Status).
const (
	StatusAsked     = "asked"
	StatusAnswered  = "answered"
	StatusExpired   = "expired"
	StatusWithdrawn = "withdrawn"
	// StatusJoined is a question that joined another asked earlier on the
	// same route (lifecycle.StatusJoined): it waits with that one and is
	// never listed as waiting on its own.
	StatusJoined = lifecycle.StatusJoined
)

// Question is a question record as the inbox reads it from the
// agora_questions bucket: the fields of lifecycle.Question (the router's
// record is a superset of them) plus the answer's comment and how the
// thread went on. The record's partial state is never read.
type Question struct {
	lifecycle.Question
	// Comment came with the accepted answer.
	Comment string `json:"comment,omitempty"`
	// Outcome says how the thread went on after the question closed:
	// redispatched, failed:unanswered, failed:max-rounds, cancelled or
	// withdrawn.
	Outcome string `json:"outcome,omitempty"`
	// NextDispatchID is the dispatch that continues (or ends) the thread.
	NextDispatchID string    `json:"next_dispatch_id,omitempty"`
	UpdatedAt      time.Time `json:"updated_at"`
	// Traceparent is the question's trace (the router's), which an
	// answer's span continues (docs/tracing.md).
	Traceparent string `json:"traceparent,omitempty"`
	// Revision is the record's revision in the bucket.
	Revision uint64 `json:"revision"`
	// Declines are the declines in the record's history, oldest first:
	// who declined the question on which route, and why.
	Declines []Decline `json:"declines,omitempty"`
	// history is the router's history of attempts, for the decision
	// trail (trail.go).
	history []historyEntry
}

// Decline is one refusal to answer a question, as the router recorded it
// (docs/inbox.md, "Answering").
type Decline struct {
	At         time.Time `json:"at"`
	Route      string    `json:"route"` // the route it was declined on
	DeclinedBy string    `json:"declined_by,omitempty"`
	Reason     string    `json:"reason,omitempty"`
}

// Pending reports whether the question waits for an answer. A joined
// question waits too, but through the question it joined, which is the
// one listed.
func (q *Question) Pending() bool { return q.Status == StatusAsked }

// Closed reports whether the question closed: answered, expired or
// withdrawn (neither waiting nor joined to one that waits).
func (q *Question) Closed() bool { return q.Status != StatusAsked && q.Status != StatusJoined }

// closedAt is when a closed question closed, for the history's order.
func (q *Question) closedAt() time.Time {
	if q.AnsweredAt != nil {
		return *q.AnsweredAt
	}
	return q.UpdatedAt
}

// change is one change to the bucket as seen by the store: q is nil when
// the record was deleted.
type change struct {
	id string
	q  *Question
}

// subscriber receives changes; the store closes ch when the subscriber
// falls too far behind (the stream then ends and the browser reconnects).
type subscriber struct {
	ch chan change
}

// subscriberBuffer is how many changes a live stream may lag behind.
const subscriberBuffer = 256

// store is the inbox's view of the pending questions of the
// agora_questions bucket, kept current by a watch: a record that leaves
// "asked" is broadcast (open pages learn it closed) and then forgotten, so
// memory follows pending work, not history (docs/inbox.md). Closed
// questions are read from the bucket when asked for (Server.lookup,
// history.go). It is safe for concurrent use.
type store struct {
	mu sync.Mutex
	qs map[string]*Question
	// order holds the same records, oldest first by (asked_at,
	// question_id): a page newest first walks it from the end, so a page
	// costs its own size, not a sort of everything waiting.
	order  []*Question
	routes map[string]*facets // per route: its pending records, by kind and by sub-agent
	subs   map[*subscriber]struct{}
	ready  chan struct{} // closed once the first snapshot is loaded
	loaded bool
	notify chan struct{} // closed and replaced on every change
}

func newStore() *store {
	return &store{qs: map[string]*Question{}, routes: map[string]*facets{}, subs: map[*subscriber]struct{}{}, ready: make(chan struct{}), notify: make(chan struct{})}
}

// put keeps q while it is pending and tells the subscribers of it; a
// closed record is broadcast and dropped.
func (s *store) put(q *Question) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old, had := s.qs[q.QuestionID]
	if had && old.Revision == q.Revision {
		return
	}
	if had {
		s.unorderLocked(old)
	}
	if q.Pending() {
		s.qs[q.QuestionID] = q
		s.orderLocked(q)
	} else {
		s.forgetLocked(q.QuestionID)
	}
	s.broadcast(change{id: q.QuestionID, q: q})
}

// forgetLocked deletes id from s.qs. A map keeps the table of the most it
// ever held: once nothing is pending, the store starts again from an
// empty one, so memory follows what waits now, not what waited at most.
func (s *store) forgetLocked(id string) {
	delete(s.qs, id)
	if len(s.qs) == 0 {
		s.qs, s.order = map[string]*Question{}, nil
	}
}

// remove forgets a deleted record.
func (s *store) remove(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old, ok := s.qs[id]
	if !ok {
		return
	}
	s.unorderLocked(old)
	s.forgetLocked(id)
	s.broadcast(change{id: id})
}

// askedOrder orders records oldest first, by asked_at then question_id.
func askedOrder(a, b *Question) int {
	if c := a.AskedAt.Compare(b.AskedAt); c != 0 {
		return c
	}
	return cmp.Compare(a.QuestionID, b.QuestionID)
}

// orderLocked inserts q into s.order. Questions mostly arrive in the
// order they were asked, so this is mostly an append.
func (s *store) orderLocked(q *Question) {
	i, _ := slices.BinarySearchFunc(s.order, q, askedOrder)
	s.order = slices.Insert(s.order, i, q)
	f := s.routes[q.Route]
	if f == nil {
		f = &facets{kinds: map[string]int{}, subagents: map[string]int{}}
		s.routes[q.Route] = f
	}
	f.add(q, 1)
}

// unorderLocked removes q (the record as it was inserted) from s.order.
func (s *store) unorderLocked(q *Question) {
	if i, ok := slices.BinarySearchFunc(s.order, q, askedOrder); ok {
		s.order = slices.Delete(s.order, i, i+1)
		if f := s.routes[q.Route]; f != nil {
			if f.add(q, -1); f.n <= 0 {
				delete(s.routes, q.Route)
			}
		}
	}
}

// facets counts a route's pending records, in all, by kind and by
// sub-agent: what the pending page's count and filter choices need,
// without a visit of every record.
type facets struct {
	n                int
	kinds, subagents map[string]int
}

func (f *facets) add(q *Question, d int) {
	f.n += d
	count(f.kinds, kindOf(q), d)
	count(f.subagents, q.Subagent, d)
}

func count(m map[string]int, k string, d int) {
	if m[k] += d; m[k] <= 0 {
		delete(m, k)
	}
}

// pendingFacets returns, over the routes route accepts, how many records
// are pending and the routes, kinds and sub-agents among them (sorted).
func (s *store) pendingFacets(route func(string) bool) (n int, routes, kinds, subagents []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ks, ss := map[string]bool{}, map[string]bool{}
	for r, f := range s.routes {
		if !route(r) {
			continue
		}
		n += f.n
		if r != "" {
			routes = append(routes, r)
		}
		for k := range f.kinds {
			ks[k] = true
		}
		for a := range f.subagents {
			if a != "" {
				ss[a] = true
			}
		}
	}
	slices.Sort(routes)
	return n, routes, slices.Sorted(maps.Keys(ks)), slices.Sorted(maps.Keys(ss))
}

// pendingKey is a position in the pending order: a page continues with
// the records asked before it.
type pendingKey struct {
	AskedAt time.Time
	ID      string
}

// pendingPage returns up to limit pending records that keep accepts,
// newest first, starting after the position after (nil: the newest); how
// many match in all; and whether more follow the page. When keep tests
// the route alone (byRoute, the same test on a route name), the total
// comes from the per-route counts and the walk stops at the page's end, so
// a page costs its own size; otherwise the total needs a visit of every
// pending record (nothing is copied or sorted either way).
func (s *store) pendingPage(after *pendingKey, limit int, keep func(*Question) bool, byRoute func(string) bool) (rows []*Question, total int, more bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	end := len(s.order)
	if after != nil {
		end, _ = slices.BinarySearchFunc(s.order, &Question{Question: lifecycle.Question{AskedAt: after.AskedAt, QuestionID: after.ID}}, askedOrder)
	}
	// Counting visits every record, so the walk starts at the newest;
	// with per-route counts it starts at the page and stops after it.
	from := len(s.order) - 1
	if byRoute != nil {
		for r, f := range s.routes {
			if byRoute(r) {
				total += f.n
			}
		}
		from = end - 1
	}
	for i := from; i >= 0; i-- {
		if byRoute != nil && more {
			break
		}
		q := s.order[i]
		if !keep(q) {
			continue
		}
		if byRoute == nil {
			total++
		}
		if i >= end {
			continue
		}
		if len(rows) < limit {
			rows = append(rows, q)
		} else {
			more = true
		}
	}
	return rows, total, more
}

// loadedSnapshot marks the first snapshot complete and forgets records that
// were not in the latest one (deleted while the watch was down).
func (s *store) loadedSnapshot(seen map[string]bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, q := range s.qs {
		if !seen[id] {
			delete(s.qs, id)
			s.unorderLocked(q)
			s.broadcast(change{id: id})
		}
	}
	if !s.loaded {
		s.loaded = true
		close(s.ready)
	}
}

// broadcast hands c to every subscriber; s.mu is held.
func (s *store) broadcast(c change) {
	close(s.notify)
	s.notify = make(chan struct{})
	for sub := range s.subs {
		select {
		case sub.ch <- c:
		default: // too far behind: end its stream; the browser resyncs
			delete(s.subs, sub)
			close(sub.ch)
		}
	}
}

// subscribe registers a subscriber and returns it with a snapshot taken
// at the same instant, so no change falls between the two.
// subscribe returns a subscriber that receives every change from now on.
func (s *store) subscribe() *subscriber {
	s.mu.Lock()
	defer s.mu.Unlock()
	sub := &subscriber{ch: make(chan change, subscriberBuffer)}
	s.subs[sub] = struct{}{}
	return sub
}

// pendingOf is how many records of the routes route accepts are
// pending.
func (s *store) pendingOf(route func(string) bool) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for r, f := range s.routes {
		if route(r) {
			n += f.n
		}
	}
	return n
}

func (s *store) unsubscribe(sub *subscriber) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.subs[sub]; ok {
		delete(s.subs, sub)
		close(sub.ch)
	}
}

func (s *store) subscribers() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.subs)
}

func (s *store) get(id string) (*Question, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q, ok := s.qs[id]
	return q, ok
}

// waitUntil blocks until ok holds for the record id (nil when absent) or
// ctx ends; it reports whether ok held.
func (s *store) waitUntil(ctx context.Context, id string, ok func(*Question) bool) bool {
	for {
		s.mu.Lock()
		q := s.qs[id]
		ch := s.notify
		s.mu.Unlock()
		if ok(q) {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-ch:
		}
	}
}

// decodeQuestion reads a bucket entry; ok is false for values that are not
// question records.
func decodeQuestion(e jetstream.KeyValueEntry) (*Question, bool) {
	return decodeRecord(e.Key(), e.Value(), e.Revision())
}

// decodeRecord reads the record stored under key at revision.
func decodeRecord(key string, value []byte, revision uint64) (*Question, bool) {
	var q Question
	if err := json.Unmarshal(value, &q); err != nil || q.QuestionID == "" || q.QuestionID != key {
		return nil, false
	}
	q.Revision = revision
	// The router's history of attempts: its declines, and the steps of
	// the decision trail.
	var rec struct {
		History []historyEntry `json:"history"`
	}
	q.Declines = nil
	if json.Unmarshal(value, &rec) == nil {
		q.history = rec.History
		for _, h := range rec.History {
			if h.Result == "declined" {
				q.Declines = append(q.Declines, Decline{At: h.At, Route: h.Route, DeclinedBy: h.AnsweredBy, Reason: h.Reason})
			}
		}
	}
	return &q, true
}

// watchOnce runs one watch of the questions bucket: it loads every record,
// marks the snapshot loaded, then applies changes until ctx ends or the
// watch breaks.
func (s *store) watchOnce(ctx context.Context, kv jetstream.KeyValue, loaded func()) error {
	return watchBucket(ctx, kv, func(e jetstream.KeyValueEntry) {
		if e.Operation() != jetstream.KeyValuePut {
			s.remove(e.Key())
			return
		}
		if q, ok := decodeQuestion(e); ok {
			s.put(q)
		}
	}, func(seen map[string]bool) {
		s.loadedSnapshot(seen)
		loaded()
	})
}

// watchBucket runs one watch of kv until ctx ends (nil) or the watch
// breaks (an error). It calls apply with every entry — puts, deletes and
// purges, in the bucket's order — and, once the entries stored when it
// started have been applied, calls loaded once with the keys they held, so
// that the caller can forget what went while it was not watching.
func watchBucket(ctx context.Context, kv jetstream.KeyValue, apply func(jetstream.KeyValueEntry), loaded func(seen map[string]bool)) error {
	seen := map[string]bool{}
	initial := true
	err := kvwatch.Run(ctx, kv, func(e jetstream.KeyValueEntry) {
		if initial {
			seen[e.Key()] = true
		}
		apply(e)
	}, func() {
		initial = false
		loaded(seen)
	})
	if err != nil {
		return fmt.Errorf("inbox: %w", err)
	}
	return nil
}

// pendingCount is how many questions wait (the store holds only those).
func (s *store) pendingCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.order)
}
