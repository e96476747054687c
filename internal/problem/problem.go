// Package problem is the services' side of RFC 9457 problem documents:
// building the 422 that names every field at fault, and sending a problem
// as an HTTP answer or as a NATS micro error reply. The document itself is
// client.Problem, the error the Go SDK hands its callers; what only a
// server does with it lives here, out of the public package
// (docs/dispatcher.md, "The HTTP contract").
package problem

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// Invalid returns a 422 problem listing errs, its detail naming each field
// and what is wrong with it.
func Invalid(errs ...client.FieldError) *client.Problem {
	p := &client.Problem{Type: client.ProblemInvalidRequest, Title: "Invalid request", Status: http.StatusUnprocessableEntity, Errors: errs}
	parts := make([]string, len(errs))
	for i, e := range errs {
		parts[i] = e.Field + ": " + e.Message
	}
	p.Detail = strings.Join(parts, "; ")
	return p
}

// Write answers r with p as application/problem+json, its status p.Status
// and its instance r's path when p names none. A problem is never cached.
func Write(w http.ResponseWriter, r *http.Request, p *client.Problem) {
	out := *p
	if out.Instance == "" {
		out.Instance = r.URL.Path
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(out.Status)
	_ = json.NewEncoder(w).Encode(out)
}

// MicroReply encodes p as the micro error reply the Go client reads: the
// micro error headers (code = the HTTP status, description = title and
// detail on one line, at most 1 KiB) and the problem as the body. The
// services' NATS endpoints answer errors with it.
func MicroReply(p *client.Problem) (nats.Header, []byte) {
	data, _ := json.Marshal(p)
	desc := p.Title
	if p.Detail != "" {
		desc += ": " + p.Detail
	}
	desc = lifecycle.Clip(strings.NewReplacer("\r", " ", "\n", " ").Replace(desc), 1024-len("…")) // Clip adds the mark past n
	return nats.Header{
		micro.ErrorHeader:     []string{desc},
		micro.ErrorCodeHeader: []string{strconv.Itoa(p.Status)},
		"Content-Type":        []string{"application/problem+json"},
	}, data
}
