package dispatcher

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"math/big"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// ProblemConflict is the problem type of a dispatch_id reused for a
// different request (HTTP 409, micro error 409). See docs/dispatcher.md,
// "Idempotency and conflicts".
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
// dispatch_id, as docs/dispatcher.md describes: every field a client or
// the router sets must be the same (input compared as JSON values, so
// formatting, key order and 1 against 1.0 do not count). What the
// dispatcher fills in does not count when the request leaves it out:
// timeout and max_rounds (from the definition), thread_id of a root (its
// dispatch_id), subagent_revision (always the dispatcher's). It returns
// nil for the same request (an idempotent retry), else a *conflictError
// naming the fields that differ.
func requestConflict(stored *lifecycle.Request, in lifecycle.Request) error {
	if stored == nil {
		return nil // a record of a refused request: nothing to compare
	}
	var diff []string
	add := func(field string, differs bool) {
		if differs {
			diff = append(diff, field)
		}
	}
	add("subagent", in.Subagent != stored.Subagent)
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
	thread := in.ThreadID
	if thread == "" && in.Round == 0 {
		thread = stored.DispatchID // what complete fills in for a root
	}
	add("thread_id", thread != stored.ThreadID)
	add("parent_id", in.ParentID != stored.ParentID)
	add("round", in.Round != stored.Round)
	add("question_id", in.QuestionID != stored.QuestionID)
	add("partial_state_ref", in.PartialStateRef != stored.PartialStateRef)
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

// sameJSON compares two JSON values by value: object key order, spacing
// and number spelling (1, 1.0, 1e0) do not count; absent and null are {}
// (what complete stores for a request without input).
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
	return equalJSON(norm(a), norm(b))
}

// equalJSON compares decoded JSON values (numbers as json.Number) by value.
func equalJSON(a, b any) bool {
	switch a := a.(type) {
	case map[string]any:
		b, ok := b.(map[string]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for k, va := range a {
			vb, ok := b[k]
			if !ok || !equalJSON(va, vb) {
				return false
			}
		}
		return true
	case []any:
		b, ok := b.([]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for i := range a {
			if !equalJSON(a[i], b[i]) {
				return false
			}
		}
		return true
	case json.Number:
		b, ok := b.(json.Number)
		if !ok {
			return false
		}
		return sameNumber(string(a), string(b))
	}
	return a == b // string, bool, nil, or the raw text of undecodable JSON
}

// sameNumber compares two JSON numbers exactly. An exponent beyond ±400
// (no float64 reaches it) is compared as text, so a hostile 1e999999999
// costs nothing.
func sameNumber(a, b string) bool {
	if a == b {
		return true
	}
	if bigExponent(a) || bigExponent(b) {
		return false
	}
	x, okA := new(big.Rat).SetString(a)
	y, okB := new(big.Rat).SetString(b)
	return okA && okB && x.Cmp(y) == 0
}

func bigExponent(n string) bool {
	i := strings.IndexAny(n, "eE")
	if i < 0 {
		return false
	}
	e, err := strconv.Atoi(strings.TrimPrefix(n[i+1:], "+"))
	return err != nil || e > 400 || e < -400
}
