package genclient_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/answerers/inbox"
	"github.com/agora-dispatch/agora/internal/natsserver"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/schema/openapi/genclient"
	"github.com/agora-dispatch/agora/services/dispatcher"
	"github.com/agora-dispatch/agora/services/router"
	"github.com/agora-dispatch/agora/services/worker"
	agorastack "github.com/agora-dispatch/agora/stack"
)

// waitFor bounds every wait: generous, the machine is shared.
const waitFor = 60 * time.Second

// apiToken is the dispatcher's bearer token (AGORA_API_TOKENS).
const apiToken = "genclient-test-token"

// asker asks its input as its question (the input is a valid sentinel) in
// every round below $ASK_ROUNDS (default 1), then finishes with its input,
// which carries the answer, as its output, and leaves that input as the
// artifact notes/answer.json.
const asker = `if [ "$AGORA_ROUND" -lt "${ASK_ROUNDS:-1}" ]; then
  cp "$AGORA_INPUT_FILE" "$AGORA_NEEDS_INPUT_FILE"
else
  mkdir -p "$AGORA_ARTIFACTS_DIR/notes"
  cp "$AGORA_INPUT_FILE" "$AGORA_ARTIFACTS_DIR/notes/answer.json"
  cp "$AGORA_INPUT_FILE" "$AGORA_OUTPUT_FILE"
fi`

// sleeper runs until it is cancelled (or its timeout).
const sleeper = `exec sleep 300`

// slowOnSuggestion asks its input in round 0; in round 1 it runs on for a
// minute when an accepted suggestion answered it (a reversal has time to
// come), and finishes at once with a person's answer.
const slowOnSuggestion = `if [ "$AGORA_ROUND" -lt 1 ]; then
  cp "$AGORA_INPUT_FILE" "$AGORA_NEEDS_INPUT_FILE"
elif grep -q '"answered_by":"suggested:' "$AGORA_INPUT_FILE"; then
  sleep 60; cp "$AGORA_INPUT_FILE" "$AGORA_OUTPUT_FILE"
else
  cp "$AGORA_INPUT_FILE" "$AGORA_OUTPUT_FILE"
fi`

// routes sends the bot-* sub-agents' questions to route bots, whose
// answerer suggests and whose auto_accept takes a suggestion at 0.9 as
// the answer; the rest goes to human.
const routes = `routes:
  - name: bots
    match: {subagent: "bot-*"}
    answerer: bot
    auto_accept: 0.9
    fallback: human
  - name: human
    answerer: human
`

func logger() *slog.Logger {
	if testing.Verbose() && os.Getenv("AGORA_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// stack is a whole Agora as agora dev serves it (package stack): a real
// in-process JetStream server, the dispatcher, a worker, the router and the
// inbox (dev token, answer links on), with the dispatcher's /v1 API and the
// inbox under /inbox on one HTTP listener. api and inbox are generated
// clients for it whose every exchange the contract checks.
type stack struct {
	t        *testing.T
	agora    *agorastack.Stack
	web      *httptest.Server
	contract *contract
	api      *genclient.ClientWithResponses // the dispatcher's token
	inbox    *genclient.ClientWithResponses // the inbox's bearer token
	devToken string
}

func start(t *testing.T) *stack {
	t.Helper()
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	var defs []subagent.Definition
	for name, script := range map[string]string{"asker": asker, "sleeper": sleeper, "bot-quick": asker, "bot-slow": slowOnSuggestion} {
		defs = append(defs, subagent.Definition{Name: name, Runtime: subagent.RuntimeExec, Command: []string{"sh", "-c", script}, Timeout: "1m", EnvAllow: []string{"ASK_ROUNDS"}})
	}
	agora, err := agorastack.Start(t.Context(), agorastack.Options{
		Server:     natsserver.Config{Port: -1, StoreDir: t.TempDir()},
		Provision:  &provision.Config{},
		Subagents:  defs,
		Dispatcher: &dispatcher.Config{ShutdownTimeout: 5 * time.Second, APITokens: []string{apiToken}, PrincipalsFile: principalsFile(t)},
		Workers: []worker.Config{{WorkspaceRoot: t.TempDir(), Concurrency: 4, PullExpiry: 500 * time.Millisecond,
			KillGrace: 500 * time.Millisecond, ShutdownTimeout: 5 * time.Second}},
		Router:       &router.Config{RoutesFile: routesFile(t), Tick: 100 * time.Millisecond, RecordWait: 500 * time.Millisecond, ShutdownTimeout: 5 * time.Second},
		Inbox:        &inbox.Config{DevToken: true, LinkKey: base64.StdEncoding.EncodeToString(key)},
		Logger:       logger(),
		ReadyTimeout: waitFor,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := agora.Close(); err != nil {
			t.Errorf("stack: %v", err)
		}
	})
	web := httptest.NewServer(agora.Handler())
	// Close the web server before the services stop (cleanups run in reverse).
	t.Cleanup(web.Close)

	s := &stack{t: t, agora: agora, web: web, contract: newContract(t, web.URL), devToken: agora.DevToken()}
	s.api = s.client(apiToken)
	s.inbox = s.client(s.devToken)
	return s
}

// otherTeamToken proves "other-team", a principal of the principals file
// that sees only its own threads and dispatches only sleeper.
const otherTeamToken = "genclient-other-team"

func principalsFile(t *testing.T) string {
	t.Helper()
	sum := sha256.Sum256([]byte(otherTeamToken))
	f := filepath.Join(t.TempDir(), "principals.yaml")
	body := "principals:\n  - name: other-team\n    token_sha256: " + hex.EncodeToString(sum[:]) + "\n    dispatch: [sleeper]\n"
	if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

func routesFile(t *testing.T) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "routes.yaml")
	if err := os.WriteFile(f, []byte(routes), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// client is a generated client for the stack whose requests carry token
// (none when empty) and go through the contract.
func (s *stack) client(token string) *genclient.ClientWithResponses {
	s.t.Helper()
	opts := []genclient.ClientOption{genclient.WithHTTPClient(&http.Client{Transport: s.contract})}
	if token != "" {
		opts = append(opts, genclient.WithRequestEditorFn(func(_ context.Context, req *http.Request) error {
			req.Header.Set("Authorization", "Bearer "+token)
			return nil
		}))
	}
	c, err := genclient.NewClientWithResponses(s.web.URL, opts...)
	if err != nil {
		s.t.Fatal(err)
	}
	return c
}
