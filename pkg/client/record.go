package client

import (
	"encoding/json"
	"time"

	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// Record is a dispatch record: what the dispatch, cancel and status calls
// return. The dispatcher keeps its fixed part under the dispatch id in the
// agora_dispatches bucket (beside it, bookkeeping of its own that no call
// returns) and answers every call with the dispatch's status read from
// its lifecycle events: Status, Attempt, WorkerID, Result, StartedAt,
// EndedAt and Events come from the last event of each kind on the
// dispatch's chain (docs/storage.md, "The dispatch record and the
// reconciler"). In the bucket those fields stay as the record was created.
type Record struct {
	DispatchID       string `json:"dispatch_id"`
	ThreadID         string `json:"thread_id"`
	ParentID         string `json:"parent_id,omitempty"`
	Round            int    `json:"round"`
	Subagent         string `json:"subagent"`
	SubagentRevision uint64 `json:"subagent_revision,omitempty"`
	// Principal names who dispatched the thread, on its first round's
	// record: the HTTP API's principal (docs/security.md, "Principals and
	// scopes") or the NATS user on its own API subjects ("The NATS API"),
	// whose thread it is; on the trusted NATS subjects, the principal the
	// door names (Agora-Principal), or empty.
	Principal string `json:"principal,omitempty"`
	// Status is the latest lifecycle kind: accepted, then started, then one
	// terminal kind, which never changes again.
	Status lifecycle.Kind `json:"status"`
	// Attempt is the delivery attempt of the latest started event (the
	// chain is fenced, so the highest).
	Attempt  int    `json:"attempt,omitempty"`
	WorkerID string `json:"worker_id,omitempty"`
	// Traceparent is the W3C trace context every event of the dispatch
	// carries (each event with its own span id).
	Traceparent string `json:"traceparent,omitempty"`
	// Request is the completed request as queued for the worker: ids,
	// round, sub-agent revision, timeout and round limit filled in. Records
	// of requests the dispatcher refused on the stream have none.
	Request *lifecycle.Request `json:"request,omitempty"`
	// Result summarises the terminal event; nil until there is one.
	Result *Result `json:"result,omitempty"`
	// CancelRequested is set on the record of a dispatch paused on a
	// question when its thread is cancelled: the durable twin of the core
	// message on agora.control.cancel-thread.<thread_id>. The router reads
	// it before it accepts an answer, acts on a deadline or asks the
	// question, so a cancel sent while no router ran still withdraws the
	// question. The dispatcher writes it once (compare-and-set), before it
	// sends that message; nil when the thread was not cancelled while
	// paused.
	CancelRequested *CancelMark `json:"cancel_requested,omitempty"`
	// Outcome is set only on a cancel's answer: what that cancel did, from
	// the dispatch's state when it arrived — OutcomeCancelled,
	// OutcomeCancelling, OutcomeThreadCancelling or OutcomeAlreadyEnded
	// (docs/dispatcher.md, "Cancel"). Stored records never carry it.
	Outcome string `json:"outcome,omitempty"`

	CreatedAt  time.Time  `json:"created_at"`
	AcceptedAt *time.Time `json:"accepted_at,omitempty"`
	StartedAt  *time.Time `json:"started_at,omitempty"` // of the latest attempt
	EndedAt    *time.Time `json:"ended_at,omitempty"`   // time of the terminal event
	UpdatedAt  time.Time  `json:"updated_at"`
	// ExpiresAt is when the record expires: set when its thread ends, to
	// the end plus the retention (AGORA_RETENTION); nil while the thread
	// runs or waits, which never expires.
	ExpiresAt *time.Time `json:"expires_at,omitempty"`

	// Events lists the lifecycle events the status was read from, in
	// stream order: the last of each kind (in a thread's rounds, every
	// event of the round).
	Events []EventRef `json:"events,omitempty"`
}

// Terminal reports whether the dispatch has ended.
func (r *Record) Terminal() bool { return r.Status.Terminal() }

// Common returns the fields every lifecycle event of the dispatch carries.
func (r *Record) Common() lifecycle.Common {
	return lifecycle.Common{DispatchID: r.DispatchID, ThreadID: r.ThreadID, ParentID: r.ParentID, Round: r.Round, Subagent: r.Subagent}
}

// Result summarises a dispatch's terminal event.
type Result struct {
	Kind lifecycle.Kind `json:"kind"`
	// Reason is the failure reason of a failed dispatch.
	Reason lifecycle.Reason `json:"reason,omitempty"`
	// Detail explains a failure, or is the reason given for a cancel.
	Detail     string `json:"detail,omitempty"`
	ExitCode   *int   `json:"exit_code,omitempty"`
	DurationMS int64  `json:"duration_ms,omitempty"`
	// QuestionID and Question are set for needs_input: the question this
	// dispatch asked.
	QuestionID string `json:"question_id,omitempty"`
	Question   string `json:"question,omitempty"`
	// Output is the sub-agent's .agora/output.json of a finished dispatch.
	Output json.RawMessage `json:"output,omitempty"`
	// By names who cancelled.
	By string `json:"by,omitempty"`
}

// EventRef names one lifecycle event applied to a record.
type EventRef struct {
	ID   string         `json:"id"`
	Kind lifecycle.Kind `json:"kind"`
	Time time.Time      `json:"time"`
}

// Thread is every round of a thread: the root dispatch and each
// re-dispatch that carried an answer, in round order, each with its
// lifecycle events.
type Thread struct {
	ThreadID string `json:"thread_id"`
	// Status is the status of the latest round.
	Status lifecycle.Kind `json:"status"`
	Rounds []Round        `json:"rounds"`
	// Outcome is set only on a thread cancel's answer: what it did, as
	// Record.Outcome (OutcomeAlreadyEnded when no round was cancelled).
	Outcome string `json:"outcome,omitempty"`
}

// What a cancel did (Record.Outcome, Thread.Outcome).
const (
	// OutcomeCancelled: the dispatch ended cancelled by this request.
	OutcomeCancelled = "cancelled"
	// OutcomeCancelling: it was running; it ends cancelled and its worker
	// stops the runtime.
	OutcomeCancelling = "cancelling"
	// OutcomeThreadCancelling: it was paused on a question; the router
	// withdraws the question and ends the thread cancelled.
	OutcomeThreadCancelling = "thread-cancelling"
	// OutcomeAlreadyEnded: nothing was cancelled — it had ended, its
	// thread went on, or its thread's cancel was already asked for.
	OutcomeAlreadyEnded = "already-ended"
)

// Latest returns the latest round's record, or nil for an empty thread.
func (t *Thread) Latest() *Record {
	if len(t.Rounds) == 0 {
		return nil
	}
	return &t.Rounds[len(t.Rounds)-1].Record
}

// Round is one dispatch of a thread with its lifecycle events, oldest
// first, as CloudEvents in structured JSON.
type Round struct {
	Record
	Events []lifecycle.Event `json:"events,omitempty"`
}

// CancelMark is Record.CancelRequested: the cancel of a thread paused on a
// question (the paused dispatch, its thread, who cancelled and why) and
// when the dispatcher took it. Its JSON is that of lifecycle.CancelRequest
// plus "at".
type CancelMark struct {
	lifecycle.CancelRequest
	At time.Time `json:"at"`
}

// statusRequest is the body of agora.api.status: set DispatchID for one
// dispatch's Record, or ThreadID for its Thread.
type statusRequest struct {
	DispatchID string `json:"dispatch_id,omitempty"`
	ThreadID   string `json:"thread_id,omitempty"`
}
