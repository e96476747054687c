package router

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/agora-dispatch/agora/internal/clip"
	"github.com/agora-dispatch/agora/internal/crashpoint"
	"github.com/agora-dispatch/agora/internal/jserr"
	"github.com/agora-dispatch/agora/internal/problem"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/kvsnap"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// Ask once (docs/router.md, "Ask once"): a question that matches one still
// waiting on the same route joins it instead of being asked again, one
// answer resumes every waiting thread, and a route may remember its
// answers for later questions that match.
//
// The agora_decisions bucket holds open.<match> (the id of the question
// waiting for that match, created with compare-and-set so two routers
// agree on it) and memory.<match> (a remembered decision, as JSON, with the
// route's remember as its own TTL). A key the router removes (a question
// ended, a decision replaced or forgotten) is purged with the retention as
// the marker's TTL, so the bucket holds nothing for it afterwards.

// Key prefixes in the agora_decisions bucket.
const (
	openPrefix   = "open."
	memoryPrefix = "memory."
)

// memoryAnsweredBy is the answered_by prefix of an answer from memory;
// suggestedAnsweredBy that of a suggestion taken as the answer.
const (
	memoryAnsweredBy    = "memory:"
	suggestedAnsweredBy = "suggested:"
)

// joinedDropAfter is how long a fan-out waits for a joined question's
// record that its router announced and never wrote (it crashed, and its
// needs_input was redelivered elsewhere and is still coming) before the
// fan-out gives it up.
const joinedDropAfter = 10 * time.Minute

// matchKey names what a question asks on route: its dedupe_key when the
// sub-agent gave one, else its sub-agent, question text, options and kind;
// and owner, the principal that dispatched its thread, unless the route
// shares across principals. Each field is length-prefixed, so no two
// different questions share the bytes hashed.
func matchKey(rt *Route, ni *lifecycle.NeedsInput, owner string) string {
	h := sha256.New()
	put := func(s string) { fmt.Fprintf(h, "%d:%s;", len(s), s) }
	put(rt.Name)
	// A thread's owner's questions are its own: another principal's
	// thread asking the same neither joins them nor reuses their answers.
	// Threads with no owner (dispatched through the NATS API) keep the
	// key they always had.
	if owner != "" && !rt.ShareAcrossPrincipals {
		put("principal")
		put(owner)
	}
	if ni.DedupeKey != "" {
		put("dedupe_key")
		put(ni.DedupeKey)
		// A dedupe_key is a sub-agent's own: another sub-agent on the
		// route naming the same key neither joins its questions nor
		// reuses their answers, unless the route's operator says so.
		if !rt.ShareAcrossSubagents {
			put("subagent")
			put(ni.Subagent)
		}
	} else {
		put("question")
		put(ni.Subagent)
		put(ni.Question)
		put(strconv.Itoa(len(ni.Options)))
		for _, o := range ni.Options {
			put(o)
		}
		put(string(ni.Kind))
	}
	return hex.EncodeToString(h.Sum(nil))[:32]
}

// contextDigest names a question's context in a remembered decision, so
// a decision answers only a question that shows the same (empty for none).
func contextDigest(c string) string {
	if c == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(c))
	return hex.EncodeToString(sum[:])
}

// sameShown reports whether the question r shows a person — its text,
// context, options, kind and partial state, as its shown digest — is the
// one decision d was made on: memory answers only what the person who
// made the decision saw. A decision with no shown digest answers nothing.
func sameShown(r *record, d *client.Decision) bool {
	return d.ShownDigest != "" && d.ShownDigest == r.ShownDigest &&
		d.Question == r.Question.Question && slices.Equal(d.Options, r.Options) && lifecycle.QuestionKind(d.Kind) == r.Kind && d.ContextSHA256 == contextDigest(r.Context)
}

// remembers reports whether rt keeps the answers of questions of kind.
func remembers(rt *Route, kind lifecycle.QuestionKind) bool {
	return rt != nil && rt.Remember > 0 && (kind != lifecycle.QuestionApproval || rt.RememberApprovals)
}

// maxWaitingThreads bounds the threads one question lists (about 170
// bytes each in its record, which must stay well under NATS's 1 MiB
// message): the next matching question is asked on its own and is joined
// from then on. A variable for tests.
var maxWaitingThreads = 2000

// errJoinLater reports a matching question whose record is not written
// yet: the joiner waits for it (a redelivery) rather than ask twice.
var errJoinLater = errors.New("router: the matching question is being recorded")

// holder finds the question r would join: the one holding r's match. It
// returns "" when r holds the match itself (claimed now, or by an earlier
// delivery of r), so r is asked. r is not written yet: it is listed on the
// question it joins only after its record names it (seat).
func (s *Service) holder(ctx context.Context, r *record) (string, error) {
	key := openPrefix + r.MatchKey
	for range maxCAS {
		// Most questions are new: claim first, read only when taken.
		rev, err := s.decisions.Create(ctx, key, []byte(r.QuestionID))
		if err == nil {
			r.OpenRev = rev
			return "", nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return "", fmt.Errorf("router: claim %s: %w", key, err)
		}
		e, err := s.decisions.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // released meanwhile
		}
		if err != nil {
			return "", fmt.Errorf("router: read %s: %w", key, err)
		}
		if lid := string(e.Value()); lid != r.QuestionID {
			return lid, nil
		}
		r.OpenRev = e.Revision()
		return "", nil // a redelivery of the question that holds the match
	}
	return "", fmt.Errorf("router: %s: %d conflicting writers", key, maxCAS)
}

// seat lists r, recorded as joined to question r.JoinedTo at revision rev,
// among that question's waiting threads. When that question cannot take r
// (it ended without r, its match changed, it is full, or its record never
// came), r moves: to the question that holds the match now, or, claiming
// the match, it is asked on its own. It returns r as recorded at the end.
//
// A thread is written joined before it is listed, so a question lists
// only threads whose records name it: a crash between the two leaves a
// joined record that no question lists, which the redelivery of its
// needs_input seats (docs/router.md, "Ask once"). Listed first, a crash
// would leave a thread listed on a question that, once answered, keeps no
// hold on the match, and the redelivery would find another holder.
func (s *Service) seat(ctx context.Context, r *record, rev uint64) (*record, error) {
	crashpoint.Here(crashpoint.RouterJoined) // docs/chaos.md
	if seatStep != nil {
		if err := seatStep(r.QuestionID); err != nil {
			return r, err
		}
	}
	for range maxCAS {
		lid := r.JoinedTo
		joined, err := s.joinQuestion(ctx, lid, r)
		switch {
		case err == nil && joined:
			return r, nil
		case err != nil && !errors.Is(err, errNoQuestion):
			return r, err
		}
		next, openRev, err := s.moveOn(ctx, r, lid, errors.Is(err, errNoQuestion))
		if err != nil {
			return r, err // errJoinLater, or a failure
		}
		if next == "" && openRev == 0 {
			continue // the match changed as it was claimed: look again
		}
		now := time.Now().UTC()
		w, wrev, _, err := s.store.updateFrom(ctx, r.QuestionID, r, rev, func(x *record) (bool, error) {
			if x.Status != lifecycle.StatusJoined || x.JoinedTo != lid {
				return false, nil // cancelled, ended or moved meanwhile
			}
			if next != "" {
				x.JoinedTo = next
				x.addHistory(attempt{At: now, Via: "join", Result: "joined", Reason: "question " + lid + " ended without this thread; asked already by question " + next + ", which answers it too"})
				return true, nil
			}
			x.Status, x.JoinedTo, x.OpenRev, x.AskedAt = statusAsked, "", openRev, now
			x.addHistory(attempt{At: now, Via: "join", Result: "asked", Reason: "question " + lid + " ended without this thread: asked on its own"})
			return true, x.queueQuestion(lifecycle.QuestionAsked, "question "+lid+" it joined ended without it")
		})
		if err != nil {
			return r, err
		}
		r, rev = w, wrev
		if r.Status != lifecycle.StatusJoined {
			return r, nil
		}
	}
	return r, fmt.Errorf("router: seat question %s: %d conflicting writers", r.QuestionID, maxCAS)
}

// seatStep, when set (by tests only, before any router starts), is
// called as a joined question, written already, is about to be listed: a
// test fails the listing there to show the redelivery seats it.
var seatStep func(qid string) error

// moveOn finds where r goes when question lid would not list it: next,
// the question now holding r's match, or r itself, having claimed the
// match at openRev. Both zero: read again (the match changed meanwhile).
// missing reports that lid has no record; while it is young, its router
// may still be writing it (errJoinLater).
func (s *Service) moveOn(ctx context.Context, r *record, lid string, missing bool) (next string, openRev uint64, err error) {
	key := openPrefix + r.MatchKey
	e, err := s.decisions.Get(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		openRev, err = s.decisions.Create(ctx, key, []byte(r.QuestionID))
	case err != nil:
		return "", 0, fmt.Errorf("router: read %s: %w", key, err)
	case string(e.Value()) == r.QuestionID:
		return "", e.Revision(), nil // claimed by an earlier try
	case string(e.Value()) != lid:
		return string(e.Value()), 0, nil
	case missing && time.Since(e.Created()) < s.cfg.RecordWait:
		return "", 0, errJoinLater
	default:
		// lid holds the match but cannot take r: take its place.
		openRev, err = s.decisions.Update(ctx, key, []byte(r.QuestionID), e.Revision())
	}
	if isStale(err) {
		return "", 0, nil
	}
	if err != nil {
		return "", 0, fmt.Errorf("router: claim %s: %w", key, err)
	}
	return "", openRev, nil
}

// joinQueues gathers the joins to one question that arrive while its
// record is being written, so they are written together: thirty threads
// of one fan-out join with a few compare-and-sets, not thirty that lose
// to each other and read the growing record again.
type joinQueues struct {
	mu sync.Mutex
	m  map[string]*joinBatch
}

type joinBatch struct{ reqs []*joinReq }

type joinReq struct {
	r    *record
	done chan joinResult
}

type joinResult struct {
	joined bool
	err    error
}

// joinQuestion lists r's thread on question lid while it is asked. joined
// reports that r's thread is on it (now or from an earlier try); false:
// r must not join it. The first caller for lid
// writes every join queued meanwhile, batch after batch, until none waits.
func (s *Service) joinQuestion(ctx context.Context, lid string, r *record) (bool, error) {
	req := &joinReq{r: r, done: make(chan joinResult, 1)}
	q := &s.joins
	q.mu.Lock()
	if q.m == nil {
		q.m = map[string]*joinBatch{}
	}
	b, running := q.m[lid]
	if !running {
		b = &joinBatch{}
		q.m[lid] = b
	}
	b.reqs = append(b.reqs, req)
	q.mu.Unlock()
	if !running {
		for {
			q.mu.Lock()
			reqs := b.reqs
			b.reqs = nil
			if len(reqs) == 0 {
				delete(q.m, lid)
				q.mu.Unlock()
				break
			}
			q.mu.Unlock()
			s.writeJoins(ctx, lid, reqs)
		}
	}
	res := <-req.done
	return res.joined, res.err
}

// writeJoins lists the threads of reqs on question lid with one
// compare-and-set (retried on conflict) and tells each how it went.
func (s *Service) writeJoins(ctx context.Context, lid string, reqs []*joinReq) {
	res := make([]joinResult, len(reqs))
	_, _, err := s.store.update(ctx, lid, func(l *record) (bool, error) {
		changed := false
		for i, q := range reqs {
			r := q.r
			res[i] = joinResult{}
			// Listed and still owed an ending: joined (an earlier try got
			// this far). Listed on a question that ended without owing it
			// one (its fan-out gave up on it) is not joined.
			if (l.Status == statusAsked && l.waitingOn(r.QuestionID)) || slices.Contains(l.Fanout, r.QuestionID) {
				res[i].joined = true
				continue
			}
			if l.Status != statusAsked || l.MatchKey != r.MatchKey || len(l.WaitingThreads) >= maxWaitingThreads {
				continue
			}
			if len(l.WaitingThreads) == 0 && !l.Left {
				l.WaitingThreads = append(l.WaitingThreads, l.thread())
			}
			l.WaitingThreads = append(l.WaitingThreads, r.thread())
			res[i] = joinResult{joined: true}
			changed = true
		}
		return changed, nil
	})
	for i, q := range reqs {
		if err != nil {
			res[i] = joinResult{err: err}
		}
		q.done <- res[i]
	}
}

// thread is r's entry in a waiting_threads list.
func (r *record) thread() lifecycle.WaitingThread {
	return lifecycle.WaitingThread{QuestionID: r.QuestionID, DispatchID: r.DispatchID, ThreadID: r.ThreadID, Subagent: r.Subagent, AskedAt: r.AskedAt}
}

// waitingOn reports whether question qid's thread is listed on r.
func (r *record) waitingOn(qid string) bool {
	return slices.ContainsFunc(r.WaitingThreads, func(w lifecycle.WaitingThread) bool { return w.QuestionID == qid })
}

// joinedIDs are the questions that joined r.
func (r *record) joinedIDs() []string {
	var out []string
	for _, w := range r.WaitingThreads {
		if w.QuestionID != r.QuestionID {
			out = append(out, w.QuestionID)
		}
	}
	return out
}

// hasJoined reports whether any question joined r and still waits on it.
func (r *record) hasJoined() bool { return len(r.joinedIDs()) > 0 }

// asJoined turns r, a new question, into one that joined lid: it is not
// asked on its own.
func (r *record) asJoined(lid string) {
	r.Status, r.JoinedTo = lifecycle.StatusJoined, lid
	r.Pending, r.Asks = nil, 0
	r.addHistory(attempt{At: time.Now().UTC(), Via: "join", Result: "joined", Reason: "asked already by question " + lid + ", which answers this thread too"})
}

// settled marks the end of an asked question for what ask once still
// owes: the joined questions to end alike, the open.<match> key to
// release, the answer to remember.
func (s *Service) settled(r *record, remember bool) {
	r.Fanout = r.joinedIDs()
	if r.MatchKey != "" && r.JoinedTo == "" {
		r.Release = true
	}
	if remember {
		r.Memorize = true
	}
}

// followUp does what an ended question still owes (record.Fanout, Release,
// Memorize), then clears it. The scanner calls it again for whatever a
// crash left; every step is idempotent.
func (s *Service) followUp(ctx context.Context, qid string) error {
	r, rev, err := s.store.get(ctx, qid)
	if err != nil {
		return err
	}
	if len(r.Fanout) == 0 && !r.Release && !r.Memorize {
		return nil
	}
	var (
		mu       sync.Mutex
		done     []string
		elsewise []string // done, but not by this question's answer
		errs     error
		wg       sync.WaitGroup
		sem      = make(chan struct{}, fanoutWidth)
	)
	for _, mid := range r.Fanout {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if fanoutStep != nil {
				fanoutStep(mid)
			}
			end, err := s.endJoined(ctx, mid, r)
			mu.Lock()
			defer mu.Unlock()
			errs = errors.Join(errs, err)
			if end != joinedPending {
				done = append(done, mid)
			}
			if end == joinedElsewhere {
				elsewise = append(elsewise, mid)
			}
		})
	}
	wg.Wait()
	memorized := false
	if r.Memorize {
		if err := s.remember(ctx, r); err != nil {
			errs = errors.Join(errs, err)
		} else {
			memorized = true
		}
	}
	released := false
	if r.Release && len(done) == len(r.Fanout) {
		if err := s.release(ctx, r); err != nil {
			errs = errors.Join(errs, err)
		} else {
			released = true
		}
	}
	if n := len(r.WaitingThreads); n > 0 && len(done) > 0 && len(done) == len(r.Fanout) {
		s.metrics.threads.WithLabelValues(r.Origin).Observe(float64(n))
	}
	_, _, _, err = s.store.updateFrom(ctx, qid, r, rev, func(r *record) (bool, error) {
		n, w := len(r.Fanout), len(r.WaitingThreads)
		r.Fanout = slices.DeleteFunc(r.Fanout, func(id string) bool { return slices.Contains(done, id) })
		// A thread this answer did not end is not one it answered: the
		// record lists only the threads it resumed (docs/router.md, "Ask once").
		r.WaitingThreads = slices.DeleteFunc(r.WaitingThreads, func(t lifecycle.WaitingThread) bool { return slices.Contains(elsewise, t.QuestionID) })
		for _, mid := range elsewise {
			r.addHistory(attempt{At: time.Now().UTC(), Via: "join", Result: "unlisted",
				Reason: "question " + mid + " was listed on this one but did not wait on it (asked on its own, or never recorded): its thread is not resumed by this answer"})
		}
		changed := len(r.Fanout) != n || len(r.WaitingThreads) != w || (memorized && r.Memorize) || (released && r.Release)
		if memorized {
			r.Memorize = false
		}
		if released {
			r.Release = false
		}
		return changed, nil
	})
	return errors.Join(errs, err)
}

// fanoutStep, when set (by tests only, before any router starts), is
// called before each joined question of a fan-out: a test stops a router
// there to show another finishes the fan-out exactly once.
var fanoutStep func(mid string)

// fanoutWidth is how many joined questions one fan-out ends at once.
const fanoutWidth = 16

// goFollowUp runs followUp for qid in the background, unless the scanner
// has it in hand (it then does the same).
func (s *Service) goFollowUp(qid string) {
	if _, busy := s.inflight.LoadOrStore(qid, true); busy {
		return
	}
	go func() {
		defer s.inflight.Delete(qid)
		ctx, cancel := context.WithTimeout(cmp.Or[context.Context](s.work, context.Background()), 5*time.Minute)
		defer cancel()
		if err := s.followUp(ctx, qid); err != nil {
			s.log.Warn("fan out to joined questions: left for the scanner", "question_id", qid, "err", err)
		}
	}()
}

// How endJoined left a joined question.
const (
	joinedPending   = iota // not ended yet: the fan-out tries again
	joinedEnded            // ended as the question it joined ended (now or by an earlier try)
	joinedElsewhere        // not waiting on it: asked on its own, or never recorded
)

// endJoined ends joined question mid as l, the question it joined, ended:
// answered with its answer (each thread its own re-dispatch, carrying its
// own partial state, with an id picked once by this compare-and-set),
// expired by the same action, or asked on its own when l was withdrawn
// while mid still waited. It reports how mid was left.
func (s *Service) endJoined(ctx context.Context, mid string, l *record) (int, error) {
	var ev lifecycle.QuestionEvent
	elsewhere := false
	r, rev, changed, err := s.store.updateFrom(ctx, mid, nil, 0, func(r *record) (bool, error) {
		ev, elsewhere = "", r.JoinedTo != l.QuestionID
		if r.Status != lifecycle.StatusJoined || elsewhere {
			return false, nil // ended already, left, or never joined to l
		}
		now := time.Now().UTC()
		r.Route, r.Answerer, r.Escalation = l.Route, l.Answerer, l.Escalation
		a := attempt{At: now, Via: "join", Route: l.Route, AnsweredBy: l.AnsweredBy, Answer: clip.String(l.Answer, 256), Decision: l.Decision}
		switch l.Status {
		case statusAnswered:
			r.Answer, r.Decision, r.AnsweredBy, r.Comment, r.AnsweredAt = l.Answer, l.Decision, l.AnsweredBy, l.Comment, l.AnsweredAt
			r.Reused, r.Suggestion, r.BoundDigest = l.Reused, l.Suggestion, l.BoundDigest
			r.Status = statusAnswered
			a.Result, a.Status, a.Reason = "accepted", string(client.AnswerAccepted), "the answer to question "+l.QuestionID
			r.addHistory(a)
			if err := s.resume(r, "answered by "+l.AnsweredBy+" on question "+l.QuestionID); err != nil {
				return false, err
			}
			ev = lifecycle.QuestionAnswered
			return true, r.queueQuestion(ev, "answered with question "+l.QuestionID)
		case statusExpired:
			r.OnExpiry = l.OnExpiry
			ev = lifecycle.QuestionExpired
			return true, s.expire(r, now)
		default:
			// Withdrawn while this thread waited (not reached: a question
			// is withdrawn only when no joined thread waits): ask it.
			r.Status, r.JoinedTo = statusAsked, ""
			r.AskedAt = now
			ev = lifecycle.QuestionAsked
			return true, r.queueQuestion(ev, "question "+l.QuestionID+" it joined was withdrawn")
		}
	})
	switch {
	case errors.Is(err, errNoQuestion):
		// Listed, never written: its needs_input is coming again.
		if l.AnsweredAt != nil && time.Since(*l.AnsweredAt) > joinedDropAfter {
			s.log.Warn("joined question never recorded: left out of the fan-out", "question_id", mid, "joined_to", l.QuestionID)
			return joinedElsewhere, nil
		}
		return joinedPending, nil
	case err != nil:
		return joinedPending, err
	case elsewhere:
		s.log.Warn("question listed as joined did not wait on it: unlisted", "question_id", mid, "joined_to", l.QuestionID, "its_status", r.Status, "its_joined_to", r.JoinedTo)
		return joinedElsewhere, nil
	}
	if changed {
		s.afterChange(ctx, r, ev)
		if err := s.flushAt(ctx, r, rev); err != nil {
			s.log.Warn("publish joined question events: left for the scanner", "question_id", mid, "err", err)
		}
	}
	return joinedEnded, nil
}

// release deletes open.<match> while it still names r (at the revision r
// claimed it), so the next matching question is asked afresh.
func (s *Service) release(ctx context.Context, r *record) error {
	key := openPrefix + r.MatchKey
	rev := r.OpenRev
	if rev == 0 {
		// Claimed by a router that did not note the revision: read it.
		e, err := s.decisions.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			return nil
		case err != nil:
			return fmt.Errorf("router: read %s: %w", key, err)
		case string(e.Value()) != r.QuestionID:
			return nil
		}
		rev = e.Revision()
	}
	err := s.removeDecisionKey(ctx, key, rev)
	if err != nil && !isStale(err) {
		return fmt.Errorf("router: release %s: %w", key, err)
	}
	return nil
}

// removeDecisionKey removes key of agora_decisions, at revision rev when
// it is not 0. A plain delete would leave its marker for good, one per
// question ever asked; the purge's marker carries the retention as its TTL
// and, being a purge, is followed by no marker of the server's when it
// expires. (A purge is a roll-up, which nats-server answers by recounting
// the pending messages of the bucket's consumers: agora_decisions has none
// but a listing's, for the moment it lists.)
func (s *Service) removeDecisionKey(ctx context.Context, key string, rev uint64) error {
	return s.decisions.Purge(ctx, key, jetstream.LastRevision(rev), jetstream.PurgeTTL(s.cfg.Retention))
}

// isStale reports a KV write refused because the key changed since.
func isStale(err error) bool {
	return errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) || jserr.WrongLastSequence(err)
}

// remember stores r's answer as its route's decision for the match.
func (s *Service) remember(ctx context.Context, r *record) error {
	rt, ok := s.routes.Load().Route(r.Origin)
	if !ok || !remembers(rt, r.Kind) || r.Status != statusAnswered || r.AnsweredAt == nil {
		return nil
	}
	d := client.Decision{
		ID: r.MatchKey, Route: r.Origin, Subagent: r.Subagent, DedupeKey: r.DedupeKey,
		Question: r.Question.Question, Options: r.Options, Kind: string(r.Kind), ContextSHA256: contextDigest(r.Context), ShownDigest: r.ShownDigest,
		QuestionID: r.QuestionID, Answer: r.Answer, Decision: r.Decision, AnsweredBy: r.AnsweredBy, Comment: r.Comment,
		AnsweredAt: *r.AnsweredAt, ExpiresAt: r.AnsweredAt.Add(rt.Remember),
	}
	ttl := time.Until(d.ExpiresAt)
	if ttl < time.Second {
		return nil
	}
	b, err := json.Marshal(d)
	if err != nil {
		return fmt.Errorf("router: encode decision %s: %w", d.ID, err)
	}
	key := memoryPrefix + d.ID
	for range 3 {
		if _, err = s.decisions.Create(ctx, key, b, jetstream.KeyTTL(ttl)); !errors.Is(err, jetstream.ErrKeyExists) {
			break
		}
		// A decision kept from before (this question asked for a fresh
		// answer): the newer one replaces it.
		if cur, gerr := s.recall(ctx, d.ID); gerr == nil && cur != nil && !cur.AnsweredAt.Before(d.AnsweredAt) {
			return nil
		}
		if err = s.removeDecisionKey(ctx, key, 0); err != nil {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("router: remember %s: %w", key, err)
	}
	s.metrics.remembered.WithLabelValues(r.Origin).Inc()
	return nil
}

// recall returns the remembered decision id, or nil when there is none.
func (s *Service) recall(ctx context.Context, id string) (*client.Decision, error) {
	e, err := s.decisions.Get(ctx, memoryPrefix+id)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("router: read decision %s: %w", id, err)
	}
	var d client.Decision
	if err := json.Unmarshal(e.Value(), &d); err != nil {
		return nil, fmt.Errorf("router: decode decision %s: %w", id, err)
	}
	if !time.Now().Before(d.ExpiresAt) {
		return nil, nil
	}
	return &d, nil
}

// answerFromMemory answers r, a new question, with decision d. It reports
// false, changing nothing, when d was made on a question that showed
// something else (a dedupe_key question whose text, context, options or
// kind differ: docs/security.md, "What sub-agents share") or its answer
// does not answer r.
func (s *Service) answerFromMemory(r *record, d *client.Decision) (bool, error) {
	if !sameShown(r, d) {
		return false, nil
	}
	by := memoryAnsweredBy + d.QuestionID
	sub := Submission{QuestionID: r.QuestionID, Answer: d.Answer, Decision: d.Decision, AnsweredBy: by, Comment: d.Comment}
	if why := validate(r, &sub); why != "" {
		return false, nil
	}
	now := time.Now().UTC()
	r.Answer, r.Decision, r.AnsweredBy, r.Comment, r.AnsweredAt = sub.Answer, sub.Decision, by, d.Comment, &now
	r.Reused = &lifecycle.Reused{QuestionID: d.QuestionID, AnsweredBy: d.AnsweredBy, AnsweredAt: d.AnsweredAt, ShownDigest: d.ShownDigest}
	r.BoundDigest = d.ShownDigest
	r.Status, r.Pending, r.Asks = statusAnswered, nil, 0
	r.addHistory(attempt{At: now, Via: "memory", Route: r.Route, AnsweredBy: by, Answer: clip.String(d.Answer, 256), Decision: d.Decision,
		Result: "accepted", Status: string(client.AnswerAccepted), ShownDigest: d.ShownDigest,
		Reason: fmt.Sprintf("the decision of question %s by %s at %s", d.QuestionID, d.AnsweredBy, d.AnsweredAt.Format(time.RFC3339))})
	if err := s.resume(r, "answered from the decision of question "+d.QuestionID); err != nil {
		return false, err
	}
	return true, r.queueQuestion(lifecycle.QuestionAnswered, "answered from the decision of question "+d.QuestionID+" by "+d.AnsweredBy)
}

// leave takes r's own thread, cancelled, off a question that joined
// threads still wait on: the thread ends cancelled, the question stays
// asked for the others.
func leave(r *record, cr lifecycle.CancelRequest, via string) error {
	by := clip.String(cmp.Or(cr.By, "api"), MaxAnsweredByBytes)
	reason := clip.String(cr.Reason, MaxReasonBytes)
	r.Left, r.Outcome = true, outcomeWithdrawn
	r.WaitingThreads = slices.DeleteFunc(r.WaitingThreads, func(w lifecycle.WaitingThread) bool { return w.QuestionID == r.QuestionID })
	r.addHistory(attempt{At: time.Now().UTC(), Via: "cancel", AnsweredBy: by, Result: "left",
		Reason: fmt.Sprintf("the asking thread was cancelled by %s (seen on %s); the question stays for the %d threads that joined it", by, via, len(r.WaitingThreads))})
	return r.endCancelled(by, reason)
}

// unjoin takes joined question mid off question lid after its thread was
// cancelled. When no thread is left waiting on lid, lid is withdrawn.
func (s *Service) unjoin(ctx context.Context, lid, mid, by string) error {
	var ev lifecycle.QuestionEvent
	r, rev, changed, err := s.store.updateFrom(ctx, lid, nil, 0, func(r *record) (bool, error) {
		ev = ""
		if !r.waitingOn(mid) {
			return false, nil
		}
		r.WaitingThreads = slices.DeleteFunc(r.WaitingThreads, func(w lifecycle.WaitingThread) bool { return w.QuestionID == mid })
		if !r.Left && len(r.WaitingThreads) == 1 {
			r.WaitingThreads = nil // the asking thread alone
		}
		if r.Status == statusAsked && r.Left && len(r.WaitingThreads) == 0 {
			r.Status = statusWithdrawn
			r.Detail = "every thread waiting on it was cancelled, the last by " + by
			r.addHistory(attempt{At: time.Now().UTC(), Via: "cancel", AnsweredBy: by, Result: "withdrawn", Reason: r.Detail})
			s.settled(r, false)
			ev = lifecycle.QuestionWithdrawn
			return true, r.queueQuestion(ev, r.Detail)
		}
		return true, nil
	})
	if errors.Is(err, errNoQuestion) {
		return nil
	}
	if err != nil || !changed {
		return err
	}
	s.afterChange(ctx, r, ev)
	return s.flushAt(ctx, r, rev)
}

// listDecisions returns the remembered decisions of route (all when
// empty), newest answer first.
func (s *Service) listDecisions(ctx context.Context, route string) ([]client.Decision, error) {
	// Every decision stored before the call (pkg/kvsnap: a listing from
	// a watch can leave out one being replaced).
	es, err := kvsnap.Read(ctx, s.js, lifecycle.BucketDecisions, memoryPrefix+">")
	if err != nil {
		return nil, fmt.Errorf("router: list decisions: %w", err)
	}
	out := []client.Decision{}
	now := time.Now()
	for _, e := range es {
		var d client.Decision
		if err := json.Unmarshal(e.Value, &d); err != nil {
			return nil, fmt.Errorf("router: decode decision %s: %w", strings.TrimPrefix(e.Key, memoryPrefix), err)
		}
		if now.Before(d.ExpiresAt) && (route == "" || d.Route == route) {
			out = append(out, d)
		}
	}
	slices.SortFunc(out, func(a, b client.Decision) int {
		if c := b.AnsweredAt.Compare(a.AnsweredAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out, nil
}

// forget deletes remembered decision id and returns it; nil when none.
func (s *Service) forget(ctx context.Context, id string) (*client.Decision, error) {
	d, err := s.recall(ctx, id)
	if err != nil || d == nil {
		return nil, err
	}
	if err := s.removeDecisionKey(ctx, memoryPrefix+id, 0); err != nil {
		return nil, fmt.Errorf("router: forget decision %s: %w", id, err)
	}
	return d, nil
}

// microDecisions serves agora.api.decisions.
func (s *Service) microDecisions(ctx context.Context, req micro.Request) {
	var in lifecycle.DecisionsRequest
	if p := decodeStrict(req.Data(), &in, "a decisions request has route"); p != nil {
		s.respondProblem(req, p)
		return
	}
	if in.Route != "" {
		if err := lifecycle.ValidToken(in.Route); err != nil {
			s.respondProblem(req, problem.Invalid(client.FieldError{Field: "route", Message: err.Error()}))
			return
		}
	}
	ds, err := s.listDecisions(ctx, in.Route)
	if err != nil {
		s.log.Warn("list decisions", "err", err)
		s.respondProblem(req, unavailable("the remembered decisions could not be read; try again"))
		return
	}
	s.respondJSON(req, client.DecisionsPage{Decisions: ds, Count: len(ds)})
}

// microForget serves agora.api.decisions.forget.
func (s *Service) microForget(ctx context.Context, req micro.Request) {
	var in lifecycle.ForgetRequest
	if p := decodeStrict(req.Data(), &in, "a forget request has id"); p != nil {
		s.respondProblem(req, p)
		return
	}
	if err := lifecycle.ValidToken(in.ID); err != nil {
		s.respondProblem(req, problem.Invalid(client.FieldError{Field: "id", Message: err.Error() + " (`agora decisions list` shows the ids)"}))
		return
	}
	d, err := s.forget(ctx, in.ID)
	switch {
	case err != nil:
		s.log.Warn("forget decision", "id", in.ID, "err", err)
		s.respondProblem(req, unavailable("the decision could not be forgotten; try again"))
		return
	case d == nil:
		s.respondProblem(req, &client.Problem{Type: client.ProblemNotFound, Title: "Not found", Status: 404,
			Detail: "no remembered decision " + in.ID + " (forgotten already, or expired); `agora decisions list` shows those kept"})
		return
	}
	s.log.Info("decision forgotten", "id", d.ID, "route", d.Route, "question_id", d.QuestionID)
	s.respondJSON(req, d)
}

// decodeStrict decodes a request body into v, refusing unknown fields
// (fields names them); an empty body leaves v as it is.
func decodeStrict(data []byte, v any, fields string) *client.Problem {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			return problem.Invalid(client.FieldError{Field: strings.Trim(name, `"`), Message: "unknown field: " + fields})
		}
		return problem.Invalid(client.FieldError{Field: "body", Message: "not JSON: " + clip.String(err.Error(), 200)})
	}
	return nil
}

func unavailable(detail string) *client.Problem {
	return &client.Problem{Type: client.ProblemUnavailable, Title: "Unavailable", Status: 503, Detail: detail}
}

func (s *Service) respondJSON(req micro.Request, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		s.respondProblem(req, &client.Problem{Title: "Internal error", Status: 500, Detail: err.Error()})
		return
	}
	if err := req.Respond(data, micro.WithHeaders(micro.Headers{"Content-Type": []string{"application/json"}})); err != nil {
		s.log.Warn("micro: respond", "err", err)
	}
}
