package genclient_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/answerers/inbox"
	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/schema/openapi/genclient"
	"github.com/agora-dispatch/agora/services/dispatcher"
	"github.com/agora-dispatch/agora/services/router"
	"github.com/agora-dispatch/agora/services/worker"
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

func logger() *slog.Logger {
	if testing.Verbose() && os.Getenv("AGORA_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// stack is a whole Agora as agora dev serves it: a real in-process
// JetStream server, the dispatcher, a worker, the router and the inbox (dev
// token, answer links on), with the dispatcher's /v1 API and the inbox
// under /inbox on one HTTP listener. api and inbox are generated clients
// for it whose every exchange the contract checks.
type stack struct {
	t        *testing.T
	srv      *natstest.Server
	web      *httptest.Server
	contract *contract
	api      *genclient.ClientWithResponses // the dispatcher's token
	inbox    *genclient.ClientWithResponses // the inbox's bearer token
	devToken string
}

func start(t *testing.T) *stack {
	t.Helper()
	srv := natstest.StartProvisioned(t, provision.Config{})
	// Connections first: cleanups run last-in first-out, so the services
	// stop before their connections close.
	dconn, wconn, rconn, iconn, cconn := srv.Conn(t), srv.Conn(t), srv.Conn(t), srv.Conn(t), srv.Conn(t)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	run := func(name string, f func(context.Context) error) {
		wg.Go(func() {
			if err := f(ctx); err != nil {
				t.Errorf("%s: %v", name, err)
			}
		})
	}
	d, err := dispatcher.New(dispatcher.Config{ShutdownTimeout: 5 * time.Second, APITokens: []string{apiToken}}, dispatcher.Deps{Conn: dconn, Logger: logger()})
	if err != nil {
		t.Fatal(err)
	}
	run("dispatcher", d.Run)
	w, err := worker.New(worker.Config{WorkspaceRoot: t.TempDir(), Concurrency: 4, PullExpiry: 500 * time.Millisecond, KillGrace: 500 * time.Millisecond, ShutdownTimeout: 5 * time.Second},
		worker.Deps{Conn: wconn, Logger: logger()})
	if err != nil {
		t.Fatal(err)
	}
	run("worker", w.Run)
	r, err := router.New(router.Config{Tick: 100 * time.Millisecond, RecordWait: 500 * time.Millisecond, ShutdownTimeout: 5 * time.Second},
		router.Deps{Conn: rconn, Logger: logger()})
	if err != nil {
		t.Fatal(err)
	}
	run("router", r.Run)
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	in, err := inbox.New(inbox.Config{DevToken: true, LinkKey: base64.StdEncoding.EncodeToString(key)}, inbox.Deps{Conn: iconn, Logger: logger()})
	if err != nil {
		t.Fatal(err)
	}
	run("inbox", in.Run)
	for _, ready := range []<-chan struct{}{d.Ready(), r.Ready(), in.Ready()} {
		select {
		case <-ready:
		case <-time.After(waitFor):
			t.Fatal("services not ready")
		}
	}
	mux := http.NewServeMux()
	mux.Handle(inbox.Prefix+"/", in.Handler())
	mux.Handle("/", d.Handler())
	web := httptest.NewServer(mux)
	// Close the web server before the services stop (cleanups run in reverse).
	t.Cleanup(web.Close)

	c, err := client.New(cconn)
	if err != nil {
		t.Fatal(err)
	}
	for name, script := range map[string]string{"asker": asker, "sleeper": sleeper} {
		def := subagent.Definition{Name: name, Runtime: subagent.RuntimeExec, Command: []string{"sh", "-c", script}, Timeout: "1m", EnvAllow: []string{"ASK_ROUNDS"}}
		if _, err := c.ApplySubagent(t.Context(), def); err != nil {
			t.Fatal(err)
		}
	}

	k := newContract(t, web.URL)
	s := &stack{t: t, srv: srv, web: web, contract: k, devToken: in.DevToken()}
	s.api = s.client(apiToken)
	s.inbox = s.client(in.DevToken())
	return s
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

// eventually polls cond until it holds, failing the test after waitFor.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(waitFor)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-deadline:
			t.Fatalf("gave up waiting for %s", what)
		case <-tick.C:
		}
	}
}
