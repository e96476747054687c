package dispatcher_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/services/dispatcher"
)

// POST /v1/dispatches takes JSON: application/json (any parameters) or no
// Content-Type; any other type is a 415 naming the accepted one, and no
// dispatch is accepted.
func TestDispatchRefusesOtherContentTypes(t *testing.T) {
	h := newHarness(t, dispatcher.Config{})
	for _, tc := range []struct {
		ct     string
		status int
	}{
		{"text/plain", http.StatusUnsupportedMediaType},
		{"application/xml", http.StatusUnsupportedMediaType},
		{"application/x-www-form-urlencoded", http.StatusUnsupportedMediaType},
		{"application/json", http.StatusCreated},
		{"application/json; charset=utf-8", http.StatusCreated},
		{"", http.StatusCreated},
	} {
		t.Run(tc.ct, func(t *testing.T) {
			id := "ct-" + strings.NewReplacer("/", "-", ";", "", " ", "", "=", "-").Replace(tc.ct)
			var hdr []string
			if tc.ct != "" {
				hdr = []string{"Content-Type", tc.ct}
			}
			resp, data := h.do(http.MethodPost, "/v1/dispatches", `{"subagent":"planner","dispatch_id":"`+id+`"}`, "", hdr...)
			if resp.StatusCode != tc.status {
				t.Fatalf("%s: %d %s", tc.ct, resp.StatusCode, data)
			}
			if tc.status != http.StatusUnsupportedMediaType {
				return
			}
			var p client.Problem
			if err := json.Unmarshal(data, &p); err != nil || !strings.Contains(p.Detail, "application/json") {
				t.Errorf("problem %+v (%v): it should name application/json", p, err)
			}
			if h.hasRecord(id) {
				t.Errorf("a %s body was accepted as dispatch %s", tc.ct, id)
			}
		})
	}
}

// The artifacts listing of a dispatch that left none carries
// "artifacts": [] (the OpenAPI document requires it; harness.do checks).
func TestArtifactsListingWithNoneHasTheField(t *testing.T) {
	h := newHarness(t, dispatcher.Config{})
	d := h.dispatchMicro(lifecycle.Request{Subagent: "planner"})
	fin := h.publishAsWorker(&lifecycle.Finished{Common: d.Record.Common(), ExitCode: 0, Output: json.RawMessage(`{"ok":true}`)})
	h.projected(d.DispatchID, fin.ID())
	resp, data := h.do(http.MethodGet, "/v1/dispatches/"+d.DispatchID+"/artifacts", "", "")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, data)
	}
	var body map[string]json.RawMessage
	if err := json.Unmarshal(data, &body); err != nil {
		t.Fatal(err)
	}
	if string(body["artifacts"]) != "[]" {
		t.Errorf("artifacts = %s in %s; want []", body["artifacts"], data)
	}
}
