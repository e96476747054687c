package dispatcher_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/services/dispatcher"
)

func sha(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// principalsFile writes a principals file: team-a and team-b see their
// own threads, team-b dispatches only planner, audit sees all, ops is an
// admin.
func principalsFile(t *testing.T) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "principals.yaml")
	body := fmt.Sprintf(`principals:
  - name: team-a
    token_sha256: %s
  - name: team-b
    token_sha256: %s
    dispatch: [planner]
  - name: audit
    token_sha256: %s
    see: all
    dispatch: []
  - name: ops
    token_sha256: %s
    admin: true
`, sha("token-a"), sha("token-b"), sha("token-audit"), sha("token-ops"))
	if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// A second team holding its own token cannot read, follow or cancel
// another team's thread, nor learn that a dispatch id is taken by it:
// every door of /v1 answers it as for an id that does not exist. The
// owner, a principal that sees all and an admin (and AGORA_API_TOKENS,
// the operators' tokens) keep their rights.
func TestPrincipalsOwnTheirThreads(t *testing.T) {
	h := newHarness(t, dispatcher.Config{PrincipalsFile: principalsFile(t), APITokens: []string{"operator-token"}})
	h.putSubagent(subagent.Definition{Name: "other", Runtime: subagent.RuntimeExec, Command: []string{"true"}, Timeout: "5m"})

	resp, data := h.do(http.MethodPost, "/v1/dispatches", `{"subagent":"planner","dispatch_id":"a-root"}`, "token-a")
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("team-a dispatch: %d %s", resp.StatusCode, data)
	}
	var rec client.Record
	if err := json.Unmarshal(data, &rec); err != nil || rec.Principal != "team-a" {
		t.Fatalf("the record names its principal: %s", data)
	}
	thread := rec.ThreadID

	paths := []struct{ method, path string }{
		{http.MethodGet, "/v1/dispatches/a-root"},
		{http.MethodGet, "/v1/threads/" + thread},
		{http.MethodGet, "/v1/dispatches/a-root/artifacts"},
		{http.MethodGet, "/v1/dispatches/a-root/artifacts/out.txt"},
		{http.MethodPost, "/v1/dispatches/a-root/cancel"},
		{http.MethodPost, "/v1/threads/" + thread + "/cancel"},
	}
	// team-b gets the 404 of an unknown id, the same text as for one.
	_, unknown := h.do(http.MethodGet, "/v1/dispatches/no-such", "", "token-b")
	for _, p := range paths {
		resp, data := h.do(p.method, p.path, "", "token-b")
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("team-b %s %s: %d %s", p.method, p.path, resp.StatusCode, data)
		}
		if strings.Contains(string(data), "team-a") {
			t.Errorf("team-b %s %s names the owner: %s", p.method, p.path, data)
		}
	}
	if !strings.Contains(string(unknown), "no dispatch") {
		t.Errorf("unknown id: %s", unknown)
	}
	// Its events: not the feed of every thread, not team-a's thread.
	for _, q := range []string{"", "?thread=" + thread, "?dispatch=a-root", "?thread=not-yet-dispatched"} {
		resp, data := h.do(http.MethodGet, "/v1/events"+q, "", "token-b")
		want := http.StatusNotFound
		if q == "" {
			want = http.StatusForbidden
		}
		if resp.StatusCode != want {
			t.Errorf("team-b GET /v1/events%s: %d %s, want %d", q, resp.StatusCode, data, want)
		}
	}
	// The same dispatch_id again: a conflict that says nothing of it.
	resp, data = h.do(http.MethodPost, "/v1/dispatches", `{"subagent":"planner","dispatch_id":"a-root"}`, "token-b")
	if resp.StatusCode != http.StatusConflict || strings.Contains(string(data), "team-a") || strings.Contains(string(data), thread+`"`) {
		t.Errorf("team-b reusing team-a's dispatch_id: %d %s", resp.StatusCode, data)
	}
	// A sub-agent outside its dispatch scope.
	resp, data = h.do(http.MethodPost, "/v1/dispatches", `{"subagent":"other"}`, "token-b")
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(data), "AGORA_PRINCIPALS_FILE") {
		t.Errorf("team-b dispatching other: %d %s", resp.StatusCode, data)
	}
	// The stream door never saw team-b's refused requests.
	if n := len(workMessages(t, h)); n != 1 {
		t.Errorf("%d work messages, want team-a's one", n)
	}

	// audit sees everything and cancels nothing; it dispatches nothing.
	for _, p := range paths[:2] {
		if resp, data := h.do(p.method, p.path, "", "token-audit"); resp.StatusCode != http.StatusOK {
			t.Errorf("audit %s %s: %d %s", p.method, p.path, resp.StatusCode, data)
		}
	}
	if resp, data := h.do(http.MethodPost, "/v1/dispatches/a-root/cancel", "", "token-audit"); resp.StatusCode != http.StatusForbidden || !strings.Contains(string(data), "team-a") {
		t.Errorf("audit cancel: %d %s", resp.StatusCode, data)
	}
	if resp, data := h.do(http.MethodPost, "/v1/dispatches", `{"subagent":"planner"}`, "token-audit"); resp.StatusCode != http.StatusForbidden {
		t.Errorf("audit dispatch: %d %s", resp.StatusCode, data)
	}

	// The owner, an admin and an operator's token see it.
	for _, tok := range []string{"token-a", "token-ops", "operator-token"} {
		if resp, data := h.do(http.MethodGet, "/v1/threads/"+thread, "", tok); resp.StatusCode != http.StatusOK {
			t.Errorf("%s GET thread: %d %s", tok, resp.StatusCode, data)
		}
	}
	// team-a's own thread: its events and its cancel.
	ctx, cancel := context.WithCancel(t.Context())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, h.http.URL+"/v1/events?thread="+thread, nil)
	req.Header.Set("Authorization", "Bearer token-a")
	ev, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if line, _ := bufio.NewReader(ev.Body).ReadString('\n'); ev.StatusCode != http.StatusOK || line != ": connected\n" {
		t.Errorf("team-a follows its thread's events: %d %q", ev.StatusCode, line)
	}
	cancel()
	ev.Body.Close()
	resp, data = h.do(http.MethodPost, "/v1/dispatches/a-root/cancel", "", "token-a")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("team-a cancels its own: %d %s", resp.StatusCode, data)
	}
}

// On its own NATS API subjects (agora.api.<verb>.<user>, client.WithCaller)
// a NATS user is the principal of its name: the principals file's scope
// when it names one (with no token: reached only over NATS), the default
// scope otherwise. Only an admin names another principal.
func TestNATSCallerIsItsPrincipal(t *testing.T) {
	f := principalsFile(t)
	extra := "  - name: agents\n    dispatch: [planner]\n"
	body, _ := os.ReadFile(f)
	if err := os.WriteFile(f, append(body, extra...), 0o600); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, dispatcher.Config{PrincipalsFile: f})
	h.putSubagent(subagent.Definition{Name: "other", Runtime: subagent.RuntimeExec, Command: []string{"true"}, Timeout: "5m"})
	as := func(user string) *client.Client {
		c, err := client.New(h.nc, client.WithCaller(user))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	ctx := t.Context()
	if resp, data := h.do(http.MethodPost, "/v1/dispatches", `{"subagent":"planner","dispatch_id":"a-root"}`, "token-a"); resp.StatusCode != http.StatusCreated {
		t.Fatalf("team-a dispatch: %d %s", resp.StatusCode, data)
	}
	forbidden := func(what string, err error) {
		t.Helper()
		var p *client.Problem
		if !errors.As(err, &p) || p.Status != http.StatusForbidden {
			t.Errorf("%s: %v, want 403", what, err)
		}
	}

	agents := as("agents")
	forbidden("agents dispatching other (outside its scope)", func() error {
		_, err := agents.Dispatch(ctx, lifecycle.Request{Subagent: "other"})
		return err
	}())
	d, err := agents.Dispatch(ctx, lifecycle.Request{Subagent: "planner"})
	if err != nil || d.Record.Principal != "agents" {
		t.Fatalf("agents dispatching planner: %+v %v", d, err)
	}
	if _, err := agents.Status(ctx, "a-root"); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("agents reading team-a's dispatch: %v, want not found", err)
	}
	if _, err := agents.Thread(ctx, d.ThreadID); err != nil {
		t.Errorf("agents reading its own thread: %v", err)
	}
	forbidden("agents dispatching on behalf of team-a", func() error {
		_, err := agents.Dispatch(ctx, lifecycle.Request{Subagent: "planner"}, client.OnBehalfOf("team-a"))
		return err
	}())
	// No token proves agents over HTTP.
	if resp, _ := h.do(http.MethodGet, "/v1/threads/"+d.ThreadID, "", "agents"); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("HTTP with the name agents as token: %d", resp.StatusCode)
	}

	// A user the file does not name: the default scope.
	stranger := as("stranger")
	if d, err := stranger.Dispatch(ctx, lifecycle.Request{Subagent: "other"}); err != nil || d.Record.Principal != "stranger" {
		t.Errorf("stranger dispatching other: %+v %v", d, err)
	}
	if _, err := stranger.Cancel(ctx, "a-root"); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("stranger cancelling team-a's dispatch: %v, want not found", err)
	}
	// An admin sees all and may say whose thread it starts.
	ops := as("ops")
	if _, err := ops.Status(ctx, "a-root"); err != nil {
		t.Errorf("ops reading team-a's dispatch: %v", err)
	}
	if d, err := ops.Dispatch(ctx, lifecycle.Request{Subagent: "planner"}, client.OnBehalfOf("team-a")); err != nil || d.Record.Principal != "team-a" {
		t.Errorf("ops dispatching for team-a: %+v %v", d, err)
	}
	// The trusted subject is unchanged: no caller, no check.
	if _, err := h.cl.Status(ctx, "a-root"); err != nil {
		t.Errorf("a trusted client reading team-a's dispatch: %v", err)
	}
	if _, err := client.New(h.nc, client.WithCaller("bad.name")); err == nil {
		t.Error("WithCaller took a name that is no subject token")
	}
}

// A principals file with mistakes is refused at start, naming each.
func TestPrincipalsFileErrors(t *testing.T) {
	dir := t.TempDir()
	cases := []struct{ name, body, want string }{
		{"unknown field", "principals:\n  - name: a\n    token: x\n", "field token not found"},
		{"bad hash", "principals:\n  - name: a\n    token_sha256: abc\n", "64 hex digits"},
		{"bad name", "principals:\n  - name: 'a b'\n    token_sha256: " + sha("x") + "\n", `name "a b"`},
		{"reserved", "principals:\n  - name: local\n    token_sha256: " + sha("x") + "\n", "reserved"},
		{"twice", "principals:\n  - name: a\n    token_sha256: " + sha("x") + "\n  - name: a\n    token_sha256: " + sha("y") + "\n", "given twice"},
		{"same token", "principals:\n  - name: a\n    token_sha256: " + sha("x") + "\n  - name: b\n    token_sha256: " + sha("x") + "\n", "proves another"},
		{"see", "principals:\n  - name: a\n    token_sha256: " + sha("x") + "\n    see: mine\n", "see: \"mine\""},
		{"dispatch", "principals:\n  - name: a\n    token_sha256: " + sha("x") + "\n    dispatch: ['no way']\n", "not a sub-agent name"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")+".yaml")
			if err := os.WriteFile(f, []byte(tc.body), 0o600); err != nil {
				t.Fatal(err)
			}
			err := dispatcher.Config{PrincipalsFile: f}.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "AGORA_PRINCIPALS_FILE") {
				t.Errorf("Validate = %v, want it to name AGORA_PRINCIPALS_FILE and %q", err, tc.want)
			}
		})
	}
	if err := (dispatcher.Config{PrincipalsFile: filepath.Join(dir, "missing.yaml")}).Validate(); err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Errorf("a missing file: %v", err)
	}
	// A file alone is authentication enough for a public address.
	if err := (dispatcher.Config{HTTPAddr: "0.0.0.0:8080", PrincipalsFile: principalsFile(t)}).Validate(); err != nil {
		t.Errorf("public address with a principals file: %v", err)
	}
}
