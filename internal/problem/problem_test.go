package problem_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/micro"

	"github.com/agora-dispatch/agora/internal/problem"
	"github.com/agora-dispatch/agora/pkg/client"
)

func TestInvalidNamesEveryField(t *testing.T) {
	p := problem.Invalid(client.FieldError{Field: "subagent", Message: "required"}, client.FieldError{Field: "env", Message: "FOO is not in env_allow"})
	if p.Status != http.StatusUnprocessableEntity || p.Type != client.ProblemInvalidRequest {
		t.Errorf("status %d type %q", p.Status, p.Type)
	}
	if p.Detail != "subagent: required; env: FOO is not in env_allow" {
		t.Errorf("detail %q", p.Detail)
	}
	if p.Field("env") == "" || !errors.Is(p, client.ErrInvalidRequest) {
		t.Errorf("field env %q, is invalid request %v", p.Field("env"), errors.Is(p, client.ErrInvalidRequest))
	}
}

func TestWrite(t *testing.T) {
	rec := httptest.NewRecorder()
	problem.Write(rec, httptest.NewRequest(http.MethodGet, "/v1/dispatches/x", nil), &client.Problem{Type: client.ProblemNotFound, Title: "Not found", Status: http.StatusNotFound})
	if rec.Code != http.StatusNotFound || rec.Header().Get("Content-Type") != "application/problem+json" || rec.Header().Get("Cache-Control") != "no-store" {
		t.Errorf("answer %d %v", rec.Code, rec.Header())
	}
	var got client.Problem
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil || got.Instance != "/v1/dispatches/x" || got.Status != http.StatusNotFound {
		t.Errorf("body %s: %v", rec.Body, err)
	}
}

func TestMicroReply(t *testing.T) {
	hdr, data := problem.MicroReply(&client.Problem{Title: "Invalid request", Status: 422, Detail: "line one\nline two " + strings.Repeat("x", 2000)})
	if hdr.Get(micro.ErrorCodeHeader) != "422" {
		t.Errorf("code %q", hdr.Get(micro.ErrorCodeHeader))
	}
	desc := hdr.Get(micro.ErrorHeader)
	if strings.ContainsAny(desc, "\r\n") || len(desc) > 1024 || !strings.HasPrefix(desc, "Invalid request: line one line two") {
		t.Errorf("description %d bytes: %.80q", len(desc), desc)
	}
	var back client.Problem
	if err := json.Unmarshal(data, &back); err != nil || back.Status != 422 || !strings.Contains(back.Detail, "\n") {
		t.Errorf("body: %+v %v", back, err)
	}
}
