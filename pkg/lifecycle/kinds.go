package lifecycle

// Kind is one of the six lifecycle kinds of a dispatch. The set is closed.
type Kind string

// The six lifecycle kinds (docs/wire.md, "Lifecycle kinds").
const (
	KindAccepted   Kind = "accepted"    // the dispatcher validated and queued the request
	KindStarted    Kind = "started"     // a worker began a delivery
	KindFinished   Kind = "finished"    // the runtime exited 0 and wrote no sentinel
	KindNeedsInput Kind = "needs_input" // the runtime wrote a valid sentinel
	KindFailed     Kind = "failed"      // anything else; see Reason
	KindCancelled  Kind = "cancelled"   // a cancel was honoured
)

// Kinds returns the six lifecycle kinds in lifecycle order.
func Kinds() []Kind {
	return []Kind{KindAccepted, KindStarted, KindFinished, KindNeedsInput, KindFailed, KindCancelled}
}

// Valid reports whether k is one of the six kinds.
func (k Kind) Valid() bool {
	switch k {
	case KindAccepted, KindStarted, KindFinished, KindNeedsInput, KindFailed, KindCancelled:
		return true
	}
	return false
}

// Terminal reports whether k ends a dispatch. Exactly one terminal event
// exists per dispatch id.
func (k Kind) Terminal() bool {
	switch k {
	case KindFinished, KindNeedsInput, KindFailed, KindCancelled:
		return true
	}
	return false
}

// Type is the CloudEvents type of the kind: dev.agora.dispatch.<kind>.
func (k Kind) Type() string { return typePrefixDispatch + string(k) }

// Reason is why a dispatch failed. The set is closed.
type Reason string

// The failure reasons (docs/wire.md, "Lifecycle kinds").
const (
	ReasonRejected            Reason = "rejected"             // the dispatcher refused the request
	ReasonWorkerFailed        Reason = "worker-failed"        // malformed or oversized sentinel, workspace or adapter error
	ReasonProviderFailed      Reason = "provider-failed"      // the runtime exited non-zero and wrote no sentinel
	ReasonTimeout             Reason = "timeout"              // the runtime passed its time limit and wrote no sentinel
	ReasonRedeliveryExhausted Reason = "redelivery-exhausted" // the work message hit MaxDeliver
	ReasonMaxRounds           Reason = "max-rounds"           // the thread would exceed its round limit
	ReasonUnanswered          Reason = "unanswered"           // the question expired with on_expiry fail
	ReasonLimitExceeded       Reason = "limit-exceeded"       // the run passed a sandbox limit; the detail names it
	ReasonWorkspaceLost       Reason = "workspace-lost"       // the run's workspace was removed, replaced or unreadable before its results were read
)

// Reasons returns every failure reason.
func Reasons() []Reason {
	return []Reason{ReasonRejected, ReasonWorkerFailed, ReasonProviderFailed, ReasonTimeout,
		ReasonRedeliveryExhausted, ReasonMaxRounds, ReasonUnanswered, ReasonLimitExceeded, ReasonWorkspaceLost}
}

// Valid reports whether r is one of the failure reasons.
func (r Reason) Valid() bool {
	for _, v := range Reasons() {
		if r == v {
			return true
		}
	}
	return false
}

// QuestionEvent is a step in a question's lifecycle:
// asked → answered | expired | withdrawn, plus escalated steps; a question
// that joined a matching one already asked starts joined instead of asked;
// a person's reversal of an accepted suggestion is a reversed step.
type QuestionEvent string

// The question events (docs/wire.md, "Questions and answers").
const (
	QuestionAsked     QuestionEvent = "asked"
	QuestionAnswered  QuestionEvent = "answered"
	QuestionExpired   QuestionEvent = "expired"
	QuestionWithdrawn QuestionEvent = "withdrawn"
	QuestionEscalated QuestionEvent = "escalated"
	QuestionJoined    QuestionEvent = "joined"
	QuestionReversed  QuestionEvent = "reversed"
)

// QuestionEvents returns every question event.
func QuestionEvents() []QuestionEvent {
	return []QuestionEvent{QuestionAsked, QuestionAnswered, QuestionExpired, QuestionWithdrawn, QuestionEscalated, QuestionJoined, QuestionReversed}
}

// Valid reports whether q is a known question event.
func (q QuestionEvent) Valid() bool {
	for _, v := range QuestionEvents() {
		if q == v {
			return true
		}
	}
	return false
}

// Type is the CloudEvents type of the question event: dev.agora.question.<event>.
func (q QuestionEvent) Type() string { return typePrefixQuestion + string(q) }

// CloudEvents types that are not lifecycle kinds.
const (
	TypeRequested       = "dev.agora.dispatch.requested"
	TypeAnswerSubmitted = "dev.agora.answer.submitted"

	typePrefixDispatch = "dev.agora.dispatch."
	typePrefixQuestion = "dev.agora.question."
)

// Types returns every CloudEvents type Agora emits.
func Types() []string {
	t := []string{TypeRequested, TypeAnswerSubmitted, TypeProgress}
	for _, k := range Kinds() {
		t = append(t, k.Type())
	}
	for _, q := range QuestionEvents() {
		t = append(t, q.Type())
	}
	return t
}

// QuestionKind classifies a question, as its sentinel's kind does
// (pkg/sentinel), so that routes and answerers can treat an approval
// differently from a request for information. On the wire it is the
// "kind" string of needs_input and question events; empty means none was
// given.
type QuestionKind string

// The four kinds of question (docs/wire.md, "The sentinel file").
const (
	QuestionClarification QuestionKind = "clarification" // what an ambiguous instruction means
	QuestionDecision      QuestionKind = "decision"      // a choice, usually among the options
	QuestionInformation   QuestionKind = "information"   // a fact the sub-agent cannot find itself
	QuestionApproval      QuestionKind = "approval"      // permission; the answer carries a decision
)

// KindIs reports whether the question is of kind k.
func (q *Question) KindIs(k QuestionKind) bool { return q.Kind == k }
