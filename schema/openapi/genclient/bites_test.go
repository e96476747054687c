package genclient_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/agora-dispatch/agora/schema/openapi/genclient"
)

// The contract fails what disagrees with the document: a server that
// answers wrongly (an undocumented status or content type, a body off its
// schema, a path the document lacks) and a request off its schema are each
// reported. The wrong server here is a bare HTTP handler: no Agora part is
// faked, only wrong answers are made.
func TestContractBites(t *testing.T) {
	wrong := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/dispatches/teapot":
			w.WriteHeader(http.StatusTeapot)
		case "/v1/dispatches/text":
			w.Header().Set("Content-Type", "text/plain")
			fmt.Fprint(w, "a record")
		case "/v1/dispatches/short":
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"dispatch_id":"short","status":"done"}`)
		case "/v1/events":
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{}`)
		case "/inbox/api/questions":
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"questions":[],"count":0,"cursor":"x"}`)
		default:
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprint(w, `{"type":"urn:agora:problem:not-found","title":"Not found","status":404}`)
		}
	})
	web := httptest.NewServer(wrong)
	t.Cleanup(web.Close)
	k := newContract(t, web.URL)
	var mu sync.Mutex
	var got []string
	k.errorf = func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, fmt.Sprintf(format, args...))
	}
	c, err := genclient.NewClientWithResponses(web.URL, genclient.WithHTTPClient(&http.Client{Transport: k}))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	for _, tc := range []struct {
		name, want string
		call       func() error
	}{
		{"undocumented status", "does not list for it", func() error { _, err := c.GetDispatch(ctx, "teapot"); return err }},
		{"undocumented content type", `"text/plain"`, func() error { _, err := c.GetDispatch(ctx, "text"); return err }},
		{"body off its schema", "doesn't match schema", func() error { _, err := c.GetDispatch(ctx, "short"); return err }},
		{"member the schema lacks", "cursor", func() error { _, err := c.ListQuestions(ctx, nil); return err }},
		{"a stream that is not one", "Content-Type has unexpected value", func() error { _, err := c.Events(ctx, nil); return err }},
		{"request off its schema", "request POST /v1/dispatches", func() error {
			_, err := c.DispatchWithBody(ctx, nil, "application/json", strings.NewReader(`{"subagent":"a","inptu":{}}`))
			return err
		}},
		{"path the document lacks", "is not an operation", func() error {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, web.URL+"/v1/nope", nil)
			resp, err := (&http.Client{Transport: k}).Do(req)
			if err == nil {
				resp.Body.Close()
			}
			return err
		}},
	} {
		mu.Lock()
		got = nil
		mu.Unlock()
		if err := tc.call(); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		mu.Lock()
		all := strings.Join(got, "\n")
		mu.Unlock()
		if !strings.Contains(all, tc.want) {
			t.Errorf("%s: the contract reported %q, want a report with %q", tc.name, all, tc.want)
		}
	}
	// A documented answer passes.
	got = nil
	if r, err := c.GetDispatchWithResponse(ctx, "missing"); err != nil || r.ApplicationproblemJSON404 == nil || len(got) > 0 {
		t.Errorf("a documented 404: %v %v %q", err, r, got)
	}
}
