package dispatcher

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"reflect"
	"strings"
	"time"

	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// ProblemConflict is the problem type of a dispatch_id reused for a
// different request (HTTP 409, micro error 409). See docs/dispatcher.md.
const ProblemConflict = "urn:agora:problem:conflict"

// conflictError is a request whose dispatch_id names a dispatch recorded
// for a different request.
type conflictError struct{ p *client.Problem }

func (e *conflictError) Error() string { return e.p.Error() }

// As lets errors.As find the problem a synchronous door answers.
func (e *conflictError) As(target any) bool {
	if p, ok := target.(**client.Problem); ok {
		*p = e.p
		return true
	}
	return false
}

// requestConflict compares a request with the one recorded under its
// dispatch_id: the fields a client sets must be the same (input compared
// as JSON, so formatting does not count); fields it left out, which the
// dispatcher filled in (timeout, max_rounds, ids), do not count. It
// returns nil for the same request (an idempotent retry).
func requestConflict(stored *lifecycle.Request, in lifecycle.Request) error {
	if stored == nil {
		return nil
	}
	var diff []string
	add := func(field string, differs bool) {
		if differs {
			diff = append(diff, field)
		}
	}
	add("subagent", in.Subagent != "" && in.Subagent != stored.Subagent)
	add("input", !sameJSON(in.Input, stored.Input))
	add("target", in.Target != stored.Target)
	add("env", !maps.Equal(in.Env, stored.Env))
	add("labels", !maps.Equal(in.Labels, stored.Labels))
	if in.Timeout != "" {
		a, errA := time.ParseDuration(in.Timeout)
		b, errB := time.ParseDuration(stored.Timeout)
		add("timeout", errA != nil || errB != nil || a != b)
	}
	add("max_rounds", in.MaxRounds != 0 && in.MaxRounds != stored.MaxRounds)
	add("thread_id", in.ThreadID != "" && in.ThreadID != stored.ThreadID)
	add("parent_id", in.ParentID != "" && in.ParentID != stored.ParentID)
	add("round", in.Round != 0 && in.Round != stored.Round)
	add("question_id", in.QuestionID != "" && in.QuestionID != stored.QuestionID)
	if len(diff) == 0 {
		return nil
	}
	p := &client.Problem{Type: ProblemConflict, Title: "Conflict", Status: http.StatusConflict, DispatchID: stored.DispatchID,
		Detail: fmt.Sprintf("dispatch_id %s is already the dispatch of a different request (%s differ): send the same request to get that dispatch, or choose a new dispatch_id",
			stored.DispatchID, strings.Join(diff, ", "))}
	for _, f := range diff {
		p.Errors = append(p.Errors, client.FieldError{Field: f, Message: "differs from the request recorded under this dispatch_id"})
	}
	return &conflictError{p: p}
}

// sameJSON compares two JSON objects by value; empty and null are {}.
func sameJSON(a, b json.RawMessage) bool {
	norm := func(m json.RawMessage) any {
		if t := bytes.TrimSpace(m); len(t) == 0 || bytes.Equal(t, []byte("null")) {
			return map[string]any{}
		}
		d := json.NewDecoder(bytes.NewReader(m))
		d.UseNumber()
		var v any
		if d.Decode(&v) != nil {
			return string(m)
		}
		return v
	}
	return reflect.DeepEqual(norm(a), norm(b))
}
