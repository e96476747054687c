package router

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/resume"
	"github.com/agora-dispatch/agora/internal/retention"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// Question statuses (lifecycle.Question.Status).
const (
	statusAsked     = "asked"
	statusAnswered  = "answered"
	statusExpired   = "expired"
	statusWithdrawn = "withdrawn"
)

// record is the value under the question id in the agora_questions bucket.
// Its JSON is a superset of lifecycle.Question, so readers that know only
// the event data (pkg/client, the inbox) read it as one. Everything the
// router needs after a restart is here: the deadline and escalation
// ladder, the partial state (inline) or its reference, the settings of
// the request to resume, and the events still to publish.
type record struct {
	// The question and what its resume is made from (internal/resume):
	// the dispatcher accepts a later round only as resume.Build makes it
	// from this record.
	resume.Record

	// Traceparent is the needs_input event's trace; every question event
	// and the re-dispatch carry it on.
	Traceparent string `json:"traceparent,omitempty"`
	// Origin is the route the question first matched: its deadline,
	// ladder and expiry action apply wherever the question moves.
	Origin string `json:"origin"`
	// Ladder is the escalation ladder, resolved to times when asked; Step
	// counts the rungs taken.
	Ladder []rung `json:"ladder,omitempty"`
	Step   int    `json:"step,omitempty"`
	// OnExpiry is the origin route's expiry action (fail, cancel,
	// default:<option>).
	OnExpiry string `json:"on_expiry,omitempty"`
	// Asks counts the asked events published (routes the question went to).
	Asks int `json:"asks"`
	// Declined lists the routes whose answerers declined the question.
	Declined []string `json:"declined,omitempty"`
	// ExpiresAt is set by the dispatcher when the question's thread has
	// ended (docs/storage.md, "Retention"); every later write keeps the
	// record expiring then.
	ExpiresAt *time.Time `json:"expires_at,omitempty"`

	// History lists every answer attempt, accepted or refused, and every
	// decline. It keeps the latest maxHistory entries; Dropped counts the
	// ones left out.
	History []attempt `json:"history"`
	Dropped int       `json:"history_dropped,omitempty"`

	// MatchKey names what the question asks, when its route coalesces or
	// remembers (docs/router.md, "Ask once"); DedupeKey is the sentinel's.
	MatchKey  string `json:"match_key,omitempty"`
	DedupeKey string `json:"dedupe_key,omitempty"`
	// OpenRev is the revision of open.<match> this question claimed.
	OpenRev uint64 `json:"open_rev,omitempty"`
	// Left is set on an asked question whose own thread was cancelled
	// while joined threads still wait on it: the question stays asked for
	// them, and its answer resumes only them.
	Left bool `json:"thread_left,omitempty"`
	// What an ended question still owes (docs/router.md, "Ask once"), done after
	// the compare-and-set that ended it and again by the scanner after a
	// crash: Fanout, the joined questions to end as this one did; Release,
	// removing open.<match>; Memorize, writing memory.<match>.
	Fanout   []string `json:"fanout,omitempty"`
	Release  bool     `json:"release,omitempty"`
	Memorize bool     `json:"memorize,omitempty"`

	// BoundDigest is, on an answered question, the shown digest its
	// accepted answer was bound to (the door's, or a remembered
	// decision's); empty when the answer came without one
	// (docs/answering.md, "Bound answers").
	BoundDigest string `json:"bound_digest,omitempty"`

	// Pending are events decided by a compare-and-set and not yet
	// published (an outbox): whoever reads the record next publishes them,
	// in order, with their fixed ids, then removes them.
	Pending   []pending `json:"pending,omitempty"`
	UpdatedAt time.Time `json:"updated_at"`
}

type rung struct {
	At time.Time `json:"at"`
	To string    `json:"to"`
}

// attempt is one entry of a question's history.
type attempt struct {
	At  time.Time `json:"at"`
	Via string    `json:"via"` // api, api-route, stream, deadline, cancel
	// Door is the subject the attempt came through: agora.api.answer,
	// agora.api.answer.<route> or agora.answers.<route>.<question_id>.
	Door string `json:"door,omitempty"`
	// NamedDoor is the door the answer named itself with (Submission.Door:
	// inbox, link, slack, mcp, a2a, cli or an answerer's own token).
	NamedDoor string `json:"named_door,omitempty"`
	// Route is the route the door is scoped to (api-route, stream), or
	// the one the sender named (api); a decline records the route it left.
	Route      string `json:"route,omitempty"`
	AnsweredBy string `json:"answered_by,omitempty"`
	Answer     string `json:"answer,omitempty"`
	Decision   string `json:"decision,omitempty"`
	Result     string `json:"result"` // accepted, refused, declined
	Status     string `json:"status,omitempty"`
	Reason     string `json:"reason,omitempty"`
	// ShownDigest is the shown digest the attempt carried, if any.
	ShownDigest string `json:"shown_digest,omitempty"`
}

// pending is one event to publish with a fixed id (its Nats-Msg-Id), so a
// second publish by another replica or after a restart is a duplicate.
type pending struct {
	ID        string               `json:"id"`
	Subject   string               `json:"subject"`
	Question  *lifecycle.Question  `json:"question,omitempty"`
	Failed    *lifecycle.Failed    `json:"failed,omitempty"`
	Cancelled *lifecycle.Cancelled `json:"cancelled,omitempty"`
	// Resume is the re-dispatch, built from the record when published
	// (so the input is not stored twice).
	Resume bool `json:"resume,omitempty"`
	// Trace is the traceparent of the span that queued the event, which
	// the event carries as is (tracing on; docs/tracing.md).
	Trace string `json:"trace,omitempty"`
}

// data is the event data of p; r is the record it belongs to.
func (p pending) data(r *record) (lifecycle.Data, error) {
	switch {
	case p.Question != nil:
		return p.Question, nil
	case p.Resume:
		return r.resumeRequest()
	case p.Failed != nil:
		return p.Failed, nil
	case p.Cancelled != nil:
		return p.Cancelled, nil
	}
	return nil, nil
}

const maxHistory = 100

func (r *record) addHistory(a attempt) {
	r.History = append(r.History, a)
	if n := len(r.History) - maxHistory; n > 0 {
		r.History = r.History[n:]
		r.Dropped += n
	}
}

// snapshot is the question event data for ev: the record's question
// fields, never its partial state.
func (r *record) snapshot(ev lifecycle.QuestionEvent, detail string) lifecycle.Question {
	q := r.Question
	q.Event, q.Detail = ev, detail
	q.Options = append([]string(nil), q.Options...)
	q.WaitingThreads = slices.Clone(q.WaitingThreads)
	return q
}

// queueQuestion appends a question event for the record's current route.
func (r *record) queueQuestion(ev lifecycle.QuestionEvent, detail string) error {
	q := r.snapshot(ev, detail)
	r.Event, r.Detail = ev, detail
	subj, err := lifecycle.QuestionSubject(q.Route, q.QuestionID, ev)
	if err != nil {
		return err
	}
	id := q.QuestionID + "." + string(ev)
	switch ev {
	case lifecycle.QuestionEscalated:
		id += "." + strconv.Itoa(q.Escalation)
	case lifecycle.QuestionAsked:
		r.Asks++
		if r.Asks > 1 {
			id += "." + strconv.Itoa(r.Asks)
		}
	}
	r.Pending = append(r.Pending, pending{ID: id, Subject: subj, Question: &q})
	return nil
}

// due is when the record next needs the router's attention for a
// deadline or an escalation step; zero when never.
func (r *record) due() time.Time {
	if r.owes() {
		return r.UpdatedAt.Add(pendingGrace)
	}
	if r.Status != statusAsked {
		return time.Time{}
	}
	var t time.Time
	if r.Step < len(r.Ladder) {
		t = r.Ladder[r.Step].At
	}
	if r.Deadline != nil && (t.IsZero() || r.Deadline.Before(t)) {
		t = *r.Deadline
	}
	return t
}

// owes reports whether an ended question still owes ask-once work
// (record.Fanout, Release, Memorize).
func (r *record) owes() bool { return len(r.Fanout) > 0 || r.Release || r.Memorize }

// errConflict reports a lost compare-and-set; the caller reads again.
var errConflict = errors.New("router: record changed concurrently")

// errNoQuestion reports a question id without a record.
var errNoQuestion = errors.New("router: no such question")

// store reads and writes question records with compare-and-set.
type store struct {
	kv jetstream.KeyValue
	js jetstream.JetStream
}

func (st store) get(ctx context.Context, qid string) (*record, uint64, error) {
	e, err := st.kv.Get(ctx, qid)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrInvalidKey):
		return nil, 0, fmt.Errorf("%w: %s", errNoQuestion, qid)
	case err != nil:
		return nil, 0, fmt.Errorf("router: read question %s: %w", qid, err)
	}
	var r record
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		return nil, 0, fmt.Errorf("router: decode question %s: %w", qid, err)
	}
	return &r, e.Revision(), nil
}

// create writes a new record; errConflict when one exists.
func (st store) create(ctx context.Context, r *record) (uint64, error) {
	r.UpdatedAt = time.Now().UTC()
	b, err := json.Marshal(r)
	if err != nil {
		return 0, fmt.Errorf("router: encode question %s: %w", r.QuestionID, err)
	}
	rev, err := st.kv.Create(ctx, r.QuestionID, b)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return 0, errConflict
	}
	if err != nil {
		return 0, fmt.Errorf("router: create question %s: %w", r.QuestionID, err)
	}
	return rev, nil
}

// put writes r over revision rev; errConflict when it changed since.
func (st store) put(ctx context.Context, r *record, rev uint64) (uint64, error) {
	r.UpdatedAt = time.Now().UTC()
	b, err := json.Marshal(r)
	if err != nil {
		return 0, fmt.Errorf("router: encode question %s: %w", r.QuestionID, err)
	}
	var n uint64
	if r.ExpiresAt != nil && st.js != nil {
		n, err = retention.Update(ctx, st.js, lifecycle.BucketQuestions, r.QuestionID, b, rev, *r.ExpiresAt)
	} else {
		n, err = st.kv.Update(ctx, r.QuestionID, b, rev)
	}
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, retention.ErrConflict) {
		return 0, errConflict
	}
	if err != nil {
		return 0, fmt.Errorf("router: write question %s: %w", r.QuestionID, err)
	}
	return n, nil
}

// maxCAS bounds the compare-and-set retries of one change.
const maxCAS = 200

// update applies change to the record with compare-and-set, reading again
// after every conflict. change returns false to write nothing. update
// returns the record as written (or as read, when nothing was written).
func (st store) update(ctx context.Context, qid string, change func(r *record) (bool, error)) (*record, bool, error) {
	r, _, changed, err := st.updateFrom(ctx, qid, nil, 0, change)
	return r, changed, err
}

// updateFrom is update starting from known as read at revision rev (a
// record this router has just written), which saves the read when nobody
// wrote it since; known nil reads first. It also returns the revision of
// the record it returns.
func (st store) updateFrom(ctx context.Context, qid string, known *record, rev uint64, change func(r *record) (bool, error)) (*record, uint64, bool, error) {
	for range maxCAS {
		var r *record
		if known != nil {
			cp := *known
			cp.Pending, cp.History = slices.Clone(known.Pending), slices.Clone(known.History)
			cp.WaitingThreads, cp.Fanout = slices.Clone(known.WaitingThreads), slices.Clone(known.Fanout)
			r, known = &cp, nil
		} else {
			var err error
			if r, rev, err = st.get(ctx, qid); err != nil {
				return nil, 0, false, err
			}
		}
		ok, err := change(r)
		if err != nil || !ok {
			return r, rev, false, err
		}
		n, err := st.put(ctx, r, rev)
		if err == nil {
			return r, n, true, nil
		} else if !errors.Is(err, errConflict) {
			return nil, 0, false, err
		}
		if err := ctx.Err(); err != nil {
			return nil, 0, false, err
		}
	}
	return nil, 0, false, fmt.Errorf("router: question %s: %d conflicting writers", qid, maxCAS)
}
