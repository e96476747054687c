package client

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
)

// ErrNotFound reports that the dispatch, thread or question does not exist.
var ErrNotFound = errors.New("client: not found")

// ErrInvalidRequest reports a request the dispatcher refused; errors.As
// with a *Problem gives the fields at fault.
var ErrInvalidRequest = errors.New("client: invalid request")

// ErrUnavailable reports that no service answered, or that it answered
// with a temporary failure: the call may succeed when retried.
var ErrUnavailable = errors.New("client: service unavailable")

// ErrAlreadyAnswered reports an answer to a question that already has one
// (or has expired or been withdrawn); the first valid answer wins.
var ErrAlreadyAnswered = errors.New("client: question already answered")

// ErrInvalidAnswer reports an answer the router refused: not one of the
// question's options, or an approval without a decision.
var ErrInvalidAnswer = errors.New("client: invalid answer")

// ErrQuestionChanged reports an answer bound to what its question showed
// (Submission.ShownDigest) that the question no longer shows: reworded,
// moved, or asked anew. Show the question again and answer that.
var ErrQuestionChanged = errors.New("client: the question changed since it was shown")

// Problem types used by Agora (RFC 9457 "type" members).
const (
	ProblemInvalidRequest = "urn:agora:problem:invalid-request"
	ProblemNotFound       = "urn:agora:problem:not-found"
	ProblemUnauthorized   = "urn:agora:problem:unauthorized"
	ProblemForbidden      = "urn:agora:problem:forbidden"
	ProblemTooLarge       = "urn:agora:problem:too-large"
	ProblemUnavailable    = "urn:agora:problem:unavailable"
	ProblemInternal       = "urn:agora:problem:internal"
	// ProblemConflict: the request came too late for the state it would
	// change (a reversal after the thread went on); 409.
	ProblemConflict = "urn:agora:problem:conflict"
)

// Problem is an RFC 9457 problem document: the body of every error answer
// of the dispatcher's HTTP API (content type application/problem+json) and
// of its NATS micro endpoints (with the micro error headers, whose code is
// the HTTP status). Errors names each field at fault.
//
// A *Problem is an error; errors.Is matches it against ErrInvalidRequest
// (status 422 or 400), ErrNotFound (404) and ErrUnavailable (503).
type Problem struct {
	Type     string       `json:"type"`
	Title    string       `json:"title"`
	Status   int          `json:"status"`
	Detail   string       `json:"detail,omitempty"`
	Instance string       `json:"instance,omitempty"`
	Errors   []FieldError `json:"errors,omitempty"`
	// DispatchID names the dispatch a temporary failure left recorded but
	// maybe not queued: retrying with it completes that same dispatch.
	DispatchID string `json:"dispatch_id,omitempty"`
}

// FieldError is one problem with one field of a request. Field is the JSON
// member name ("subagent", "input", "env", …) or "request" for the request
// as a whole.
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// Error implements error.
func (p *Problem) Error() string {
	s := "client: " + strings.ToLower(p.Title)
	if p.Detail != "" {
		s += ": " + p.Detail
	}
	return s
}

// Is matches the sentinel errors of this package by status.
func (p *Problem) Is(target error) bool {
	switch target {
	case ErrInvalidRequest:
		return p.Status == http.StatusUnprocessableEntity || p.Status == http.StatusBadRequest
	case ErrNotFound:
		return p.Status == http.StatusNotFound
	case ErrUnavailable:
		return p.Status == http.StatusServiceUnavailable
	}
	return false
}

// Field returns the message for field, or "" when field is not at fault.
func (p *Problem) Field(field string) string {
	for _, e := range p.Errors {
		if e.Field == field {
			return e.Message
		}
	}
	return ""
}

// problemFromReply turns a micro error reply into a *Problem; nil when msg
// is not an error reply.
func problemFromReply(msg *nats.Msg) *Problem {
	code := msg.Header.Get(micro.ErrorCodeHeader)
	if code == "" {
		return nil
	}
	var p Problem
	if err := json.Unmarshal(msg.Data, &p); err != nil || p.Status == 0 {
		p = Problem{Title: msg.Header.Get(micro.ErrorHeader)}
		p.Status, _ = strconv.Atoi(code)
		if p.Status == 0 {
			p.Status = http.StatusInternalServerError
		}
	}
	return &p
}

// AnswerStatus is the outcome of an answer in an AnswerReply.
type AnswerStatus string

// The answer outcomes.
const (
	AnswerAccepted        AnswerStatus = "accepted"         // the answer won; the thread resumes
	AnswerAlreadyAnswered AnswerStatus = "already_answered" // another answer won, or the question expired or was withdrawn
	AnswerInvalid         AnswerStatus = "invalid"          // refused: Reason says why
	AnswerChanged         AnswerStatus = "changed"          // refused: the question no longer shows what the answer was given on
	AnswerNotFound        AnswerStatus = "not_found"        // no such question
	AnswerRetry           AnswerStatus = "retry"            // a temporary failure: send it again
)

// AnswerReply is the JSON body the router returns on agora.api.answer:
//
//	{"status": "accepted|already_answered|invalid|changed|not_found|retry",
//	 "reason": "…", "answered_by": "…", "answered_at": "RFC 3339 time"}
//
// AnsweredBy and AnsweredAt name the winning answer (for accepted, this
// one).
type AnswerReply struct {
	Status     AnswerStatus `json:"status"`
	Reason     string       `json:"reason,omitempty"`
	AnsweredBy string       `json:"answered_by,omitempty"`
	AnsweredAt *time.Time   `json:"answered_at,omitempty"`
}

// AnswerError is the error Answer returns for an answer that was not
// accepted. It wraps ErrAlreadyAnswered, ErrInvalidAnswer, ErrQuestionChanged, ErrNotFound
// or ErrUnavailable according to Reply.Status.
type AnswerError struct {
	QuestionID string
	Reply      AnswerReply
}

// Error implements error.
func (e *AnswerError) Error() string {
	s := fmt.Sprintf("client: answer to %s: %s", e.QuestionID, e.Reply.Status)
	if e.Reply.Reason != "" {
		s += ": " + e.Reply.Reason
	}
	if e.Reply.Status == AnswerAlreadyAnswered && e.Reply.AnsweredBy != "" {
		s += " (answered by " + e.Reply.AnsweredBy + ")"
	}
	return s
}

// Unwrap returns the sentinel error matching Reply.Status.
func (e *AnswerError) Unwrap() error {
	switch e.Reply.Status {
	case AnswerAlreadyAnswered:
		return ErrAlreadyAnswered
	case AnswerInvalid:
		return ErrInvalidAnswer
	case AnswerChanged:
		return ErrQuestionChanged
	case AnswerNotFound:
		return ErrNotFound
	case AnswerRetry:
		return ErrUnavailable
	}
	return nil
}
