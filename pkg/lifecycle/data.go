package lifecycle

import (
	"encoding/json"
	"time"
)

// Common holds the fields every dispatch event's data carries.
type Common struct {
	DispatchID string `json:"dispatch_id"`
	ThreadID   string `json:"thread_id"`
	ParentID   string `json:"parent_id"` // empty for a root dispatch
	Round      int    `json:"round"`     // 0 for a root dispatch
	Subagent   string `json:"subagent"`
}

// Request is a dispatch request (dev.agora.dispatch.requested). Clients send
// it on agora.requests.<subagent>; the dispatcher fills the ids and queues
// the completed request on agora.dispatch.<subagent>.
type Request struct {
	// DispatchID is optional from a client; when set it is the idempotency key.
	DispatchID string            `json:"dispatch_id,omitempty"`
	Subagent   string            `json:"subagent"`
	Input      json.RawMessage   `json:"input,omitempty"` // a JSON object
	Target     string            `json:"target,omitempty"`
	Env        map[string]string `json:"env,omitempty"` // non-secret values for the sub-agent
	Labels     map[string]string `json:"labels,omitempty"`
	Timeout    string            `json:"timeout,omitempty"` // Go duration, e.g. "30m"
	MaxRounds  int               `json:"max_rounds,omitempty"`

	// Set by the router on a re-dispatch.
	ThreadID   string `json:"thread_id,omitempty"`
	ParentID   string `json:"parent_id,omitempty"`
	Round      int    `json:"round,omitempty"`
	QuestionID string `json:"question_id,omitempty"`
	// PartialStateRef names an object in the agora_state store that holds a
	// partial state too large to travel inline; the worker resolves it into
	// input.partial_state when it writes input.json.
	PartialStateRef string `json:"partial_state_ref,omitempty"`

	// SubagentRevision is set by the dispatcher: the definition's KV revision
	// recorded at acceptance, so the worker runs exactly what was validated.
	SubagentRevision uint64 `json:"subagent_revision,omitempty"`
}

// Accepted is the data of dev.agora.dispatch.accepted.
type Accepted struct {
	Common
	SubagentRevision uint64            `json:"subagent_revision"`
	Target           string            `json:"target,omitempty"`
	Labels           map[string]string `json:"labels,omitempty"`
}

// Started is the data of dev.agora.dispatch.started.
type Started struct {
	Common
	WorkerID string `json:"worker_id"`
	Attempt  int    `json:"attempt"` // the work message's delivery count, from 1
	// Sandbox says what contains this run on its worker's host.
	Sandbox *Sandbox `json:"sandbox,omitempty"`
}

// Sandbox reports what holds a run (docs/sandbox.md): the definition's
// mode and each layer as it is in force on the worker's host.
type Sandbox struct {
	Mode        string `json:"mode"`                   // strict, standard or off
	Isolation   string `json:"isolation"`              // namespaces, pid-namespace, subreaper or direct
	LandlockABI int    `json:"landlock_abi,omitempty"` // 0: no Landlock on the host
	Filesystem  bool   `json:"filesystem"`             // Landlock filesystem rules apply
	Network     bool   `json:"network"`                // Landlock TCP-connect rules apply (ABI 4+)
	PrivateProc bool   `json:"private_proc"`           // /proc shows only the run's processes
	Cgroup      bool   `json:"cgroup"`                 // processes and memory bounded by a cgroup
	// Limits are the run's limits in force (bytes, counts, seconds; -1
	// unlimited).
	Limits map[string]int64 `json:"limits,omitempty"`
	// TCPPorts are the ports it may connect to, when Network holds.
	TCPPorts []int `json:"tcp_ports,omitempty"`
	// With isolation namespaces (docs/sandbox.md): the run's own network
	// namespace (only loopback), a root of its own, the seccomp filter and
	// every capability set empty; Egress lists the destinations its proxy
	// allows; WorkspaceFS is "tmpfs" when workspace_size holds at the
	// write, "watched" when it is checked once a second.
	NetworkNamespace bool     `json:"network_namespace,omitempty"`
	OwnRoot          bool     `json:"own_root,omitempty"`
	Seccomp          bool     `json:"seccomp,omitempty"`
	NoCapabilities   bool     `json:"no_capabilities,omitempty"`
	Egress           []string `json:"egress,omitempty"`
	WorkspaceFS      string   `json:"workspace_fs,omitempty"`
}

// Producer names the run that produced a terminal event: the worker and
// the work message's delivery attempt. Both are empty on terminal events
// that no run produced (a cancel while queued, a thread ended by the
// router, redelivery-exhausted).
type Producer struct {
	WorkerID string `json:"worker_id,omitempty"`
	Attempt  int    `json:"attempt,omitempty"` // the delivery count of the run, from 1
}

// Finished is the data of dev.agora.dispatch.finished.
type Finished struct {
	Common
	Producer
	Outputs
	ExitCode   int             `json:"exit_code"`
	DurationMS int64           `json:"duration_ms"`
	Output     json.RawMessage `json:"output"` // .agora/output.json, or null
	// OutputDropped says why Output is null although the run wrote one:
	// the file is not a regular file of at most 64 KiB of valid JSON, or
	// the event would not otherwise fit the server's max payload.
	OutputDropped string `json:"output_dropped,omitempty"`
	// StdoutTail is the last 4 KiB of the runtime's standard output, with
	// the values of secrets redacted (docs/worker.md, "What a run leaves").
	StdoutTail string `json:"stdout_tail"`
	// StderrTail is the last 4 KiB of the runtime's standard error,
	// bounded and redacted as StdoutTail; empty when it wrote none.
	StderrTail string `json:"stderr_tail,omitempty"`
}

// MaxInlineState is the largest partial_state carried inline in a
// needs_input event; larger state travels as PartialStateRef.
const MaxInlineState = 64 << 10

// NeedsInput is the data of dev.agora.dispatch.needs_input.
type NeedsInput struct {
	Common
	Producer
	Outputs
	QuestionID      string          `json:"question_id"`
	Question        string          `json:"question"`
	Options         []string        `json:"options,omitempty"`
	Context         string          `json:"context,omitempty"`
	Kind            QuestionKind    `json:"kind,omitempty"`
	PartialState    json.RawMessage `json:"partial_state,omitempty"`
	PartialStateRef string          `json:"partial_state_ref,omitempty"`
	// DedupeKey and Reuse are the sentinel's: what makes questions the
	// same one, and whether a remembered decision may answer this one
	// (nil: yes, where the route remembers). docs/router.md, "Ask once".
	DedupeKey  string `json:"dedupe_key,omitempty"`
	Reuse      *bool  `json:"reuse,omitempty"`
	DurationMS int64  `json:"duration_ms"`
	ExitCode   int    `json:"exit_code"`
}

// Failed is the data of dev.agora.dispatch.failed.
type Failed struct {
	Common
	Producer
	Outputs
	Reason     Reason `json:"reason"`
	Detail     string `json:"detail"`
	ExitCode   *int   `json:"exit_code"` // null when the runtime never exited with a code
	DurationMS int64  `json:"duration_ms"`
	// BelowFloor is set on a dispatch a worker refused (reason rejected)
	// because its definition is below the operator's sandbox floor: each
	// setting that would allow it (docs/sandbox.md, "The operator's
	// floor"). The decision log makes a refused entry of it.
	BelowFloor []string `json:"below_floor,omitempty"`
}

// Cancelled is the data of dev.agora.dispatch.cancelled.
type Cancelled struct {
	Common
	Producer
	By     string `json:"by"`
	Reason string `json:"reason,omitempty"`
}

// Question is the data of every dev.agora.question.<event>: a snapshot of
// the question record after the step. Large partial state never travels to
// answerers; only its reference does.
type Question struct {
	Common
	QuestionID string            `json:"question_id"`
	Event      QuestionEvent     `json:"event"`
	Status     string            `json:"status"` // asked, joined, answered, expired, withdrawn
	Route      string            `json:"route"`
	Answerer   string            `json:"answerer"`
	Question   string            `json:"question"`
	Options    []string          `json:"options,omitempty"`
	Context    string            `json:"context,omitempty"`
	Kind       QuestionKind      `json:"kind,omitempty"`
	Target     string            `json:"target,omitempty"`
	Labels     map[string]string `json:"labels,omitempty"`
	AskedAt    time.Time         `json:"asked_at"`
	Deadline   *time.Time        `json:"deadline,omitempty"`
	Escalation int               `json:"escalation,omitempty"` // escalation steps taken so far
	// ShownDigest is the digest of what the question shows a person (its
	// text, context, kind, options and partial state; docs/answering.md,
	// "Bound answers"). A door sends it back with the answer, and the
	// router refuses the answer when the question no longer shows that.
	ShownDigest string `json:"shown_digest,omitempty"`

	Answer     string     `json:"answer,omitempty"`
	Decision   string     `json:"decision,omitempty"`
	AnsweredBy string     `json:"answered_by,omitempty"`
	AnsweredAt *time.Time `json:"answered_at,omitempty"`
	Detail     string     `json:"detail,omitempty"` // why it expired, was withdrawn or escalated

	// WaitingThreads lists the threads waiting on an asked question, the
	// asking thread first, then those whose questions joined it
	// (docs/router.md, "Ask once"); absent when the asking thread alone waits.
	WaitingThreads []WaitingThread `json:"waiting_threads,omitempty"`
	// JoinedTo is, on a question that joined another (status joined,
	// then the joined question's outcome), the question asked for it.
	JoinedTo string `json:"joined_to,omitempty"`
	// Reused is, on a question answered from a remembered decision
	// (answered_by memory:<question_id>), whose decision it reused.
	Reused *Reused `json:"reused,omitempty"`
	// Suggestion is an answerer's suggested answer: taken as the answer
	// at or above the route's auto_accept confidence (answered_by
	// suggested:<by>), otherwise shown preselected on the fallback route.
	Suggestion *Suggestion `json:"suggestion,omitempty"`
	// Reversal is set once a person reversed the accepted suggestion that
	// answered the question (docs/answering.md, "Reversing an accepted
	// suggestion"): Answer, Decision and AnsweredBy are then the person's.
	Reversal *Reversal `json:"reversal,omitempty"`
}

// Reversal records a person's reversal of an accepted suggestion: who,
// when, what the suggestion answered, the resumed dispatch cancelled and
// the dispatch that resumes the thread with the person's answer instead.
type Reversal struct {
	By                  string    `json:"by"`
	At                  time.Time `json:"at"`
	SuggestionBy        string    `json:"suggestion_by"`
	SuggestionAnswer    string    `json:"suggestion_answer"`
	CancelledDispatchID string    `json:"cancelled_dispatch_id"`
	NextDispatchID      string    `json:"next_dispatch_id"`
}

// StatusJoined is the status of a question that joined another, asked
// earlier on the same route and matching it (docs/router.md, "Ask once"): it is
// not asked on its own, and ends as the question it joined does.
const StatusJoined = "joined"

// WaitingThread is one thread waiting on a question.
type WaitingThread struct {
	// QuestionID is the thread's own question (the asked question for
	// the asking thread, a joined one for the others).
	QuestionID string    `json:"question_id"`
	DispatchID string    `json:"dispatch_id"`
	ThreadID   string    `json:"thread_id"`
	Subagent   string    `json:"subagent,omitempty"`
	AskedAt    time.Time `json:"asked_at"`
}

// Reused names the remembered decision that answered a question.
type Reused struct {
	// QuestionID is the question whose answer was remembered.
	QuestionID string    `json:"question_id"`
	AnsweredBy string    `json:"answered_by"`
	AnsweredAt time.Time `json:"answered_at"`
	// ShownDigest is the shown digest of the question the decision was
	// made on; it equals the answered question's, or memory would not
	// have answered it (docs/answering.md, "Bound answers").
	ShownDigest string `json:"shown_digest,omitempty"`
}

// Suggestion is an answer an answerer suggested, with its confidence
// (0 to 1) and why.
type Suggestion struct {
	Answer     string    `json:"answer"`
	Decision   string    `json:"decision,omitempty"`
	Confidence float64   `json:"confidence"`
	Rationale  string    `json:"rationale,omitempty"`
	By         string    `json:"by"`
	At         time.Time `json:"at"`
	// Accepted is true when the suggestion answered the question (its
	// confidence reached the route's auto_accept).
	Accepted bool `json:"accepted"`
}

// Answer is the data of dev.agora.answer.submitted.
type Answer struct {
	QuestionID string `json:"question_id"`
	Route      string `json:"route,omitempty"` // the route the answerer serves
	Answer     string `json:"answer"`
	Decision   string `json:"decision,omitempty"` // approve | reject, for approval questions
	AnsweredBy string `json:"answered_by"`
	Comment    string `json:"comment,omitempty"`
	// ShownDigest is the Question.ShownDigest of the question as the
	// person saw it; the router refuses the answer when the question no
	// longer shows that. Empty answers the question as it stands.
	ShownDigest string `json:"shown_digest,omitempty"`
	// Door is the door the answer was given through, as it names itself
	// (DoorInbox, DoorLink, ...; another answerer program may name itself
	// with any short token, 1 to 32 of [a-z0-9-]). The router records it
	// and the decision log's answered entry names it. Empty: not named.
	Door string `json:"door,omitempty"`
}

// The doors Agora's own answerers name themselves with (Answer.Door).
const (
	DoorInbox = "inbox"
	DoorLink  = "link"
	DoorSlack = "slack"
	DoorMCP   = "mcp"
	DoorA2A   = "a2a"
	DoorCLI   = "cli"
)

// Data is the payload of an Agora CloudEvent: one of *Request, *Accepted,
// *Started, *Finished, *NeedsInput, *Failed, *Cancelled, *Question or
// *Answer. The set is closed.
type Data interface {
	eventType() string
}

func (*Request) eventType() string    { return TypeRequested }
func (*Accepted) eventType() string   { return KindAccepted.Type() }
func (*Started) eventType() string    { return KindStarted.Type() }
func (*Finished) eventType() string   { return KindFinished.Type() }
func (*NeedsInput) eventType() string { return KindNeedsInput.Type() }
func (*Failed) eventType() string     { return KindFailed.Type() }
func (*Cancelled) eventType() string  { return KindCancelled.Type() }
func (q *Question) eventType() string { return q.Event.Type() }
func (*Answer) eventType() string     { return TypeAnswerSubmitted }

// Lifecycle is implemented by the data of the six lifecycle kinds.
type Lifecycle interface {
	Data
	LifecycleKind() Kind
	Base() Common
}

func (d *Accepted) LifecycleKind() Kind   { return KindAccepted }
func (d *Started) LifecycleKind() Kind    { return KindStarted }
func (d *Finished) LifecycleKind() Kind   { return KindFinished }
func (d *NeedsInput) LifecycleKind() Kind { return KindNeedsInput }
func (d *Failed) LifecycleKind() Kind     { return KindFailed }
func (d *Cancelled) LifecycleKind() Kind  { return KindCancelled }

// Base returns the common fields.
func (c Common) Base() Common { return c }

// QuestionID derives the question id of a dispatch: there is at most one
// question per dispatch, so creating it twice is harmless.
func QuestionID(dispatchID string) string { return "q-" + dispatchID }

// SetProducer records the run that produces a terminal event.
func (p *Producer) SetProducer(workerID string, attempt int) {
	p.WorkerID, p.Attempt = workerID, attempt
}
