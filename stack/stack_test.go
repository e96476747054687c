package stack_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agora-dispatch/agora/answerers/inbox"
	"github.com/agora-dispatch/agora/internal/natsserver"
	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/services/a2aserver"
	"github.com/agora-dispatch/agora/services/auditlog"
	"github.com/agora-dispatch/agora/services/dispatcher"
	"github.com/agora-dispatch/agora/services/router"
	"github.com/agora-dispatch/agora/services/worker"
	"github.com/agora-dispatch/agora/stack"
)

// done is a runtime that finishes at once, in process.
type done struct{}

func (done) Run(context.Context, worker.Invocation) worker.Result { return worker.Result{} }

var quick = subagent.Definition{Name: "quick", Runtime: subagent.RuntimeExec, Command: []string{"in-process"}}

// A whole Agora on an embedded server: a dispatch runs to its end, one
// handler serves every service and its health, and Close leaves nothing
// listening.
func TestStartRunsAWholeAgora(t *testing.T) {
	st, err := stack.Start(t.Context(), stack.Options{
		Server:     natsserver.Config{Port: -1},
		Provision:  &provision.Config{},
		Subagents:  []subagent.Definition{quick},
		Dispatcher: &dispatcher.Config{},
		Router:     &router.Config{},
		Audit:      &auditlog.Config{},
		Workers:    []worker.Config{{Concurrency: 2, WorkspaceRoot: t.TempDir(), PullExpiry: 500 * time.Millisecond}},
		Inbox:      &inbox.Config{DevToken: true},
		InProcess:  map[string]worker.InProcess{subagent.RuntimeExec: done{}},
	})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			_ = st.Close()
		}
	})
	if st.Server() == nil || st.DevToken() == "" {
		t.Fatalf("Server() = %v, DevToken() = %q: want the embedded server and the inbox's token", st.Server(), st.DevToken())
	}
	d, err := st.Client().Dispatch(t.Context(), lifecycle.Request{Subagent: quick.Name, Input: json.RawMessage(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, "the dispatch finished", func() bool {
		rec, err := st.Client().Status(t.Context(), d.DispatchID)
		return err == nil && rec.Status == lifecycle.KindFinished
	})

	web := httptest.NewServer(st.Handler())
	defer web.Close()
	var h struct {
		Status   string                    `json:"status"`
		Services map[string]map[string]any `json:"services"`
	}
	getJSON(t, web.URL+"/healthz", http.StatusOK, &h)
	for _, name := range []string{"dispatcher", "router", "worker", "inbox", "auditlog"} {
		if h.Services[name]["status"] != "ok" {
			t.Errorf("/healthz services[%s] = %v", name, h.Services[name])
		}
	}
	getJSON(t, web.URL+"/v1/dispatches/"+d.DispatchID, http.StatusOK, nil)
	getJSON(t, web.URL+inbox.Prefix+"/healthz", http.StatusOK, nil)

	url := st.URL()
	if err := st.Close(); err != nil {
		t.Errorf("Close: %v, want the services to stop cleanly", err)
	}
	closed = true
	if err := st.Close(); err != nil {
		t.Errorf("a second Close: %v", err)
	}
	if nc, err := nats.Connect(url, nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Fatalf("the server still answers at %s after Close", url)
	}
}

// The A2A door is served beside /v1 behind the same tokens: the agent
// card is public and lists the sub-agents, /a2a wants the token /v1
// wants.
func TestStartServesA2A(t *testing.T) {
	st, err := stack.Start(t.Context(), stack.Options{
		Server:     natsserver.Config{Port: -1},
		Provision:  &provision.Config{},
		Subagents:  []subagent.Definition{quick},
		Dispatcher: &dispatcher.Config{APITokens: []string{"secret"}},
		A2A:        &a2aserver.Config{},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	web := httptest.NewServer(st.Handler())
	defer web.Close()
	var card struct {
		Skills          []struct{ ID string }      `json:"skills"`
		SecuritySchemes map[string]json.RawMessage `json:"securitySchemes"`
	}
	getJSON(t, web.URL+a2aserver.CardPath, http.StatusOK, &card)
	if len(card.Skills) != 1 || card.Skills[0].ID != quick.Name || card.SecuritySchemes["bearerAuth"] == nil {
		t.Errorf("agent card %+v, want skill %s and the bearer scheme", card, quick.Name)
	}
	rpc := `{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":"x"}}`
	for _, tc := range []struct {
		path, token string
		code        int
	}{
		{"/a2a", "", http.StatusUnauthorized},
		{"/a2a", "wrong", http.StatusUnauthorized},
		{"/v1/dispatches", "", http.StatusUnauthorized},
		{"/a2a", "secret", http.StatusOK},
	} {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, web.URL+tc.path, strings.NewReader(rpc))
		req.Header.Set("Content-Type", "application/json")
		if tc.token != "" {
			req.Header.Set("Authorization", "Bearer "+tc.token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.code {
			t.Errorf("POST %s with token %q: %s, want %d", tc.path, tc.token, resp.Status, tc.code)
		}
	}
}

// Joining a running server: the stack runs its services there and leaves
// the server running when it closes.
func TestStartJoinsAServer(t *testing.T) {
	srv := natstest.StartProvisioned(t, provision.Config{})
	routes := filepath.Join(t.TempDir(), "routes.yaml")
	if err := os.WriteFile(routes, []byte("routes:\n  - name: default\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	st, err := stack.Start(t.Context(), stack.Options{URL: srv.URL, Router: &router.Config{RoutesFile: routes}})
	if err != nil {
		t.Fatal(err)
	}
	if st.Server() != nil || st.URL() != srv.URL {
		t.Errorf("Server() = %v, URL() = %q: want no server of its own, on %s", st.Server(), st.URL(), srv.URL)
	}
	if err := st.Reload(); err != nil {
		t.Errorf("Reload of a valid routing file: %v", err)
	}
	if err := os.WriteFile(routes, []byte("routes: {{{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := st.Reload(); err == nil {
		t.Error("Reload of an invalid routing file: no error")
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	nc := srv.Conn(t)
	if _, err := nc.RTT(); err != nil {
		t.Errorf("the joined server after Close: %v", err)
	}
}

// What Go runs fails Wait and Close with its name; a cancelled Wait
// returns nil.
func TestGoReportsAnError(t *testing.T) {
	st, err := stack.Start(t.Context(), stack.Options{Server: natsserver.Config{Port: -1}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := st.Wait(ctx); err != nil {
		t.Errorf("Wait with a cancelled context: %v", err)
	}
	boom := errors.New("boom")
	st.Go("answerer", func(context.Context) error { return boom })
	if err := st.Wait(t.Context()); !errors.Is(err, boom) || !strings.HasPrefix(err.Error(), "answerer: ") {
		t.Errorf("Wait = %v, want answerer: boom", err)
	}
	if err := st.Close(); !errors.Is(err, boom) {
		t.Errorf("Close = %v, want boom", err)
	}
}

func TestStartRefuses(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	for _, tc := range []struct {
		name string
		opts stack.Options
		is   error  // want errors.Is(err, is) when set
		has  string // want err to contain it
	}{
		{"a port in use", stack.Options{Server: natsserver.Config{Port: port}}, stack.ErrServer, ""},
		{"an invalid sub-agent", stack.Options{Server: natsserver.Config{Port: -1}, Provision: &provision.Config{},
			Subagents: []subagent.Definition{{Name: "bad one"}}}, nil, "name:"},
		{"a service without its streams", stack.Options{Server: natsserver.Config{Port: -1}, Router: &router.Config{}}, nil, "provision"},
		{"a service that never gets ready", stack.Options{Server: natsserver.Config{Port: -1}, Provision: &provision.Config{},
			Dispatcher: &dispatcher.Config{}, ReadyTimeout: time.Nanosecond}, nil, "not ready within"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, err := stack.Start(t.Context(), tc.opts)
			if err == nil {
				_ = st.Close()
				t.Fatal("Start succeeded")
			}
			if tc.is != nil && !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.has) {
				t.Errorf("Start: %v, want %v containing %q", err, tc.is, tc.has)
			}
		})
	}
}

// getJSON gets url, wants the status code and decodes the body into v
// when v is set.
func getJSON(t *testing.T, url string, code int, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != code {
		t.Fatalf("GET %s: %s, want %d", url, resp.Status, code)
	}
	if v != nil {
		if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
	}
}
