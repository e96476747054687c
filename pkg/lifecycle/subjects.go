package lifecycle

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
)

// Stream, bucket and subject names (docs/wire.md).
const (
	StreamRequests  = "AGORA_REQUESTS"
	StreamDispatch  = "AGORA_DISPATCH"
	StreamLifecycle = "AGORA_LIFECYCLE"
	StreamQuestions = "AGORA_QUESTIONS"
	StreamAnswers   = "AGORA_ANSWERS"

	BucketSubagents  = "agora_subagents"
	BucketDispatches = "agora_dispatches"
	BucketQuestions  = "agora_questions"
	BucketState      = "agora_state" // object store
	// BucketMCPStates records the MCP server's request states once used,
	// so none is used twice (docs/mcp.md).
	BucketMCPStates = "agora_mcp_states"
	// BucketInboxSessions holds the inbox's sign-ins, keyed by a hash of
	// the session token, each expiring with its session (docs/inbox.md).
	BucketInboxSessions = "agora_inbox_sessions"
	// BucketAnswerLinks records each signed answer link once used, so none
	// answers twice (docs/inbox.md).
	BucketAnswerLinks = "agora_answer_links"
	// BucketSlackMessages maps an open question to its Slack messages
	// (docs/slack.md).
	BucketSlackMessages = "agora_slack_messages"
	// BucketDecisions holds what makes the router ask once
	// (docs/router.md, "Ask once"): open.<match> names the question waiting for
	// a match, memory.<match> a remembered decision (expiring by itself).
	BucketDecisions = "agora_decisions"
	// BucketRuntimes holds, under each runtime's name, the last worker that
	// announced it offers that runtime (docs/subagents.md, "Writing a
	// runtime").
	BucketRuntimes = "agora_runtimes"
	// BucketA2A is the A2A server's own state: push.<task id>, the push
	// notification configs of a task and their owner, and
	// task.<principal>.<task id>, the tasks a principal started through it
	// (docs/a2a.md, "Push notifications" and "Listing tasks").
	BucketA2A = "agora_a2a"

	// Durable consumer names.
	ConsumerDispatcher = "dispatcher" // AGORA_REQUESTS
	ConsumerWorkers    = "workers"    // AGORA_DISPATCH, shared by every worker

	SubjectRequestsAll  = "agora.requests.>"
	SubjectDispatchAll  = "agora.dispatch.>"
	SubjectLifecycleAll = "agora.lifecycle.>"
	SubjectQuestionsAll = "agora.questions.>"
	SubjectAnswersAll   = "agora.answers.>"

	APIDispatch = "agora.api.dispatch"
	APICancel   = "agora.api.cancel"
	APIStatus   = "agora.api.status"
	APIAnswer   = "agora.api.answer"
	// APIQuestions pages the questions waiting for an answer (the
	// router's index), oldest first.
	APIQuestions = "agora.api.questions"
	// APIDecisions lists the remembered decisions (docs/router.md, "Ask once");
	// APIDecisionsForget forgets one.
	APIDecisions       = "agora.api.decisions"
	APIDecisionsForget = "agora.api.decisions.forget"
)

// ErrBadToken reports a name or id that cannot be a subject token.
var ErrBadToken = errors.New("lifecycle: invalid subject token")

// ErrBadSubject reports a subject that is not of the expected shape.
var ErrBadSubject = errors.New("lifecycle: invalid subject")

// ValidToken reports nil when s can be a single NATS subject token: not
// empty, at most 256 bytes, and free of dots, wildcards, whitespace and
// control characters.
func ValidToken(s string) error {
	if s == "" {
		return fmt.Errorf("%w: empty", ErrBadToken)
	}
	if len(s) > 256 {
		return fmt.Errorf("%w: %d bytes, limit 256", ErrBadToken, len(s))
	}
	for _, r := range s {
		switch {
		case r == '.', r == '*', r == '>':
			return fmt.Errorf("%w: %q contains %q", ErrBadToken, s, r)
		case unicode.IsSpace(r), unicode.IsControl(r), r == unicode.ReplacementChar:
			return fmt.Errorf("%w: %q contains whitespace or a control character", ErrBadToken, s)
		}
	}
	return nil
}

func join(tokens ...string) (string, error) {
	for _, t := range tokens {
		if err := ValidToken(t); err != nil {
			return "", err
		}
	}
	return strings.Join(tokens, "."), nil
}

// RequestSubject is agora.requests.<subagent>.
func RequestSubject(subagent string) (string, error) { return join("agora", "requests", subagent) }

// DispatchSubject is agora.dispatch.<subagent>.
func DispatchSubject(subagent string) (string, error) { return join("agora", "dispatch", subagent) }

// LifecycleSubject is agora.lifecycle.<kind>.<thread_id>.<dispatch_id>.
func LifecycleSubject(k Kind, threadID, dispatchID string) (string, error) {
	if !k.Valid() {
		return "", fmt.Errorf("%w: unknown kind %q", ErrBadSubject, k)
	}
	return join("agora", "lifecycle", string(k), threadID, dispatchID)
}

// LifecycleFilter is a subject filter over lifecycle events; empty
// arguments match any value.
func LifecycleFilter(k Kind, threadID, dispatchID string) string {
	w := func(s string) string {
		if s == "" {
			return "*"
		}
		return s
	}
	return "agora.lifecycle." + w(string(k)) + "." + w(threadID) + "." + w(dispatchID)
}

// QuestionSubject is agora.questions.<route>.<question_id>.<event>.
func QuestionSubject(route, questionID string, ev QuestionEvent) (string, error) {
	if !ev.Valid() {
		return "", fmt.Errorf("%w: unknown question event %q", ErrBadSubject, ev)
	}
	return join("agora", "questions", route, questionID, string(ev))
}

// AnswerSubject is agora.answers.<route>.<question_id>.
func AnswerSubject(route, questionID string) (string, error) {
	return join("agora", "answers", route, questionID)
}

// APIAnswerRoute is agora.api.answer.<route>, the answer endpoint of one
// route: the router accepts an answer (or decline) there only for a
// question that is on that route now, so subject permissions on it decide
// which routes a NATS user may answer. The generic APIAnswer answers any
// route and is for trusted callers only.
func APIAnswerRoute(route string) (string, error) { return join("agora", "api", "answer", route) }

// APIReverseRoute is agora.api.reverse.<route>, where a person's answer
// reverses an accepted suggestion of one route's question
// (docs/answering.md, "Reversing an accepted suggestion"): the router
// reverses there only a question on that route, so subject permissions
// on it decide who may reverse what. There is no unscoped door.
func APIReverseRoute(route string) (string, error) { return join("agora", "api", "reverse", route) }

// APIQuestionsRoute is agora.api.questions.<route>, the waiting questions
// of one route: the router answers there only with questions that wait on
// that route now, so subject permissions on it decide whose questions an
// answerer may read (docs/security.md, "What answerers read"). The generic
// APIQuestions reads every route and is for trusted callers only.
func APIQuestionsRoute(route string) (string, error) {
	return join("agora", "api", "questions", route)
}

// ParseAPIQuestionsRoute parses agora.api.questions.<route>.
func ParseAPIQuestionsRoute(s string) (route string, err error) {
	t, err := split(s, 4, "agora", "api", "questions")
	if err != nil {
		return "", err
	}
	return t[3], nil
}

// ParseAPIAnswerRoute parses agora.api.answer.<route>.
func ParseAPIAnswerRoute(s string) (route string, err error) {
	t, err := split(s, 4, "agora", "api", "answer")
	if err != nil {
		return "", err
	}
	return t[3], nil
}

// APICaller is agora.api.<verb>.<user>, a caller's own subject of the
// dispatcher's endpoint (APIDispatch, APICancel or APIStatus): granted to
// NATS user alone, it makes the dispatcher take user as the caller's
// principal (docs/security.md, "The NATS API").
func APICaller(endpoint, user string) (string, error) {
	switch endpoint {
	case APIDispatch, APICancel, APIStatus:
	default:
		return "", fmt.Errorf("%w: %q has no caller subjects (want %s, %s or %s)", ErrBadSubject, endpoint, APIDispatch, APICancel, APIStatus)
	}
	if err := ValidToken(user); err != nil {
		return "", err
	}
	return endpoint + "." + user, nil
}

// ParseAPICaller parses agora.api.<verb>.<user> (APICaller); ok is false
// for any other subject, the trusted endpoints included.
func ParseAPICaller(s string) (endpoint, user string, ok bool) {
	t, err := split(s, 4, "agora", "api")
	if err != nil {
		return "", "", false
	}
	endpoint = "agora.api." + t[2]
	switch endpoint {
	case APIDispatch, APICancel, APIStatus:
		return endpoint, t[3], true
	}
	return "", "", false
}

// CancelSubject is the core subject agora.control.cancel.<dispatch_id>.
func CancelSubject(dispatchID string) (string, error) {
	return join("agora", "control", "cancel", dispatchID)
}

// CancelThreadPrefix prefixes the core subject on which the dispatcher asks
// the routers to end a thread paused on a question:
// agora.control.cancel-thread.<thread_id>, with the body of a dispatch's
// cancel whose dispatch_id is the paused dispatch (docs/wire.md, "Core
// subjects and micro services").
const CancelThreadPrefix = "agora.control.cancel-thread."

// AcceptedHeader is a NATS header of a work message on
// agora.dispatch.<subagent> naming the id of its dispatch's accepted event,
// published before it. A worker that finds the dispatch's chain empty
// under it waits for that event before it claims the run: a dispatcher
// from before AcceptedSeqHeader sent the two back to back, to two streams
// that do not store in the order they were sent (docs/worker.md#fencing).
// A work message without it (published by hand) is run on an empty chain.
const AcceptedHeader = "Agora-Accepted"

// AcceptedSeqHeader is a NATS header of a work message naming the stream
// sequence of its dispatch's accepted event on AGORA_LIFECYCLE, stored
// before the work was published: a worker's first delivery fences its
// `started` on it without reading the chain; a redelivery, or a message
// without it, reads the chain (docs/worker.md#fencing). The fence is
// checked by the stream, so a wrong value costs a refused `started` and a
// read, never a run that does not own its dispatch.
const AcceptedSeqHeader = "Agora-Accepted-Sequence"

// CancelThreadSubject is agora.control.cancel-thread.<thread_id>.
func CancelThreadSubject(threadID string) (string, error) {
	return join("agora", "control", "cancel-thread", threadID)
}

// LifecycleAddr is a parsed lifecycle subject.
type LifecycleAddr struct {
	Kind       Kind
	ThreadID   string
	DispatchID string
}

// ParseLifecycleSubject parses agora.lifecycle.<kind>.<thread_id>.<dispatch_id>.
func ParseLifecycleSubject(s string) (LifecycleAddr, error) {
	t, err := split(s, 5, "agora", "lifecycle")
	if err != nil {
		return LifecycleAddr{}, err
	}
	a := LifecycleAddr{Kind: Kind(t[2]), ThreadID: t[3], DispatchID: t[4]}
	if !a.Kind.Valid() {
		return LifecycleAddr{}, fmt.Errorf("%w: %q: unknown kind %q", ErrBadSubject, s, t[2])
	}
	return a, nil
}

// QuestionAddr is a parsed question subject.
type QuestionAddr struct {
	Route      string
	QuestionID string
	Event      QuestionEvent
}

// ParseQuestionSubject parses agora.questions.<route>.<question_id>.<event>.
func ParseQuestionSubject(s string) (QuestionAddr, error) {
	t, err := split(s, 5, "agora", "questions")
	if err != nil {
		return QuestionAddr{}, err
	}
	a := QuestionAddr{Route: t[2], QuestionID: t[3], Event: QuestionEvent(t[4])}
	if !a.Event.Valid() {
		return QuestionAddr{}, fmt.Errorf("%w: %q: unknown question event %q", ErrBadSubject, s, t[4])
	}
	return a, nil
}

// ParseAnswerSubject parses agora.answers.<route>.<question_id>.
func ParseAnswerSubject(s string) (route, questionID string, err error) {
	t, err := split(s, 4, "agora", "answers")
	if err != nil {
		return "", "", err
	}
	return t[2], t[3], nil
}

// ParseRequestSubject parses agora.requests.<subagent>.
func ParseRequestSubject(s string) (subagent string, err error) {
	t, err := split(s, 3, "agora", "requests")
	if err != nil {
		return "", err
	}
	return t[2], nil
}

// ParseDispatchSubject parses agora.dispatch.<subagent>.
func ParseDispatchSubject(s string) (subagent string, err error) {
	t, err := split(s, 3, "agora", "dispatch")
	if err != nil {
		return "", err
	}
	return t[2], nil
}

// ParseCancelSubject parses agora.control.cancel.<dispatch_id>.
func ParseCancelSubject(s string) (dispatchID string, err error) {
	t, err := split(s, 4, "agora", "control", "cancel")
	if err != nil {
		return "", err
	}
	return t[3], nil
}

func split(s string, n int, prefix ...string) ([]string, error) {
	t := strings.Split(s, ".")
	if len(t) != n {
		return nil, fmt.Errorf("%w: %q: want %d tokens, got %d", ErrBadSubject, s, n, len(t))
	}
	for i, p := range prefix {
		if t[i] != p {
			return nil, fmt.Errorf("%w: %q: token %d is %q, want %q", ErrBadSubject, s, i+1, t[i], p)
		}
	}
	for _, tok := range t[len(prefix):] {
		if err := ValidToken(tok); err != nil {
			return nil, fmt.Errorf("%w: %q: %v", ErrBadSubject, s, err)
		}
	}
	return t, nil
}
