package router

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/kvwatch"
	"github.com/agora-dispatch/agora/internal/svc"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// pendingGrace is how long unpublished events may stay in a record before
// the scanner publishes them: the writer normally does so at once.
const pendingGrace = 3 * time.Second

// index keeps, for every question that still needs the router (asked, or
// with events to publish), when it is next due. Every replica builds it
// from a watch on the agora_questions bucket, so it is rebuilt from the
// stored records after a restart.
type index struct {
	mu sync.Mutex
	m  map[string]entry
	// order holds the asked questions, oldest first by (asked_at,
	// question_id): a page of waiting questions (agora.api.questions)
	// walks it from a cursor instead of sorting every one.
	order []askedRef
}

// askedRef is one asked question in index.order, with what a page
// filters on, so a filtered count scans one slice.
type askedRef struct {
	askedKey
	route, thread, dispatch, subagent string
	// joined are the threads and dispatches that joined the question
	// (docs/router.md, "Ask once"), so a filter by thread finds it for them too.
	joined []lifecycle.WaitingThread
}

// has reports whether the question waits for thread (and dispatch, when
// not empty): its asking thread or one that joined it.
func (r askedRef) has(thread, dispatch string) bool {
	if (thread == "" || r.thread == thread) && (dispatch == "" || r.dispatch == dispatch) {
		return true
	}
	for _, w := range r.joined {
		if (thread == "" || w.ThreadID == thread) && (dispatch == "" || w.DispatchID == dispatch) {
			return true
		}
	}
	return false
}

type entry struct {
	due     time.Time // next deadline or escalation step; zero when none
	pending bool      // events to publish
	seen    time.Time // when this replica saw the record's revision
	thread  string
	asked   bool      // asked, and its own thread waits on it
	joined  bool      // joined another question (docs/router.md, "Ask once")
	listed  bool      // in order: asked, waiting for an answer
	askedAt time.Time // when the question was asked, while it waits
}

// askedKey is a position in the order of asked questions.
type askedKey struct {
	at  time.Time
	qid string
}

func refOrder(a askedRef, b askedKey) int { return askedOrder(a.askedKey, b) }

func askedOrder(a, b askedKey) int {
	if c := a.at.Compare(b.at); c != 0 {
		return c
	}
	return strings.Compare(a.qid, b.qid)
}

func newIndex() *index { return &index{m: map[string]entry{}} }

func (x *index) set(qid string, r *record) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if old, ok := x.m[qid]; ok && old.listed {
		if i, found := slices.BinarySearchFunc(x.order, askedKey{old.askedAt, qid}, refOrder); found {
			x.order = slices.Delete(x.order, i, i+1)
		}
	}
	joined := r != nil && r.Status == lifecycle.StatusJoined
	if r == nil || (r.Status != statusAsked && !joined && len(r.Pending) == 0 && !r.owes()) {
		delete(x.m, qid)
		if len(x.m) == 0 {
			// A map keeps the table of the most it ever held: once
			// nothing waits, start again from an empty one.
			x.m, x.order = map[string]entry{}, nil
		}
		return
	}
	e := entry{due: r.due(), pending: len(r.Pending) > 0, seen: time.Now(), thread: r.ThreadID, asked: r.Status == statusAsked && !r.Left,
		joined: joined, listed: r.Status == statusAsked, askedAt: r.AskedAt}
	x.m[qid] = e
	if r.Status == statusAsked {
		k := askedKey{e.askedAt, qid}
		i, _ := slices.BinarySearchFunc(x.order, k, refOrder)
		ref := askedRef{askedKey: k, route: r.Route, thread: r.ThreadID, dispatch: r.DispatchID, subagent: r.Subagent}
		if r.Left {
			ref.thread, ref.dispatch = "", ""
		}
		for _, w := range r.WaitingThreads {
			if w.QuestionID != qid {
				ref.joined = append(ref.joined, w)
			}
		}
		x.order = slices.Insert(x.order, i, ref)
	}
}

// waiting returns up to limit asked questions that keep accepts (nil:
// every one), oldest first, after the position after (nil: from the
// oldest); how many match in all; and whether more follow the page. With
// no filter it costs the page; a filter's count scans the order once.
func (x *index) waiting(after *askedKey, limit int, keep func(askedRef) bool) (page []askedKey, total int, more bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	start := 0
	if after != nil {
		i, found := slices.BinarySearchFunc(x.order, *after, refOrder)
		if found {
			i++
		}
		start = i
	}
	if keep == nil {
		end := min(start+limit, len(x.order))
		for _, r := range x.order[start:end] {
			page = append(page, r.askedKey)
		}
		return page, len(x.order), end < len(x.order)
	}
	for i := range x.order {
		r := &x.order[i]
		if !keep(*r) {
			continue
		}
		total++
		if i < start {
			continue
		}
		if len(page) < limit {
			page = append(page, r.askedKey)
		} else {
			more = true
		}
	}
	return page, total, more
}

// dueAt returns the questions due at now.
func (x *index) dueAt(now time.Time) []string {
	x.mu.Lock()
	defer x.mu.Unlock()
	var out []string
	for qid, e := range x.m {
		if (!e.due.IsZero() && !now.Before(e.due)) || (e.pending && now.Sub(e.seen) >= pendingGrace) {
			out = append(out, qid)
		}
	}
	return out
}

// thread returns the questions a thread waits on: asked, or joined to
// another.
func (x *index) thread(threadID string) []string {
	x.mu.Lock()
	defer x.mu.Unlock()
	var out []string
	for qid, e := range x.m {
		if (e.asked || e.joined) && e.thread == threadID {
			out = append(out, qid)
		}
	}
	return out
}

// askedIDs returns the questions waiting for an answer, oldest first,
// then those that joined another.
func (x *index) askedIDs() []string {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := make([]string, len(x.order))
	for i, r := range x.order {
		out[i] = r.qid
	}
	for qid, e := range x.m {
		if e.joined {
			out = append(out, qid)
		}
	}
	return out
}

// oldest returns how long the longest-waiting question has waited; 0
// when none waits. (A record without asked_at sorts first and is skipped.)
func (x *index) oldest(now time.Time) time.Duration {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, r := range x.order {
		if !r.at.IsZero() {
			return max(0, now.Sub(r.at))
		}
	}
	return 0
}

// asked counts the questions waiting for an answer.
func (x *index) asked() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return len(x.order)
}

// watch keeps the index current until ctx ends. It returns once the
// stored records are all indexed; done is closed when the watch stops.
func (s *Service) watch(ctx context.Context) (done <-chan struct{}, err error) {
	done, err = kvwatch.Start(ctx, s.store.kv, func(e jetstream.KeyValueEntry) {
		if e.Operation() != jetstream.KeyValuePut {
			s.idx.set(e.Key(), nil)
			return
		}
		var r record
		if err := json.Unmarshal(e.Value(), &r); err != nil || r.QuestionID == "" {
			return
		}
		s.idx.set(e.Key(), &r)
	})
	if err != nil {
		return nil, fmt.Errorf("router: %w", err)
	}
	return done, nil
}

// scanLoop acts on due questions every Tick until loop ends, and sweeps
// for cancelled threads at start, after each reconnect to NATS — the
// times it may have missed a cancel-thread message — and every
// CancelSweep, which only bounds a miss while connected (a slow-consumer
// drop); the actions it starts run with work, so a stop lets
// them finish.
func (s *Service) scanLoop(loop, work context.Context, p *svc.Pool) {
	t := time.NewTicker(s.cfg.Tick)
	defer t.Stop()
	reconnected := s.nc.StatusChanged(nats.CONNECTED)
	defer s.nc.RemoveStatusListener(reconnected)
	var swept time.Time
	for {
		if time.Since(swept) >= s.cfg.CancelSweep {
			s.sweepCancels(loop, work, p)
			swept = time.Now()
			s.metrics.cancelSweeps.Inc()
		}
		s.scan(loop, work, p)
		s.metrics.scans.Inc()
		select {
		case <-loop.Done():
			return
		case <-t.C:
		case <-reconnected:
			// Cancels published while this router was away reached only
			// the records' marks.
			swept = time.Time{}
		}
		s.cancelled.prune(time.Now())
	}
}

// sweepCancels withdraws the asked questions whose threads were cancelled
// while no router heard the cancel-thread message (it was down, or
// disconnected): the dispatcher's mark on the paused dispatch's record
// says so. Without the sweep such a question would wait for its next
// answer or deadline.
func (s *Service) sweepCancels(loop, work context.Context, p *svc.Pool) {
	s.eachQuestion(loop, p, s.idx.askedIDs(), func(qid string) { s.checkCancel(work, qid) })
}

// eachQuestion runs f for each of qids on p, skipping a question another
// goroutine has in hand (inflight) and handing out no more once loop ends.
func (s *Service) eachQuestion(loop context.Context, p *svc.Pool, qids []string, f func(qid string)) {
	for _, qid := range qids {
		if loop.Err() != nil {
			return
		}
		if _, busy := s.inflight.LoadOrStore(qid, true); busy {
			continue
		}
		p.Go(func() {
			defer s.inflight.Delete(qid)
			f(qid)
		})
	}
}

// checkCancel withdraws an asked question whose thread was cancelled.
func (s *Service) checkCancel(ctx context.Context, qid string) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	r, _, err := s.store.get(ctx, qid)
	if err != nil || (r.Status != statusAsked && r.Status != lifecycle.StatusJoined) || r.Left {
		return
	}
	if cr, ok := s.cancelRequested(ctx, r, nil); ok {
		cr.ThreadID = r.ThreadID
		s.withdrawQuestion(ctx, qid, cr, "sweep")
	}
}

func (s *Service) scan(loop, work context.Context, p *svc.Pool) {
	s.eachQuestion(loop, p, s.idx.dueAt(time.Now()), func(qid string) { s.advance(work, qid) })
}

// cancelMemo remembers recent cancels of paused threads, for a
// needs_input that is processed after its thread's cancel arrived.
type cancelMemo struct {
	mu sync.Mutex
	m  map[string]memoEntry
}

type memoEntry struct {
	req lifecycle.CancelRequest
	at  time.Time
}

// cancelMemoTTL is how long a thread cancel is remembered.
const cancelMemoTTL = 15 * time.Minute

func newCancelMemo() *cancelMemo { return &cancelMemo{m: map[string]memoEntry{}} }

func (c *cancelMemo) add(req lifecycle.CancelRequest) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.m[req.ThreadID] = memoEntry{req: req, at: time.Now()}
}

// get returns the remembered cancel of a thread's paused dispatch.
func (c *cancelMemo) get(threadID, dispatchID string) (lifecycle.CancelRequest, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[threadID]
	if !ok || (e.req.DispatchID != "" && e.req.DispatchID != dispatchID) {
		return lifecycle.CancelRequest{}, false
	}
	return e.req, true
}

func (c *cancelMemo) prune(now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, e := range c.m {
		if now.Sub(e.at) > cancelMemoTTL {
			delete(c.m, k)
		}
	}
}
