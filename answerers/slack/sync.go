package slack

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	slackapi "github.com/slack-go/slack"

	"github.com/agora-dispatch/agora/internal/kvwatch"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// message is an entry of BucketMessages: where an open question's message
// is.
type message struct {
	QuestionID string `json:"question_id"`
	Route      string `json:"route"`
	Channel    string `json:"channel"` // the id chat.postMessage answered
	TS         string `json:"ts"`
	// Escalation is the question's escalation count when it was posted:
	// a question that comes back to the route later is posted again.
	Escalation int       `json:"escalation"`
	PostedAt   time.Time `json:"posted_at"`
	// Threads is how many threads the message says wait on the question
	// (0 in entries written before it was kept: one): it is updated as
	// threads join or leave.
	Threads int `json:"threads,omitempty"`
	// Shown is the shown digest of the question as the message shows it
	// (its buttons carry it): a question asked anew with other words is
	// shown anew (docs/slack.md, "Bound answers").
	Shown string `json:"shown,omitempty"`
}

// shown is how many threads the message says wait.
func (m message) shown() int { return max(1, m.Threads) }

func msgKey(route, qid string) string { return route + "." + qid }

// index is the in-memory copy of BucketMessages, kept by watchMessages
// (entries of every process serving these routes) and by handle (this
// process's own, at once).
type index struct {
	mu    sync.Mutex
	byKey map[string]indexed
	byQID map[string]map[string]bool
}

type indexed struct {
	m   message
	rev uint64
}

func newIndex() *index {
	return &index{byKey: map[string]indexed{}, byQID: map[string]map[string]bool{}}
}

func (x *index) put(key string, m message, rev uint64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if old, ok := x.byKey[key]; ok && old.rev > rev {
		return
	}
	x.byKey[key] = indexed{m, rev}
	if x.byQID[m.QuestionID] == nil {
		x.byQID[m.QuestionID] = map[string]bool{}
	}
	x.byQID[m.QuestionID][key] = true
}

func (x *index) remove(key string, rev uint64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	old, ok := x.byKey[key]
	if !ok || old.rev > rev {
		return
	}
	delete(x.byKey, key)
	delete(x.byQID[old.m.QuestionID], key)
	if len(x.byQID[old.m.QuestionID]) == 0 {
		delete(x.byQID, old.m.QuestionID)
	}
}

func (x *index) get(key string) (message, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	e, ok := x.byKey[key]
	return e.m, ok
}

// of returns the messages of a question with their revisions.
func (x *index) of(qid string) map[string]indexed {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := map[string]indexed{}
	for k := range x.byQID[qid] {
		out[k] = x.byKey[k]
	}
	return out
}

func (x *index) has(qid string) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return len(x.byQID[qid]) > 0
}

func (x *index) len() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return len(x.byKey)
}

// watchMessages keeps the index equal to BucketMessages until ctx ends,
// restarting a broken watch; loaded is closed after the first full load.
func (s *Server) watchMessages(ctx context.Context, loaded chan<- struct{}) {
	var once sync.Once
	s.watchKV(ctx, "messages", s.messages, func(e jetstream.KeyValueEntry) {
		if e == nil {
			once.Do(func() { close(loaded) })
			return
		}
		if e.Operation() != jetstream.KeyValuePut {
			s.index.remove(e.Key(), e.Revision())
			return
		}
		var m message
		if json.Unmarshal(e.Value(), &m) != nil || m.QuestionID == "" {
			return
		}
		s.index.put(e.Key(), m, e.Revision())
		s.enqueue(m.QuestionID)
	})
}

// watchQuestions looks at every question record that has a message when
// it changes, until ctx ends; the first pass covers what changed while no
// process ran.
func (s *Server) watchQuestions(ctx context.Context) {
	s.watchKV(ctx, "questions", s.questions, func(e jetstream.KeyValueEntry) {
		if e != nil && s.index.has(e.Key()) {
			s.enqueue(e.Key())
		}
	}, jetstream.IgnoreDeletes())
}

// watchKV hands every update of kv to each until ctx ends, and nil each
// time the values a watch starts with are all delivered; a broken watch is
// restarted with backoff.
func (s *Server) watchKV(ctx context.Context, name string, kv jetstream.KeyValue, each func(jetstream.KeyValueEntry), opts ...jetstream.WatchOpt) {
	backoff := 500 * time.Millisecond
	for ctx.Err() == nil {
		started := time.Now()
		err := watchOnce(ctx, kv, each, opts)
		if ctx.Err() != nil {
			return
		}
		if time.Since(started) > time.Minute {
			backoff = 500 * time.Millisecond
		}
		s.log.Warn("bucket watch broke; restarting it", "watch", name, "err", err, "retry_in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

// watchOnce runs one watch of kv until ctx ends (nil) or the watch breaks.
func watchOnce(ctx context.Context, kv jetstream.KeyValue, each func(jetstream.KeyValueEntry), opts []jetstream.WatchOpt) error {
	return kvwatch.Run(ctx, kv, each, func() { each(nil) }, opts...)
}

// enqueue asks the reconciler to look at a question; it never blocks (a
// full queue drops the request: the question's next change or the next
// start brings it back).
func (s *Server) enqueue(qid string) {
	select {
	case s.reconcileQ <- qid:
	default:
		s.log.Warn("reconcile queue full; question left for its next change", "question_id", qid)
	}
}

// reconciler brings messages up to date, one question at a time, until
// ctx ends.
func (s *Server) reconciler(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case qid := <-s.reconcileQ:
			s.reconcile(s.workCtx, qid)
		}
	}
}

// reconcile updates the messages of a question that closed or left their
// route, then forgets them, and those of a waiting question whose count
// of waiting threads changed. A failed update is tried again a little
// later.
func (s *Server) reconcile(ctx context.Context, qid string) {
	msgs := s.index.of(qid)
	if len(msgs) == 0 {
		return
	}
	q, err := s.record(ctx, qid)
	if err != nil {
		if !errors.Is(err, jetstream.ErrKeyNotFound) {
			s.log.Warn("question record unreadable; message update postponed", "question_id", qid, "err", err)
			s.retryLater(qid)
		}
		return
	}
	for key, e := range msgs {
		if q.Status == "asked" && q.Route == e.m.Route {
			if threadsWaiting(q) != e.m.shown() || q.ShownDigest != e.m.Shown {
				s.recount(ctx, key, e, q)
			}
			continue
		}
		blocks, event := s.closedBlocks(q, e.m.Route)
		text := fallbackText(q) + " — " + strings.ReplaceAll(event, "_", " ")
		err := s.api.call(ctx, "chat.update", s.api.attempts, func(ctx context.Context) error {
			_, _, _, err := s.api.c.UpdateMessageContext(ctx, e.m.Channel, e.m.TS,
				slackapi.MsgOptionText(text, true), slackapi.MsgOptionBlocks(blocks...))
			return err
		})
		log := s.log.With("route", e.m.Route, "question_id", qid, "channel", e.m.Channel, "ts", e.m.TS, "event", event)
		if err != nil && !errors.Is(err, errPermanent) {
			s.metrics.updates.WithLabelValues(event, "error").Inc()
			log.Warn("message not updated; will try again", "err", err)
			s.retryLater(qid)
			continue
		}
		if err != nil {
			// message_not_found, channel gone…: nothing left to correct.
			s.metrics.updates.WithLabelValues(event, "error").Inc()
			log.Warn("message cannot be updated; forgetting it", "err", err)
		} else {
			s.metrics.updates.WithLabelValues(event, "ok").Inc()
			log.Info("message updated")
		}
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = s.messages.Delete(dctx, key, jetstream.LastRevision(e.rev))
		cancel()
		if err != nil {
			log.Debug("message entry not deleted (changed or gone)", "err", err)
		}
		s.index.remove(key, e.rev)
	}
}

// recount rewrites the message of a waiting question whose threads
// joined or left it, or that shows something else now, as posted (answer
// controls included) with the new count and words, and records both in
// its entry.
func (s *Server) recount(ctx context.Context, key string, e indexed, q *lifecycle.Question) {
	n := threadsWaiting(q)
	log := s.log.With("route", e.m.Route, "question_id", q.QuestionID, "channel", e.m.Channel, "ts", e.m.TS, "threads", n)
	err := s.api.call(ctx, "chat.update", s.api.attempts, func(ctx context.Context) error {
		_, _, _, err := s.api.c.UpdateMessageContext(ctx, e.m.Channel, e.m.TS,
			slackapi.MsgOptionText(fallbackText(q), true), slackapi.MsgOptionBlocks(s.askedBlocks(q, time.Now())...))
		return err
	})
	switch {
	case err != nil && !errors.Is(err, errPermanent):
		log.Warn("message not updated with the threads waiting; will try again", "err", err)
		s.retryLater(q.QuestionID)
		return
	case err != nil:
		// The message is gone: the question's close has nothing to
		// update either.
		log.Warn("message cannot be updated; forgetting it", "err", err)
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_ = s.messages.Delete(dctx, key, jetstream.LastRevision(e.rev))
		cancel()
		s.index.remove(key, e.rev)
		return
	}
	log.Info("message updated with the threads waiting")
	m := e.m
	m.Threads, m.Shown = n, q.ShownDigest
	b, _ := json.Marshal(m)
	uctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	rev, err := s.messages.Update(uctx, key, b, e.rev)
	cancel()
	if err != nil {
		// Changed meanwhile (a repost) or unreachable: look again later.
		log.Debug("message entry not updated", "err", err)
		s.retryLater(q.QuestionID)
		return
	}
	s.index.put(key, m, rev)
}

// retryLater enqueues the question again in 30s (dropped after a stop:
// the next start looks at every open message).
func (s *Server) retryLater(qid string) {
	time.AfterFunc(30*time.Second, func() {
		if s.workCtx.Err() == nil {
			s.enqueue(qid)
		}
	})
}
