package dispatcher_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/micro"

	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/services/dispatcher"
)

// refusedVia sends body through one door and returns what the refusal
// says: the problem's detail (HTTP and micro, which must answer 422) or
// the detail of the failed rejected event (stream).
func (h *harness) refusedVia(door, subagentName, body string) string {
	h.t.Helper()
	var p client.Problem
	switch door {
	case "http":
		resp, data := h.do(http.MethodPost, "/v1/dispatches", body, "")
		if resp.StatusCode != http.StatusUnprocessableEntity {
			h.t.Fatalf("http: status %d, want 422: %s", resp.StatusCode, data)
		}
		if err := json.Unmarshal(data, &p); err != nil {
			h.t.Fatal(err)
		}
	case "micro":
		m := h.microCall(lifecycle.APIDispatch, []byte(body), nil)
		if code := m.Header.Get(micro.ErrorCodeHeader); code != "422" {
			h.t.Fatalf("micro: error code %q, want 422: %s", code, m.Data)
		}
		if err := json.Unmarshal(m.Data, &p); err != nil {
			h.t.Fatal(err)
		}
	case "stream":
		after := h.lastSeq()
		h.publishRawRequest(subagentName, body)
		f := h.nextFailed(after)
		if f.Reason != lifecycle.ReasonRejected || f.Subagent != subagentName {
			h.t.Fatalf("stream: failed %s of %s, want rejected of %s: %s", f.Reason, f.Subagent, subagentName, f.Detail)
		}
		return f.Detail
	}
	return p.Detail
}

// nothingQueued checks that no refused request reached AGORA_DISPATCH.
func (h *harness) nothingQueued() {
	h.t.Helper()
	if info := natstest.StreamInfo(h.t, h.js, lifecycle.StreamDispatch); info.State.Msgs != 0 {
		h.t.Errorf("refused requests reached AGORA_DISPATCH: %+v", info)
	}
}

// The operator's floor: a request whose stored definition is below it is
// refused on every door, naming the setting that would allow it, and
// nothing is queued.
func TestOperatorFloor(t *testing.T) {
	h := newHarness(t, dispatcher.Config{SandboxAllowPaths: []string{"/srv"}, SandboxAllowHosts: []string{"*.example.com:443"}})
	def := func(name string, box subagent.Sandbox) subagent.Definition {
		return subagent.Definition{Name: name, Runtime: subagent.RuntimeExec, Command: []string{"true"}, Sandbox: box}
	}
	h.putSubagent(def("loose", subagent.Sandbox{Mode: subagent.SandboxOff}))
	h.putSubagent(def("wide", subagent.Sandbox{WritePaths: []string{"/etc"}}))
	h.putSubagent(def("reach", subagent.Sandbox{Network: subagent.Network{Allow: []string{"evil.test:443"}}}))
	cases := []struct {
		name, subagent string
		want           []string
	}{
		{"mode off below the default floor", "loose", []string{`"loose" is below the operator's sandbox floor`, `sandbox.mode "off" is below the operator's floor "standard" (AGORA_SANDBOX_FLOOR)`}},
		{"a write path outside the allowed ones", "wide", []string{`sandbox.write_paths "/etc" is not under a path the operator allows (AGORA_SANDBOX_ALLOW_PATHS=/srv)`}},
		{"a destination outside the allowed ones", "reach", []string{`sandbox.network.allow "evil.test:443" is not a destination the operator allows (AGORA_SANDBOX_ALLOW_HOSTS=*.example.com:443)`}},
	}
	for _, tc := range cases {
		for _, door := range doors {
			t.Run(tc.name+"/"+door, func(t *testing.T) {
				detail := h.refusedVia(door, tc.subagent, `{"subagent":"`+tc.subagent+`"}`)
				if !strings.HasPrefix(detail, "subagent: ") {
					t.Errorf("the refusal does not name the field subagent: %s", detail)
				}
				for _, w := range tc.want {
					if !strings.Contains(detail, w) {
						t.Errorf("refusal %q does not say %q", detail, w)
					}
				}
			})
		}
	}
	h.nothingQueued()

	t.Run("within the floor", func(t *testing.T) {
		h.putSubagent(def("fine", subagent.Sandbox{Mode: subagent.SandboxStrict, ReadPaths: []string{"/srv"}, WritePaths: []string{"/srv/out"},
			Network: subagent.Network{Allow: []string{"api.example.com:443", "*.cdn.example.com:443"}}}))
		d := h.dispatchMicro(lifecycle.Request{Subagent: "fine"})
		if st, _ := h.record(d.DispatchID); d.Record.Status != lifecycle.KindAccepted || !st.Queued {
			t.Errorf("record: %+v, stored queued %v", d.Record, st.Queued)
		}
	})
	t.Run("a definition fixed is accepted at once", func(t *testing.T) {
		h.putSubagent(def("loose", subagent.Sandbox{}))
		d := h.dispatchMicro(lifecycle.Request{Subagent: "loose"})
		if st, _ := h.record(d.DispatchID); d.Record.Status != lifecycle.KindAccepted || !st.Queued {
			t.Errorf("record: %+v, stored queued %v", d.Record, st.Queued)
		}
	})
}

// A floor raised above definitions stored earlier refuses them.
func TestOperatorFloorRaised(t *testing.T) {
	h := newHarness(t, dispatcher.Config{SandboxFloor: subagent.SandboxStrict})
	for _, door := range doors {
		t.Run(door, func(t *testing.T) {
			detail := h.refusedVia(door, "planner", `{"subagent":"planner"}`)
			if want := `sandbox.mode "standard" is below the operator's floor "strict" (AGORA_SANDBOX_FLOOR)`; !strings.Contains(detail, want) {
				t.Errorf("refusal %q does not say %q", detail, want)
			}
		})
	}
	h.nothingQueued()
}

func TestFloorConfig(t *testing.T) {
	cases := []struct {
		cfg  dispatcher.Config
		want string // "" means valid
	}{
		{dispatcher.Config{}, ""},
		{dispatcher.Config{SandboxFloor: "off", SandboxAllowPaths: []string{"/srv", "/data"}, SandboxAllowHosts: []string{"none"}}, ""},
		{dispatcher.Config{SandboxFloor: "loose"}, `AGORA_SANDBOX_FLOOR="loose"`},
		{dispatcher.Config{SandboxAllowPaths: []string{"srv"}}, "AGORA_SANDBOX_ALLOW_PATHS"},
		{dispatcher.Config{SandboxAllowHosts: []string{"example.com"}}, "AGORA_SANDBOX_ALLOW_HOSTS"},
	}
	for _, tc := range cases {
		err := tc.cfg.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%+v: %v", tc.cfg, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%+v: error %v, want one naming %s", tc.cfg, err, tc.want)
		}
	}
}

// A request's timeout can only shorten its definition's: a root asking
// for more is refused naming both values; a later round (the router
// carries the paused round's timeout) is cut to the definition's.
func TestTimeoutOnlyShortens(t *testing.T) {
	h := newHarness(t, dispatcher.Config{}) // planner: timeout 5m
	h.putSubagent(subagent.Definition{Name: "untimed", Runtime: subagent.RuntimeExec, Command: []string{"true"}})
	refused := []struct {
		name, subagent, body, want string
	}{
		{"far longer", "planner", `{"subagent":"planner","timeout":"1000h"}`, `timeout: "1000h" is longer than the sub-agent's timeout 5m: a request can only shorten it`},
		{"a second longer", "planner", `{"subagent":"planner","timeout":"5m1s"}`, `timeout: "5m1s" is longer than the sub-agent's timeout 5m`},
		{"longer than the default", "untimed", `{"subagent":"untimed","timeout":"31m"}`, `timeout: "31m" is longer than the sub-agent's timeout 30m0s`},
	}
	for _, tc := range refused {
		for _, door := range doors {
			t.Run(tc.name+"/"+door, func(t *testing.T) {
				if detail := h.refusedVia(door, tc.subagent, tc.body); !strings.Contains(detail, tc.want) {
					t.Errorf("refusal %q does not say %q", detail, tc.want)
				}
			})
		}
	}
	h.nothingQueued()

	accepted := []struct {
		name string
		req  lifecycle.Request
		want string
	}{
		{"shorter", lifecycle.Request{Subagent: "planner", Timeout: "2m"}, "2m"},
		{"equal in other words", lifecycle.Request{Subagent: "planner", Timeout: "300s"}, "300s"},
		{"left out", lifecycle.Request{Subagent: "planner"}, "5m"},
		{"a later round asking for more is cut", lifecycle.Request{Subagent: "planner", ThreadID: "t-timeout", ParentID: "root", Round: 1, QuestionID: "q-root", Timeout: "1000h"}, "5m"},
	}
	for _, tc := range accepted {
		t.Run(tc.name, func(t *testing.T) {
			d := h.dispatchMicro(tc.req)
			if d.Record.Status != lifecycle.KindAccepted || d.Record.Request == nil || d.Record.Request.Timeout != tc.want {
				t.Fatalf("record: %+v, want accepted with timeout %s", d.Record, tc.want)
			}
			q := h.queued(d.Record.DispatchID)
			if len(q) != 1 || q[0].Timeout != tc.want {
				t.Errorf("queued %+v, want one request with timeout %s", q, tc.want)
			}
		})
	}
	t.Run("a repeat of the cut round is the same dispatch", func(t *testing.T) {
		req := lifecycle.Request{DispatchID: "cut-1", Subagent: "planner", ThreadID: "t-timeout", ParentID: "root", Round: 2, QuestionID: "q-cut", Timeout: "1000h"}
		first := h.dispatchMicro(req)
		again := h.dispatchMicro(req)
		if again.Record.DispatchID != first.Record.DispatchID || again.Record.Request.Timeout != "5m" {
			t.Errorf("repeat: %+v", again.Record)
		}
		if q := h.queued("cut-1"); len(q) != 1 {
			t.Errorf("queued %d times", len(q))
		}
	})
}
