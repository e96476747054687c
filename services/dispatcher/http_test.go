package dispatcher_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/internal/config"
	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/services/dispatcher"
)

func TestHTTPAuth(t *testing.T) {
	h := newHarness(t, dispatcher.Config{APITokens: []string{"s3cret-token", " other-token "}})
	body := `{"subagent":"planner"}`
	cases := []struct {
		name, auth string
		want       int
	}{
		{"no token", "", http.StatusUnauthorized},
		{"wrong token", "Bearer nope", http.StatusUnauthorized},
		{"a prefix of a token", "Bearer s3cret", http.StatusUnauthorized},
		{"not bearer", "Basic czNjcmV0LXRva2Vu", http.StatusUnauthorized},
		{"first token", "Bearer s3cret-token", http.StatusCreated},
		{"second token, trimmed, any case scheme", "bearer other-token", http.StatusCreated},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var hdr []string
			if tc.auth != "" {
				hdr = []string{"Authorization", tc.auth}
			}
			resp, data := h.do(http.MethodPost, "/v1/dispatches", body, "", hdr...)
			if resp.StatusCode != tc.want {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.want, data)
			}
			if tc.want == http.StatusUnauthorized {
				var p client.Problem
				if json.Unmarshal(data, &p) != nil || p.Type != client.ProblemUnauthorized || resp.Header.Get("WWW-Authenticate") == "" {
					t.Errorf("401 body or header: %s %v", data, resp.Header)
				}
			}
		})
	}
	for _, path := range []string{"/v1/dispatches/x", "/v1/threads/x", "/v1/events"} {
		if resp, _ := h.do(http.MethodGet, path, "", ""); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET %s without a token: %d", path, resp.StatusCode)
		}
	}
	for _, path := range []string{"/healthz", "/metrics"} {
		if resp, _ := h.do(http.MethodGet, path, "", ""); resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s is open: %d", path, resp.StatusCode)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	cases := []struct {
		addr    string
		tokens  []string
		wantErr bool
	}{
		{"127.0.0.1:8080", nil, false},
		{"localhost:8080", nil, false},
		{"[::1]:8080", nil, false},
		{"0.0.0.0:8080", nil, true},
		{":8080", nil, true},
		{"[::]:8080", nil, true},
		{"192.0.2.10:8080", nil, true},
		{"agora.example:8080", nil, true},
		{"0.0.0.0:8080", []string{" "}, true},
		{"0.0.0.0:8080", []string{"tok"}, false},
		{"", nil, false},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%s %v", tc.addr, tc.tokens), func(t *testing.T) {
			err := dispatcher.Config{HTTPAddr: tc.addr, APITokens: tc.tokens}.Validate()
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if err != nil && (!strings.Contains(err.Error(), "AGORA_HTTP_ADDR") || !strings.Contains(err.Error(), "AGORA_API_TOKENS")) {
				t.Errorf("the error does not name the variables: %v", err)
			}
		})
	}
	if err := (dispatcher.Config{HTTPAddr: "nonsense"}).Validate(); err == nil || !strings.Contains(err.Error(), "AGORA_HTTP_ADDR") {
		t.Errorf("a malformed address: %v", err)
	}
	_, err := dispatcher.New(dispatcher.Config{HTTPAddr: "0.0.0.0:8080"}, dispatcher.Deps{})
	if err == nil || !strings.Contains(err.Error(), "AGORA_API_TOKENS") {
		t.Errorf("New starts on 0.0.0.0 without tokens: %v", err)
	}
}

func TestConfigLoad(t *testing.T) {
	t.Setenv("AGORA_HTTP_ADDR", "127.0.0.1:0")
	t.Setenv("AGORA_API_TOKENS", "a,b")
	t.Setenv("AGORA_DISPATCHER_CONCURRENCY", "lots")
	t.Setenv("AGORA_SSE_KEEPALIVE", "often")
	var cfg dispatcher.Config
	err := config.Load(&cfg)
	if err == nil || !strings.Contains(err.Error(), "AGORA_DISPATCHER_CONCURRENCY") || !strings.Contains(err.Error(), "AGORA_SSE_KEEPALIVE") {
		t.Fatalf("every bad variable is named: %v", err)
	}
	t.Setenv("AGORA_DISPATCHER_CONCURRENCY", "8")
	t.Setenv("AGORA_SSE_KEEPALIVE", "1s")
	cfg = dispatcher.Config{}
	if err := config.Load(&cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Concurrency != 8 || len(cfg.APITokens) != 2 || cfg.NATSURL == "" || cfg.ShutdownTimeout != 30*time.Second {
		t.Errorf("loaded: %+v", cfg)
	}
	t.Setenv("AGORA_HTTP_ADDR", "0.0.0.0:8080")
	t.Setenv("AGORA_API_TOKENS", "")
	cfg = dispatcher.Config{}
	if err := config.Load(&cfg); err == nil || !strings.Contains(err.Error(), "AGORA_HTTP_ADDR") {
		t.Errorf("an open address without tokens loads: %v", err)
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

func TestRunServesHTTPAndStopsGracefully(t *testing.T) {
	srv := natstest.StartProvisioned(t, provision.Config{})
	addr := freeAddr(t)
	svc, err := dispatcher.New(dispatcher.Config{HTTPAddr: addr, ShutdownTimeout: 5 * time.Second}, dispatcher.Deps{Conn: srv.Conn(t), Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	<-svc.Ready()
	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	var health map[string]string
	_ = json.NewDecoder(resp.Body).Decode(&health)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || health["status"] != "ok" || health["jetstream"] != "ok" {
		t.Errorf("healthz: %d %v", resp.StatusCode, health)
	}
	if err := svc.Run(ctx); err == nil {
		t.Error("a second Run succeeded")
	}
	// An open event stream does not hold the shutdown up.
	events, err := http.Get("http://" + addr + "/v1/events")
	if err != nil {
		t.Fatal(err)
	}
	defer events.Body.Close()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(waitFor):
		t.Fatal("Run did not return")
	}
	if _, err := http.Get("http://" + addr + "/healthz"); err == nil {
		t.Error("the listener is still open")
	}
}

func TestRunWithoutProvisioning(t *testing.T) {
	srv := natstest.Start(t)
	svc, err := dispatcher.New(dispatcher.Config{}, dispatcher.Deps{Conn: srv.Conn(t), Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	err = svc.Run(t.Context())
	if err == nil || !strings.Contains(err.Error(), "provision") {
		t.Errorf("Run on an unprovisioned server: %v", err)
	}
}

func TestHealthzAndMetrics(t *testing.T) {
	h := newHarness(t, dispatcher.Config{})
	h.dispatchMicro(lifecycle.Request{Subagent: "planner"})
	h.do(http.MethodPost, "/v1/dispatches", `{"subagent":"ghost"}`, "")
	d := h.dispatchMicro(lifecycle.Request{Subagent: "planner"})
	if _, err := h.cl.Cancel(t.Context(), d.DispatchID); err != nil {
		t.Fatal(err)
	}
	// The projection may record the cancel a moment after the answer.
	var data []byte
	for _, want := range []string{
		`agora_dispatcher_requests_total{door="micro",result="accepted"} 2`,
		`agora_dispatcher_requests_total{door="http",result="rejected"} 1`,
		`agora_dispatcher_dispatches_total{kind="cancelled",reason=""} 1`,
	} {
		h.eventually("metric "+want, func() bool {
			_, data = h.do(http.MethodGet, "/metrics", "", "")
			return strings.Contains(string(data), want)
		})
	}
	resp, data := h.do(http.MethodGet, "/healthz", "", "")
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(data), `"ok"`) {
		t.Errorf("healthz: %d %s", resp.StatusCode, data)
	}
	h.srv.Stop()
	resp, _ = h.do(http.MethodGet, "/healthz", "", "")
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("healthz with NATS down: %d", resp.StatusCode)
	}
	h.srv.Restart(t)
}

// Every dataschema an event names is served, by its name, as are the
// AsyncAPI document; other names are 404.
func TestSchemasAreServed(t *testing.T) {
	h := newHarness(t, dispatcher.Config{})
	for _, name := range []string{"dispatch.finished.json", "progress.reported.json", "asyncapi.yaml"} {
		resp, body := h.do(http.MethodGet, "/v1/schemas/"+name, "", "")
		if resp.StatusCode != http.StatusOK || (strings.HasSuffix(name, ".json") && !strings.Contains(string(body), `"$id": "`+lifecycle.SchemaBase+name+`"`)) {
			t.Errorf("%s: %d %.80s", name, resp.StatusCode, body)
		}
	}
	for _, bad := range []string{"nope.json", "..%2Fschema.go"} {
		if resp, _ := h.do(http.MethodGet, "/v1/schemas/"+bad, "", ""); resp.StatusCode != http.StatusNotFound {
			t.Errorf("%s: %d", bad, resp.StatusCode)
		}
	}
}
