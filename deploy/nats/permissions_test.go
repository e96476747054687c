// Package nats_test proves the subject permissions of deploy/nats: it starts
// an in-process nats-server from agora.conf itself (only the port and the
// store directory are overridden), provisions as admin, and connects each
// party as its own user.
package nats_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/agora-dispatch/agora/answerers/agent"
	"github.com/agora-dispatch/agora/answerers/inbox"
	slackanswerer "github.com/agora-dispatch/agora/answerers/slack"
	"github.com/agora-dispatch/agora/answerers/webhook"
	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/answerer"
	"github.com/agora-dispatch/agora/pkg/audit"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/seal"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/services/auditlog"
	"github.com/agora-dispatch/agora/services/dispatcher"
	"github.com/agora-dispatch/agora/services/mcpserver"
	"github.com/agora-dispatch/agora/services/router"
	"github.com/agora-dispatch/agora/services/worker"
)

// password is the test value of user's NATS_PASS_* variable
// (natstest.DeployUsers), which agora.conf reads from the environment.
func password(user string) string { return "pw-" + user }

// env is a server started from agora.conf, provisioned by admin.
type env struct {
	t   *testing.T
	url string
	js  jetstream.JetStream // admin

	mu         sync.Mutex
	violations map[string][]string // user -> permission violations seen
}

func start(t *testing.T, file string) *env {
	t.Helper()
	for user, v := range natstest.DeployUsers {
		t.Setenv(v, password(user))
	}
	t.Setenv("NATS_SERVER_NAME", "test-1")
	opts, err := server.ProcessConfigFile(file)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	opts.Host, opts.Port, opts.HTTPPort = "127.0.0.1", -1, 0
	opts.StoreDir = t.TempDir()
	opts.Cluster = server.ClusterOpts{}
	opts.Routes = nil
	opts.NoLog, opts.NoSigs = true, true
	s := natstest.StartOptions(t, opts)
	e := &env{t: t, url: s.ClientURL(), violations: map[string][]string{}}
	js, err := jetstream.New(e.conn("admin"))
	if err != nil {
		t.Fatal(err)
	}
	e.js = js
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := provision.Ensure(ctx, js, provision.Config{}); err != nil {
		t.Fatalf("provision as admin: %v", err)
	}
	return e
}

// conn connects as user and records the permission violations the server
// reports to it.
func (e *env) conn(user string) *nats.Conn {
	e.t.Helper()
	// Each user's replies come on its own prefix, as the deploy sets
	// AGORA_NATS_INBOX_PREFIX (admin may subscribe to everything).
	nc, err := nats.Connect(e.url, nats.UserInfo(user, password(user)), nats.Name(user), nats.CustomInboxPrefix("_INBOX_"+user),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
				e.mu.Lock()
				e.violations[user] = append(e.violations[user], err.Error())
				e.mu.Unlock()
			}
		}))
	if err != nil {
		e.t.Fatalf("connect as %s: %v", user, err)
	}
	e.t.Cleanup(nc.Close)
	return nc
}

// sawViolation waits until user was told of a permission violation on
// subject.
func (e *env) sawViolation(user, subject string) bool {
	e.t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		e.mu.Lock()
		for _, v := range e.violations[user] {
			if strings.Contains(v, `"`+subject+`"`) {
				e.mu.Unlock()
				return true
			}
		}
		e.mu.Unlock()
		time.Sleep(10 * time.Millisecond)
	}
	return false
}

func (e *env) seen(user string) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.violations[user]...)
}

// stored counts the messages of stream on subject.
func (e *env) stored(stream, subject string) uint64 {
	e.t.Helper()
	s, err := e.js.Stream(e.t.Context(), stream)
	if err != nil {
		e.t.Fatal(err)
	}
	var opts []jetstream.StreamInfoOpt
	if subject != "" {
		opts = append(opts, jetstream.WithSubjectFilter(subject))
	}
	info, err := s.Info(e.t.Context(), opts...)
	if err != nil {
		e.t.Fatal(err)
	}
	if subject == "" {
		return info.State.Msgs
	}
	return info.State.Subjects[subject]
}

// consumers counts the consumers of stream; pulling, only those with a
// pull request waiting.
func (e *env) consumers(stream string, pulling bool) int {
	e.t.Helper()
	s, err := e.js.Stream(e.t.Context(), stream)
	if err != nil {
		e.t.Fatal(err)
	}
	var n int
	l := s.ListConsumers(e.t.Context())
	for ci := range l.Info() {
		if !pulling || ci.NumWaiting > 0 {
			n++
		}
	}
	if err := l.Err(); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// jsPublish publishes through JetStream as user and returns its error.
func (e *env) jsPublish(user, subject string) error {
	e.t.Helper()
	js, err := jetstream.New(e.conn(user))
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(e.t.Context(), time.Second)
	defer cancel()
	_, err = js.Publish(ctx, subject, []byte(`{}`))
	return err
}

// run runs a service or answerer until the test ends, reporting an error
// its Run returns, and waits until it is ready (ready nil: not waited
// for).
func (e *env) run(name string, run func(context.Context) error, ready <-chan struct{}) {
	e.t.Helper()
	testkit.Go(e.t, name, run)
	if ready != nil {
		testkit.WaitReady(e.t, 10*time.Second, name, ready)
	}
}

// define stores sub-agent definitions, each running its shell script.
func (e *env) define(scripts map[string]string) {
	e.t.Helper()
	kv, err := e.js.KeyValue(e.t.Context(), lifecycle.BucketSubagents)
	if err != nil {
		e.t.Fatal(err)
	}
	for name, script := range scripts {
		def, _ := json.Marshal(subagent.Definition{Name: name, Runtime: subagent.RuntimeExec, Command: []string{"sh", "-c", script}, Timeout: "1m"})
		if _, err := kv.Put(e.t.Context(), name, def); err != nil {
			e.t.Fatal(err)
		}
	}
}

// startDispatcher runs a dispatcher connected as the dispatcher user.
func (e *env) startDispatcher(log *slog.Logger) *dispatcher.Service {
	e.t.Helper()
	d, err := dispatcher.New(dispatcher.Config{ShutdownTimeout: 5 * time.Second}, dispatcher.Deps{Conn: e.conn("dispatcher"), Logger: log})
	if err != nil {
		e.t.Fatal(err)
	}
	e.run("dispatcher", d.Run, d.Ready())
	return d
}

func TestClusterConfigParses(t *testing.T) {
	t.Setenv("NATS_SERVER_NAME", "nats-1")
	for user, v := range natstest.DeployUsers {
		t.Setenv(v, password(user))
	}
	opts, err := server.ProcessConfigFile("cluster.conf")
	if err != nil {
		t.Fatal(err)
	}
	if opts.Cluster.Name != "agora" || len(opts.Routes) != 3 || !opts.JetStream || opts.ServerName != "nats-1" {
		t.Errorf("cluster.conf: cluster %q, %d routes, jetstream %v, name %q", opts.Cluster.Name, len(opts.Routes), opts.JetStream, opts.ServerName)
	}
	if len(opts.Accounts) == 0 || len(opts.Users) != len(natstest.DeployUsers) {
		t.Errorf("cluster.conf: %d accounts, %d users, want the %d users of permissions.conf", len(opts.Accounts), len(opts.Users), len(natstest.DeployUsers))
	}
}

func TestDenied(t *testing.T) {
	e := start(t, "agora.conf")
	cases := []struct {
		name, user, subject, stream string
	}{
		{"client publishes a lifecycle event", "client", "agora.lifecycle.finished.t1.d1", lifecycle.StreamLifecycle},
		{"client publishes an answer", "client", "agora.answers.human.q-d1", lifecycle.StreamAnswers},
		{"client publishes work", "client", "agora.dispatch.demo", lifecycle.StreamDispatch},
		{"human answerer answers route data", "answerer-human", "agora.answers.data.x", lifecycle.StreamAnswers},
		{"human answerer publishes a question", "answerer-human", "agora.questions.human.q1.asked", lifecycle.StreamQuestions},
		{"worker publishes accepted", "worker", "agora.lifecycle.accepted.t1.d1", lifecycle.StreamLifecycle},
		{"router publishes work", "router", "agora.dispatch.demo", lifecycle.StreamDispatch},
		{"data answerer answers route human", "answerer-data", "agora.answers.human.x", lifecycle.StreamAnswers},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if err := e.jsPublish(c.user, c.subject); err == nil {
				t.Errorf("JetStream publish to %s as %s succeeded", c.subject, c.user)
			}
			if !e.sawViolation(c.user, c.subject) {
				t.Errorf("no permissions violation for %s publishing %s; saw %q", c.user, c.subject, e.seen(c.user))
			}
			if n := e.stored(c.stream, c.subject); n != 0 {
				t.Errorf("%s holds %d messages on %s", c.stream, n, c.subject)
			}
		})
	}

	t.Run("human answerer reads route data", func(t *testing.T) {
		nc := e.conn("answerer-human")
		if _, err := nc.SubscribeSync("agora.questions.data.>"); err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		if !e.sawViolation("answerer-human", "agora.questions.data.>") {
			t.Errorf("subscribing to agora.questions.data.> was allowed; saw %q", e.seen("answerer-human"))
		}
		// Nor through JetStream: a consumer on route data is refused.
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		defer cancel()
		err := answerer.Serve(ctx, nc, "data", answerer.HandlerFunc(func(context.Context, lifecycle.Question) (answerer.Reply, error) {
			return answerer.Reply{}, errors.New("unreachable")
		}))
		if err == nil {
			t.Error("the human answerer served route data")
		}
	})

	t.Run("human answerer reverses route data's suggestions", func(t *testing.T) {
		nc := e.conn("answerer-human")
		for _, subj := range []string{"agora.api.reverse.data", "agora.api.reverse.agents"} {
			if err := nc.Publish(subj, []byte(`{}`)); err != nil {
				t.Fatal(err)
			}
			if !e.sawViolation("answerer-human", subj) {
				t.Errorf("answerer-human may request %s", subj)
			}
		}
		// Its own route's door is granted.
		if err := nc.Publish("agora.api.reverse.human", []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		if e.sawViolation("answerer-human", "agora.api.reverse.human") {
			t.Error("answerer-human may not request agora.api.reverse.human")
		}
	})

	t.Run("client takes over the router durable", func(t *testing.T) {
		js, err := jetstream.New(e.conn("client"))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		if err := js.DeleteConsumer(ctx, lifecycle.StreamLifecycle, provision.ConsumerRouter); err == nil {
			t.Error("client deleted the router's durable consumer")
		}
		if _, err := e.js.Consumer(t.Context(), lifecycle.StreamLifecycle, provision.ConsumerRouter); err != nil {
			t.Errorf("router durable: %v", err)
		}
	})
}

// asker asks in round 0 and copies its input to its output when resumed.
const asker = `if [ "$AGORA_ROUND" = "0" ]; then
  printf '{"question":"A or B?","options":["A","B"],"partial_state":{"step":1}}' > "$AGORA_NEEDS_INPUT_FILE"
else
  echo '{"message":"resuming","percent":50}' >> "$AGORA_PROGRESS_FILE"
  cp "$AGORA_INPUT_FILE" "$AGORA_OUTPUT_FILE"
  cp "$AGORA_INPUT_FILE" "$AGORA_ARTIFACTS_DIR/input.json"
fi`

// bigAsker asks with a partial_state over lifecycle.MaxInlineState, so the
// worker stores it in agora_state and reads it back on the resume.
const bigAsker = `if [ "$AGORA_ROUND" = "0" ]; then
  pad=$(head -c 70000 /dev/zero | tr '\0' a)
  printf '{"question":"A or B?","options":["A","B"],"partial_state":{"step":1,"pad":"%s"}}' "$pad" > "$AGORA_NEEDS_INPUT_FILE"
elif grep -q '"pad": *"aaaaaaaa' "$AGORA_INPUT_FILE" && grep -q '"answer": *"B"' "$AGORA_INPUT_FILE"; then
  printf '{"answer":"B","partial_state":{"step":1}}' > "$AGORA_OUTPUT_FILE"
  cp "$AGORA_OUTPUT_FILE" "$AGORA_ARTIFACTS_DIR/input.json"
else
  exit 3
fi`

// TestRoundTrip runs the real dispatcher, worker and router, each
// connected as its own user, a client as `client` and the answer given as
// `answerer-human`: dispatch → needs_input → answer → finished, and no
// party is told of a single permission violation.
func TestRoundTrip(t *testing.T) {
	e := start(t, "agora.conf")
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))

	kv, err := e.js.KeyValue(t.Context(), lifecycle.BucketSubagents)
	if err != nil {
		t.Fatal(err)
	}
	for name, script := range map[string]string{"asker": asker, "big-asker": bigAsker} {
		def, _ := json.Marshal(subagent.Definition{Name: name, Runtime: subagent.RuntimeExec, Command: []string{"sh", "-c", script}, Timeout: "1m"})
		if _, err := kv.Put(t.Context(), name, def); err != nil {
			t.Fatal(err)
		}
	}

	d, err := dispatcher.New(dispatcher.Config{ShutdownTimeout: 5 * time.Second}, dispatcher.Deps{Conn: e.conn("dispatcher"), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	w, err := worker.New(worker.Config{WorkspaceRoot: t.TempDir(), Concurrency: 1, PullExpiry: 500 * time.Millisecond, ShutdownTimeout: 5 * time.Second},
		worker.Deps{Conn: e.conn("worker"), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	r, err := router.New(router.Config{Tick: 100 * time.Millisecond, RecordWait: 2 * time.Second, ShutdownTimeout: 5 * time.Second},
		router.Deps{Conn: e.conn("router"), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	e.run("dispatcher", d.Run, d.Ready())
	e.run("worker", w.Run, nil)
	e.run("router", r.Run, r.Ready())
	// Health checks work under the dispatcher's permissions too.
	rec := httptest.NewRecorder()
	d.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("dispatcher /healthz under its permissions = %d: %s", rec.Code, rec.Body)
	}

	c, err := client.New(e.conn("client"))
	if err != nil {
		t.Fatal(err)
	}
	human, err := client.New(e.conn("answerer-human"))
	if err != nil {
		t.Fatal(err)
	}
	// The client lists the definitions (agora subagents, agora_subagents).
	if subs, err := c.Subagents(t.Context()); err != nil || len(subs) != 2 {
		t.Fatalf("sub-agents as client: %v %v", subs, err)
	}
	for _, name := range []string{"asker", "big-asker"} {
		tctx, tcancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer tcancel()
		var dsp *client.Dispatch
		for {
			// The router's micro endpoint and consumers may still be starting.
			dsp, err = c.Dispatch(tctx, lifecycle.Request{Subagent: name, Input: json.RawMessage(`{"task":"t"}`)})
			if err == nil || !errors.Is(err, client.ErrUnavailable) || tctx.Err() != nil {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("dispatch as client: %v", err)
		}
		var q lifecycle.Question
		for q.QuestionID == "" {
			qs, err := c.Questions(tctx, client.QuestionFilter{ThreadID: dsp.ThreadID, Status: "asked"})
			if err != nil {
				t.Fatalf("questions as client: %v", err)
			}
			if len(qs) == 1 {
				q = qs[0]
				break
			}
			select {
			case <-tctx.Done():
				t.Fatalf("no question; violations %q", e.all())
			case <-time.After(25 * time.Millisecond):
			}
		}
		// The same question, a page at a time from the router
		// (agora.api.questions: the client may ask, the router serve).
		for {
			p, err := c.Waiting(tctx, client.QuestionFilter{ThreadID: dsp.ThreadID}, 10, "")
			if err != nil {
				t.Fatalf("waiting questions as client: %v; violations %q", err, e.all())
			}
			if p.Count == 1 && len(p.Questions) == 1 && p.Questions[0].QuestionID == q.QuestionID {
				break
			}
			select {
			case <-tctx.Done():
				t.Fatalf("the router's page never listed %s: %+v", q.QuestionID, p)
			case <-time.After(25 * time.Millisecond):
			}
		}
		if q.Route != "human" {
			t.Fatalf("question route %q, want human", q.Route)
		}
		// The inbox's user reads the asking round's partial state while
		// the question waits (the thread's end deletes it: retention).
		if st, err := human.PartialState(tctx, dsp.DispatchID); err != nil || !strings.Contains(string(st), `"step":1`) {
			t.Errorf("partial state as answerer-human: %s %v; violations %q", st, err, e.all())
		}
		for {
			_, err = human.Answer(tctx, q.QuestionID, lifecycle.Answer{Answer: "B", AnsweredBy: "alice"}, client.AnswerVia("human"))
			if err == nil || !errors.Is(err, client.ErrUnavailable) || tctx.Err() != nil {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("answer as answerer-human: %v", err)
		}
		end, err := c.Follow(tctx, dsp.ThreadID, nil)
		if err != nil {
			t.Fatalf("wait as client: %v; violations %q", err, e.all())
		}
		fin, ok := end.Data.(*lifecycle.Finished)
		if !ok || fin.Round != 1 || fin.ParentID != dsp.DispatchID {
			t.Fatalf("thread ended %s %+v; violations %q", end.Kind(), end.Data, e.all())
		}
		var in map[string]json.RawMessage
		if err := json.Unmarshal(fin.Output, &in); err != nil {
			t.Fatal(err)
		}
		var state struct{ Step int }
		if string(in["answer"]) != `"B"` || json.Unmarshal(in["partial_state"], &state) != nil || state.Step != 1 {
			t.Errorf("round 1 input = %s", fin.Output)
		}
		// The worker uploaded the round's artifact; the client reads it.
		r, a, err := c.OpenArtifact(tctx, fin.DispatchID, "input.json")
		if err != nil {
			t.Fatalf("artifact as client: %v; violations %q", err, e.all())
		}
		if b, err := io.ReadAll(r); err != nil || int64(len(b)) != a.Size || !json.Valid(b) {
			t.Errorf("artifact read as client: %d bytes, %v", len(b), err)
		}
		r.Close()
		// The thread ended: the dispatcher, as its own user, set its
		// records to expire and deleted the partial state kept as an
		// object (big-asker's; asker's travels in its event).
		for name == "big-asker" {
			_, err := human.PartialState(tctx, dsp.DispatchID)
			if errors.Is(err, jetstream.ErrObjectNotFound) {
				break
			}
			if tctx.Err() != nil {
				t.Fatalf("partial state of the ended thread still readable (%v); violations %q", err, e.all())
			}
			time.Sleep(25 * time.Millisecond)
		}
		// The inbox's user reads what the runs left beside the question:
		// the artifact, the progress.
		if r, _, err := human.OpenArtifact(tctx, fin.DispatchID, "input.json"); err != nil {
			t.Errorf("artifact as answerer-human: %v; violations %q", err, e.all())
		} else {
			r.Close()
		}
		if _, err := human.LatestProgress(tctx, dsp.ThreadID); err != nil {
			t.Errorf("progress as answerer-human: %v; violations %q", err, e.all())
		}
		if name == "asker" {
			// The worker published the round's progress; the client reads it.
			pctx, pcancel := context.WithTimeout(tctx, 10*time.Second)
			var got *lifecycle.Progress
			for it, err := range c.WatchProgress(pctx, client.Filter{DispatchID: fin.DispatchID, FromStart: true}) {
				if err == nil {
					got = it.Progress
				}
				break
			}
			pcancel()
			if got == nil || got.Message != "resuming" {
				t.Errorf("progress as client = %+v; violations %q", got, e.all())
			}
		}
		// The status projection follows the events: poll it.
		testkit.Eventually(t, 30*time.Second, "the status as client to read finished", func() bool {
			rec, err := c.Status(tctx, fin.DispatchID)
			return err == nil && rec.Status == lifecycle.KindFinished
		})
	}
	// Written there and deleted, marker and all, when its thread ended:
	// the stream's last sequence shows it was.
	if info := natstest.StreamInfo(t, e.js, "OBJ_"+lifecycle.BucketState); info.State.LastSeq == 0 {
		t.Error("big-asker's partial state did not go through the object store")
	}

	// `agora mcp` runs as client: it lists sub-agents, dispatches, asks
	// through an input-required result, consumes the requestState in
	// agora_mcp_states and answers.
	ms, err := mcpserver.New(t.Context(), mcpserver.Config{}, mcpserver.Deps{Client: c, Logger: log})
	if err != nil {
		t.Fatalf("mcp server as client: %v", err)
	}
	st, ct := mcp.NewInMemoryTransports()
	if _, err := ms.Serve(t.Context(), st, "ops"); err != nil {
		t.Fatal(err)
	}
	mc := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, &mcp.ClientOptions{
		ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"answer": "A"}}, nil
		}})
	cs, err := mc.Connect(t.Context(), ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	for _, call := range []*mcp.CallToolParams{
		{Name: "agora_subagents", Arguments: map[string]any{}},
		{Name: "agora_dispatch", Arguments: map[string]any{"subagent": "asker", "input": map[string]any{"task": "t"}}},
	} {
		res, err := cs.CallTool(t.Context(), call)
		if err != nil || res.IsError {
			t.Fatalf("%s as client: %v %+v; violations %q", call.Name, err, res, e.all())
		}
		if b, _ := json.Marshal(res.StructuredContent); call.Name == "agora_dispatch" && !strings.Contains(string(b), `"status":"finished"`) {
			t.Errorf("agora_dispatch as client = %s", b)
		}
	}
	if v := e.all(); len(v) > 0 {
		t.Errorf("permission violations during the round trip: %q", v)
	}
}

// TestAnswerScoping: an answerer answers only its own route's questions
// through the API. answerer-data may not request the generic
// agora.api.answer (a permissions violation), nor the human route's
// endpoint; on its own route's endpoint the router refuses a human
// question as invalid and records the refusal. answerer-human answers it
// through agora.api.answer.human; `client`, trusted, could through the
// generic endpoint.
func TestAnswerScoping(t *testing.T) {
	e := start(t, "agora.conf")
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	r, err := router.New(router.Config{Tick: 100 * time.Millisecond, RecordWait: 100 * time.Millisecond, ShutdownTimeout: 5 * time.Second},
		router.Deps{Conn: e.conn("router"), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	e.run("router", r.Run, r.Ready())

	// A needs_input as the worker publishes it: a question on route human.
	did := lifecycle.NewID()
	ni := &lifecycle.NeedsInput{Common: lifecycle.Common{DispatchID: did, ThreadID: did, Subagent: "asker"},
		QuestionID: lifecycle.QuestionID(did), Question: "A or B?", Options: []string{"A", "B"}}
	_, m, err := lifecycle.Message(lifecycle.Source("worker", "test"), ni)
	if err != nil {
		t.Fatal(err)
	}
	wjs, err := jetstream.New(e.conn("worker"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wjs.PublishMsg(t.Context(), m); err != nil {
		t.Fatalf("needs_input as worker: %v", err)
	}
	qid := ni.QuestionID
	questions, err := e.js.KeyValue(t.Context(), lifecycle.BucketQuestions)
	if err != nil {
		t.Fatal(err)
	}
	type entry struct{ Via, Door, Route, Result, Status, Reason string }
	var rec struct {
		Route, Status string
		AnsweredBy    string `json:"answered_by"`
		History       []entry
	}
	read := func() {
		t.Helper()
		en, err := questions.Get(t.Context(), qid)
		if err != nil {
			t.Fatalf("question %s: %v", qid, err)
		}
		if err := json.Unmarshal(en.Value(), &rec); err != nil {
			t.Fatal(err)
		}
	}
	testkit.Eventually(t, 30*time.Second, "the router to ask the question", func() bool {
		_, err := questions.Get(t.Context(), qid)
		return err == nil
	})
	if read(); rec.Route != "human" {
		t.Fatalf("question route %q, want human", rec.Route)
	}

	data, err := client.New(e.conn("answerer-data"), client.WithTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	answer := lifecycle.Answer{Answer: "A", AnsweredBy: "sqldb"}
	t.Run("data answerer on the generic endpoint", func(t *testing.T) {
		if _, err := data.Answer(t.Context(), qid, answer); err == nil {
			t.Error("answer accepted")
		}
		if !e.sawViolation("answerer-data", lifecycle.APIAnswer) {
			t.Errorf("no permissions violation on %s; saw %q", lifecycle.APIAnswer, e.seen("answerer-data"))
		}
	})
	t.Run("data answerer on the human endpoint", func(t *testing.T) {
		if _, err := data.Answer(t.Context(), qid, answer, client.AnswerVia("human")); err == nil {
			t.Error("answer accepted")
		}
		if !e.sawViolation("answerer-data", "agora.api.answer.human") {
			t.Errorf("no permissions violation on agora.api.answer.human; saw %q", e.seen("answerer-data"))
		}
	})
	t.Run("data answerer on its own endpoint", func(t *testing.T) {
		_, err := data.Answer(t.Context(), qid, answer, client.AnswerVia("data"))
		var ae *client.AnswerError
		if !errors.As(err, &ae) || !errors.Is(err, client.ErrInvalidAnswer) || ae.Reply.Reason != "question "+qid+" is on route human, not data" {
			t.Fatalf("answer through agora.api.answer.data: %v", err)
		}
		read()
		want := entry{Via: "api-route", Door: "agora.api.answer.data", Route: "data", Result: "refused", Status: "invalid", Reason: ae.Reply.Reason}
		if len(rec.History) != 1 || rec.History[0] != want || rec.Status != "asked" {
			t.Errorf("record: status %s, history %+v, want [%+v]", rec.Status, rec.History, want)
		}
	})

	human, err := client.New(e.conn("answerer-human"))
	if err != nil {
		t.Fatal(err)
	}
	rep, err := human.Answer(t.Context(), qid, lifecycle.Answer{Answer: "B", AnsweredBy: "alice"}, client.AnswerVia("human"))
	if err != nil || rep.Status != client.AnswerAccepted {
		t.Fatalf("answer as answerer-human: %+v, %v", rep, err)
	}
	if read(); rec.Status != "answered" || rec.AnsweredBy != "alice" || len(rec.History) != 2 || rec.History[1].Door != "agora.api.answer.human" {
		t.Errorf("record: %+v", rec)
	}
	for _, user := range []string{"router", "answerer-human", "worker"} {
		if v := e.seen(user); len(v) > 0 {
			t.Errorf("permission violations of %s: %q", user, v)
		}
	}
}

func (e *env) all() map[string][]string {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := map[string][]string{}
	for k, v := range e.violations {
		out[k] = append([]string(nil), v...)
	}
	return out
}

// Ports and the store directory come from local.conf, which both node
// configurations include: replacing it changes them and nothing else.
func TestLocalConfigIncluded(t *testing.T) {
	for user, v := range natstest.DeployUsers {
		t.Setenv(v, password(user))
	}
	t.Setenv("NATS_SERVER_NAME", "test-1")
	for _, file := range []string{"agora.conf", "cluster.conf"} {
		opts, err := server.ProcessConfigFile(file)
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if opts.Port != 4222 || opts.HTTPPort != 8222 || opts.StoreDir != "/data" || len(opts.Users) == 0 {
			t.Errorf("%s: port %d, http %d, store %q, %d users; want local.conf's 4222, 8222, /data and the users", file, opts.Port, opts.HTTPPort, opts.StoreDir, len(opts.Users))
		}
		dir := t.TempDir()
		for _, f := range []string{file, "permissions.conf"} {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, f), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		local := "port: 14222\nhttp_port: 18222\njetstream {\n  store_dir: /srv/nats\n}\n"
		if err := os.WriteFile(filepath.Join(dir, "local.conf"), []byte(local), 0o600); err != nil {
			t.Fatal(err)
		}
		opts, err = server.ProcessConfigFile(filepath.Join(dir, file))
		if err != nil {
			t.Fatalf("%s with another local.conf: %v", file, err)
		}
		if opts.Port != 14222 || opts.HTTPPort != 18222 || opts.StoreDir != "/srv/nats" {
			t.Errorf("%s with another local.conf: port %d, http %d, store %q", file, opts.Port, opts.HTTPPort, opts.StoreDir)
		}
	}
}

// The inbox, connected as answerer-human, announces its URL as the micro
// service agora-inbox, and a client (the CLI) reads it; neither is told of
// a permission violation.
func TestInboxAnnouncesItsURL(t *testing.T) {
	e := start(t, "agora.conf")
	ib, err := inbox.New(inbox.Config{DevToken: true, Routes: []string{"human"}, PublicURL: "https://agora.example.com/inbox"},
		inbox.Deps{Conn: e.conn("answerer-human"), Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	e.run("inbox", ib.Run, ib.Ready())

	nc := e.conn("client")
	var info micro.Info
	deadline := time.Now().Add(10 * time.Second)
	for {
		m, err := nc.Request("$SRV.INFO."+inbox.ServiceName, nil, time.Second)
		if err == nil {
			if err := json.Unmarshal(m.Data, &info); err != nil {
				t.Fatal(err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no answer on $SRV.INFO.%s: %v; violations %v", inbox.ServiceName, err, e.all())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if info.Metadata["url"] != "https://agora.example.com/inbox" {
		t.Errorf("announced %v", info.Metadata)
	}
	for _, u := range []string{"client", "answerer-human"} {
		if v := e.seen(u); len(v) > 0 {
			t.Errorf("%s was told of permission violations: %q", u, v)
		}
	}
}

// The inbox, as answerer-human, signs people in (agora_inbox_sessions:
// write, get, watch) and records used answer links; a second replica
// knows the sign-in. No other user may write a session: that would be
// signing someone in.
func TestInboxSessionsAndLinks(t *testing.T) {
	e := start(t, "agora.conf")
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	cfg := inbox.Config{DevToken: true, Routes: []string{"human"}, LinkKey: seal.NewKey()}
	var replicas []*inbox.Server
	var urls []string
	for range 2 {
		ib, err := inbox.New(cfg, inbox.Deps{Conn: e.conn("answerer-human"), Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		e.run("inbox", ib.Run, ib.Ready())
		web := httptest.NewServer(ib.Handler())
		t.Cleanup(web.Close)
		replicas, urls = append(replicas, ib), append(urls, web.URL)
	}
	// Sign in on the first replica; the second must know the session.
	b, _ := json.Marshal(inbox.LoginRequest{Token: replicas[0].DevToken()})
	resp, err := http.Post(urls[0]+"/inbox/api/login", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	var rep inbox.LoginReply
	_ = json.NewDecoder(resp.Body).Decode(&rep)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || rep.Token == "" {
		t.Fatalf("sign in as answerer-human: %d; violations %v", resp.StatusCode, e.all())
	}
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, urls[1]+"/inbox/api/questions", nil)
	req.Header.Set("Authorization", "Bearer "+rep.Token)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("the second replica refused the session: %d; violations %v", resp.StatusCode, e.all())
	}

	// A used link is recorded as answerer-human.
	js, err := jetstream.New(e.conn("answerer-human"))
	if err != nil {
		t.Fatal(err)
	}
	links, err := js.KeyValue(t.Context(), lifecycle.BucketAnswerLinks)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := links.Create(t.Context(), "link-1", []byte(`{}`), jetstream.KeyTTL(time.Minute)); err != nil {
		t.Errorf("record a used link as answerer-human: %v", err)
	}
	if v := e.seen("answerer-human"); len(v) > 0 {
		t.Errorf("answerer-human was told of permission violations: %q", v)
	}

	// Nobody else writes sessions or link records.
	for _, u := range []string{"client", "answerer-data", "answerer-agents", "worker", "router", "dispatcher"} {
		for _, subj := range []string{"$KV." + lifecycle.BucketInboxSessions + ".forged", "$KV." + lifecycle.BucketAnswerLinks + ".forged"} {
			if err := e.jsPublish(u, subj); err == nil {
				t.Errorf("%s wrote %s", u, subj)
			}
		}
	}
}

// The Slack answerer, as answerer-slack, binds route human's questions, the
// question records and its messages bucket without a violation, and
// cannot answer another route.
func TestSlackAnswererUser(t *testing.T) {
	e := start(t, "agora.conf")
	settings := filepath.Join(t.TempDir(), "slack.yaml")
	if err := os.WriteFile(settings, []byte("routes:\n  human:\n    channel: C0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"ok":true,"channel":"C0123456789","ts":"1.000001"}`))
	}))
	t.Cleanup(api.Close)
	sc := e.conn("answerer-slack")
	sa, err := slackanswerer.New(slackanswerer.Config{BotToken: "xoxb-test", SigningSecret: "signing-secret-for-tests", SettingsFile: settings, APIURL: api.URL + "/"},
		slackanswerer.Deps{Conn: sc, Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	e.run("slack answerer", sa.Run, sa.Ready())
	// Past Ready the answerer watches the question records and pulls the
	// route's questions: wait until the server holds both, then for the
	// server's replies on its connection, a refusal among them.
	testkit.Eventually(t, 10*time.Second, "the Slack answerer's watch and pull", func() bool {
		return e.consumers("KV_"+lifecycle.BucketQuestions, false) > 0 && e.consumers(lifecycle.StreamQuestions, true) > 0
	})
	if err := sc.Flush(); err != nil {
		t.Fatal(err)
	}
	if v := e.seen("answerer-slack"); len(v) > 0 {
		t.Errorf("answerer-slack was told of permission violations: %q", v)
	}
	nc := e.conn("answerer-slack")
	for _, subj := range []string{"agora.api.answer.data", "agora.api.answer", "agora.answers.data.q-1"} {
		if err := nc.Publish(subj, []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
		if !e.sawViolation("answerer-slack", subj) {
			t.Errorf("answerer-slack may publish %s", subj)
		}
	}
	for _, subj := range []string{"$KV." + lifecycle.BucketInboxSessions + ".forged", "$KV." + lifecycle.BucketQuestions + ".q-1"} {
		if err := e.jsPublish("answerer-slack", subj); err == nil {
			t.Errorf("answerer-slack wrote %s", subj)
		}
	}
}

// The webhook notifier, as answerer-webhook, binds route notify's
// questions and reads the records without a violation; it cannot answer
// or write elsewhere.
func TestWebhookUser(t *testing.T) {
	e := start(t, "agora.conf")
	w, err := webhook.New(webhook.Config{Routes: []string{"notify"}, URL: "http://127.0.0.1:1/hook", Secret: "a-secret-of-16-bytes+"},
		webhook.Deps{Conn: e.conn("answerer-webhook"), Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	e.run("webhook", w.Run, w.Ready())
	if v := e.seen("answerer-webhook"); len(v) > 0 {
		t.Errorf("answerer-webhook was told of permission violations: %q", v)
	}
	nc := e.conn("answerer-webhook")
	for _, subj := range []string{"agora.api.answer.human", "agora.api.answer"} {
		if err := nc.Publish(subj, []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
		if !e.sawViolation("answerer-webhook", subj) {
			t.Errorf("answerer-webhook may publish %s", subj)
		}
	}
	if err := e.jsPublish("answerer-webhook", "$KV."+lifecycle.BucketQuestions+".q-1"); err == nil {
		t.Error("answerer-webhook wrote a question record")
	}
}

// TestAuditLogUser: the decision log's writer runs on its own user
// without a permission violation and records a question event the router
// publishes, yet may neither publish events, pull the router's durable,
// nor write a question record.
func TestAuditLogUser(t *testing.T) {
	e := start(t, "agora.conf")
	w, err := auditlog.New(auditlog.Config{}, auditlog.Deps{Conn: e.conn("auditlog"),
		Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	e.run("auditlog", w.Run, w.Ready())
	q := &lifecycle.Question{Common: lifecycle.Common{DispatchID: "d1", ThreadID: "t1", Subagent: "coder"}, QuestionID: "q-d1",
		Event: lifecycle.QuestionAsked, Status: "asked", Route: "human", Question: "?", AskedAt: time.Now().UTC()}
	_, m, err := lifecycle.Message(lifecycle.Source("router", "test"), q)
	if err != nil {
		t.Fatal(err)
	}
	rjs, err := jetstream.New(e.conn("router"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rjs.PublishMsg(t.Context(), m); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 20*time.Second, "the asked entry", func() bool {
		st, err := e.js.Stream(t.Context(), audit.Stream)
		return err == nil && st.CachedInfo().State.Msgs == 1
	})
	// A worker's refusal below the sandbox floor is read and logged too.
	_, m, err = lifecycle.Message(lifecycle.Source("worker", "test"), &lifecycle.Failed{Common: lifecycle.Common{DispatchID: "d2", ThreadID: "d2", Subagent: "coder"},
		Reason: lifecycle.ReasonRejected, Detail: "below the floor", BelowFloor: []string{`sandbox.mode "off"`}})
	if err != nil {
		t.Fatal(err)
	}
	wjs, err := jetstream.New(e.conn("worker"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wjs.PublishMsg(t.Context(), m); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 20*time.Second, "the refused entry", func() bool {
		st, err := e.js.Stream(t.Context(), audit.Stream)
		return err == nil && st.CachedInfo().State.Msgs == 2
	})
	if v := e.seen("auditlog"); len(v) > 0 {
		t.Errorf("auditlog was told of permission violations: %q", v)
	}
	nc := e.conn("auditlog")
	for _, subj := range []string{"agora.questions.human.q-d1.answered", "agora.lifecycle.cancelled.t1.d1",
		"$JS.API.CONSUMER.MSG.NEXT.AGORA_LIFECYCLE.router", "$JS.API.CONSUMER.MSG.NEXT.AGORA_QUESTIONS.answerer-human",
		"$JS.API.STREAM.PURGE.AGORA_AUDIT", "$JS.API.STREAM.MSG.DELETE.AGORA_AUDIT"} {
		if err := nc.Publish(subj, []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
		if !e.sawViolation("auditlog", subj) {
			t.Errorf("auditlog may publish %s", subj)
		}
	}
	if err := e.jsPublish("auditlog", "$KV."+lifecycle.BucketQuestions+".q-1"); err == nil {
		t.Error("auditlog wrote a question record")
	}
}

// TestAgentAnswererCallsAsItself: answerer-agents dispatches, reads and
// cancels on its own API subjects (client.WithCaller), as the principal
// answerer-agents: it reaches its own threads, not another's, may not
// name another principal, and may neither use the trusted subjects nor
// another user's.
func TestAgentAnswererCallsAsItself(t *testing.T) {
	e := start(t, "agora.conf")
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	e.define(map[string]string{"asker": asker})
	e.startDispatcher(log)

	trusted, err := client.New(e.conn("client"))
	if err != nil {
		t.Fatal(err)
	}
	req := func() lifecycle.Request {
		return lifecycle.Request{Subagent: "asker", Input: json.RawMessage(`{"task":"t"}`)}
	}
	theirs, err := trusted.Dispatch(t.Context(), req(), client.OnBehalfOf("alice"))
	if err != nil {
		t.Fatal(err)
	}
	agentsConn := e.conn("answerer-agents")
	agents, err := client.New(agentsConn, client.WithCaller("answerer-agents"), client.WithTimeout(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	mine, err := agents.Dispatch(t.Context(), req())
	if err != nil {
		t.Fatalf("dispatch as answerer-agents on its own subject: %v", err)
	}
	if mine.Record.Principal != "answerer-agents" {
		t.Errorf("its dispatch records principal %q, want answerer-agents", mine.Record.Principal)
	}
	if rec, err := agents.Status(t.Context(), mine.DispatchID); err != nil || rec.DispatchID != mine.DispatchID {
		t.Errorf("status of its own dispatch: %+v %v", rec, err)
	}
	if _, err := agents.Thread(t.Context(), mine.ThreadID); err != nil {
		t.Errorf("its own thread: %v", err)
	}

	// Another's thread is an unknown id to it: no status, no cancel.
	if _, err := agents.Status(t.Context(), theirs.DispatchID); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("status of alice's dispatch as answerer-agents: %v, want not found", err)
	}
	if _, err := agents.Thread(t.Context(), theirs.ThreadID); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("alice's thread as answerer-agents: %v, want not found", err)
	}
	if _, err := agents.Cancel(t.Context(), theirs.DispatchID); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("cancel of alice's dispatch as answerer-agents: %v, want not found", err)
	}
	if _, err := agents.CancelThread(t.Context(), theirs.ThreadID); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("cancel of alice's thread as answerer-agents: %v, want not found", err)
	}
	if rec, err := trusted.Status(t.Context(), theirs.DispatchID); err != nil || rec.Status == lifecycle.KindCancelled || rec.CancelRequested != nil {
		t.Errorf("alice's dispatch after answerer-agents tried to cancel it: %+v %v", rec, err)
	}
	// Nor does it start a thread for someone else.
	var p *client.Problem
	if _, err := agents.Dispatch(t.Context(), req(), client.OnBehalfOf("alice")); !errors.As(err, &p) || p.Status != http.StatusForbidden {
		t.Errorf("dispatch on behalf of alice as answerer-agents: %v, want 403", err)
	}
	// Its own cancel works.
	if rec, err := agents.Cancel(t.Context(), mine.DispatchID); err != nil || rec.DispatchID != mine.DispatchID {
		t.Errorf("cancel of its own dispatch: %+v %v", rec, err)
	}

	// The trusted subjects and another user's are not its to call.
	plain, err := client.New(agentsConn, client.WithTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plain.Cancel(t.Context(), theirs.DispatchID); err == nil {
		t.Error("answerer-agents cancelled on agora.api.cancel")
	}
	if !e.sawViolation("answerer-agents", lifecycle.APICancel) {
		t.Errorf("no permissions violation for answerer-agents on %s; saw %q", lifecycle.APICancel, e.seen("answerer-agents"))
	}
	posing, err := client.New(agentsConn, client.WithCaller("client"), client.WithTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := posing.Status(t.Context(), theirs.DispatchID); err == nil {
		t.Error("answerer-agents called agora.api.status.client")
	}
	if !e.sawViolation("answerer-agents", lifecycle.APIStatus+".client") {
		t.Errorf("no permissions violation for answerer-agents on %s.client; saw %q", lifecycle.APIStatus, e.seen("answerer-agents"))
	}
}

// TestAnswerersReadOnlyTheirRoute: an answerer program (answerer-data)
// reads no question record — not another route's — and learns whether a
// question waits only from the router's endpoint for its own route, which
// answers for that route alone; pkg/answerer serves the route with those
// grants and no permission violation.
func TestAnswerersReadOnlyTheirRoute(t *testing.T) {
	e := start(t, "agora.conf")
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	routes := filepath.Join(t.TempDir(), "routes.yaml")
	if err := os.WriteFile(routes, []byte("routes:\n  - name: data\n    match: {subagent: \"data-*\"}\n    answerer: data\n  - name: people\n    answerer: human\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := router.New(router.Config{RoutesFile: routes, Tick: 100 * time.Millisecond, RecordWait: 100 * time.Millisecond, ShutdownTimeout: 5 * time.Second},
		router.Deps{Conn: e.conn("router"), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	e.run("router", r.Run, r.Ready())
	wjs, err := jetstream.New(e.conn("worker"))
	if err != nil {
		t.Fatal(err)
	}
	ask := func(sa, question string) string {
		t.Helper()
		did := lifecycle.NewID()
		ni := &lifecycle.NeedsInput{Common: lifecycle.Common{DispatchID: did, ThreadID: did, Subagent: sa},
			QuestionID: lifecycle.QuestionID(did), Question: question}
		_, m, err := lifecycle.Message(lifecycle.Source("worker", "test"), ni)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := wjs.PublishMsg(t.Context(), m); err != nil {
			t.Fatalf("needs_input as worker: %v", err)
		}
		return ni.QuestionID
	}
	qData := ask("data-loader", "How many rows in orders?")
	qHuman := ask("asker", "What is the staging database password?")
	trusted, err := client.New(e.conn("client"))
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, "both questions asked", func() bool {
		p, err := trusted.Waiting(t.Context(), client.QuestionFilter{}, 10, "")
		return err == nil && p.Count == 2
	})

	data, err := client.New(e.conn("answerer-data"), client.WithTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	// The records themselves: not readable, route human's least of all.
	if q, err := data.Question(t.Context(), qHuman); err == nil {
		t.Errorf("answerer-data read route human's question record: %q", q.Question)
	}
	if !e.sawViolation("answerer-data", "$JS.API.STREAM.INFO.KV_"+lifecycle.BucketQuestions) {
		t.Errorf("no permissions violation reading %s; saw %q", lifecycle.BucketQuestions, e.seen("answerer-data"))
	}
	// Its route's endpoint: its own question, nothing of the other.
	one := func(qid string) int {
		t.Helper()
		p, err := data.WaitingOnRoute(t.Context(), "data", client.WaitingRequest{QuestionID: qid})
		if err != nil {
			t.Fatalf("waiting %s on route data: %v", qid, err)
		}
		return len(p.Questions)
	}
	if one(qData) != 1 || one(qHuman) != 0 {
		t.Errorf("route data's endpoint: its question %d, route human's %d; want 1 and 0", one(qData), one(qHuman))
	}
	if p, err := data.WaitingOnRoute(t.Context(), "data", client.WaitingRequest{}); err != nil || p.Count != 1 || len(p.Questions) != 1 || p.Questions[0].QuestionID != qData {
		t.Errorf("route data's page: %+v %v", p, err)
	}
	if _, err := data.WaitingOnRoute(t.Context(), "data", client.WaitingRequest{Route: "human"}); !errors.Is(err, client.ErrInvalidRequest) {
		t.Errorf("route data's endpoint asked for route human: %v, want invalid", err)
	}
	if _, err := data.WaitingOnRoute(t.Context(), "human", client.WaitingRequest{QuestionID: qHuman}); err == nil {
		t.Error("answerer-data asked route human's endpoint")
	}
	if !e.sawViolation("answerer-data", "agora.api.questions.human") {
		t.Errorf("no permissions violation on agora.api.questions.human; saw %q", e.seen("answerer-data"))
	}
	if _, err := data.Waiting(t.Context(), client.QuestionFilter{}, 10, ""); err == nil {
		t.Errorf("answerer-data read %s", lifecycle.APIQuestions)
	}
	if !e.sawViolation("answerer-data", lifecycle.APIQuestions) {
		t.Errorf("no permissions violation on %s; saw %q", lifecycle.APIQuestions, e.seen("answerer-data"))
	}

	// pkg/answerer serves route data under these grants, told of nothing.
	before := len(e.seen("answerer-data"))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	served := make(chan error, 1)
	go func() {
		served <- answerer.Serve(ctx, e.conn("answerer-data"), "data", answerer.HandlerFunc(func(_ context.Context, q lifecycle.Question) (answerer.Reply, error) {
			return answerer.Answer("42"), nil
		}))
	}()
	testkit.Eventually(t, 30*time.Second, "route data's question answered", func() bool {
		q, err := trusted.Question(t.Context(), qData)
		return err == nil && q.Status == "answered"
	})
	cancel()
	if err := <-served; err != nil {
		t.Errorf("Serve: %v", err)
	}
	if v := e.seen("answerer-data"); len(v) != before {
		t.Errorf("serving route data, answerer-data was told of permission violations: %q", v[before:])
	}
	if q, err := trusted.Question(t.Context(), qHuman); err != nil || q.Status != "asked" {
		t.Errorf("route human's question: %+v %v", q, err)
	}
}

// TestRepliesArePrivate: each user subscribes to its own reply subjects
// only (_INBOX_<user>.>), so an answerer cannot read the replies another
// user gets — here the dispatch record, input included, that the client
// reads back.
func TestRepliesArePrivate(t *testing.T) {
	e := start(t, "agora.conf")
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	e.define(map[string]string{"asker": asker})
	e.startDispatcher(log)

	spy := e.conn("answerer-data")
	var subs []*nats.Subscription
	for _, subj := range []string{"_INBOX.>", "_INBOX_client.>", "_INBOX_*.>", ">"} {
		sub, err := spy.SubscribeSync(subj)
		if err != nil {
			t.Fatal(err)
		}
		subs = append(subs, sub)
	}
	if err := spy.Flush(); err != nil {
		t.Fatal(err)
	}
	for _, subj := range []string{"_INBOX.>", "_INBOX_client.>", "_INBOX_*.>", ">"} {
		if !e.sawViolation("answerer-data", subj) {
			t.Errorf("answerer-data subscribed to %s; saw %q", subj, e.seen("answerer-data"))
		}
	}
	c, err := client.New(e.conn("client"))
	if err != nil {
		t.Fatal(err)
	}
	secret := `{"task":"rotate the key sk-live-0123"}`
	dsp, err := c.Dispatch(t.Context(), lifecycle.Request{Subagent: "asker", Input: json.RawMessage(secret)})
	if err != nil {
		t.Fatalf("dispatch as client on its own reply prefix: %v", err)
	}
	if rec, err := c.Status(t.Context(), dsp.DispatchID); err != nil || rec.DispatchID != dsp.DispatchID {
		t.Fatalf("status as client: %+v %v", rec, err)
	}
	for i, sub := range subs {
		if m, err := sub.NextMsg(300 * time.Millisecond); err == nil {
			t.Errorf("answerer-data's subscription %d received %s: %.80s", i, m.Subject, m.Data)
		}
	}
	if v := e.seen("client"); len(v) > 0 {
		t.Errorf("the client was told of permission violations: %q", v)
	}
}

// TestAgentAnswererUser runs the agent answerer as answerer-agents under
// the deploy's grants (AGORA_AGENT_CALLER=answerer-agents): a question on
// route agents is answered by the sub-agent it dispatches, followed by its
// record alone, and the asking thread finishes with that answer; the
// answerer is told of no permission violation and reads no lifecycle
// event.
func TestAgentAnswererUser(t *testing.T) {
	e := start(t, "agora.conf")
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	e.define(map[string]string{
		"asker":  asker,
		"oracle": `printf '{"answer":"B"}' > "$AGORA_OUTPUT_FILE"`,
	})
	routes := filepath.Join(t.TempDir(), "routes.yaml")
	if err := os.WriteFile(routes, []byte("routes:\n  - name: agents\n    match: {subagent: asker}\n    answerer: agents\n  - name: people\n    answerer: human\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	w, err := worker.New(worker.Config{WorkspaceRoot: t.TempDir(), Concurrency: 2, PullExpiry: 500 * time.Millisecond, ShutdownTimeout: 5 * time.Second},
		worker.Deps{Conn: e.conn("worker"), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	r, err := router.New(router.Config{RoutesFile: routes, Tick: 100 * time.Millisecond, RecordWait: 2 * time.Second, ShutdownTimeout: 5 * time.Second},
		router.Deps{Conn: e.conn("router"), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	e.startDispatcher(log)
	e.run("worker", w.Run, nil)
	e.run("router", r.Run, r.Ready())

	ac, err := client.New(e.conn("answerer-agents"), client.WithCaller("answerer-agents"))
	if err != nil {
		t.Fatal(err)
	}
	a, err := agent.New(ac, agent.Config{Subagent: "oracle", Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	e.run("agent answerer", func(ctx context.Context) error {
		return answerer.Serve(ctx, e.conn("answerer-agents"), "agents", a, answerer.WithLogger(log), answerer.WithShutdownTimeout(-1))
	}, nil)

	c, err := client.New(e.conn("client"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	var dsp *client.Dispatch
	for {
		dsp, err = c.Dispatch(ctx, lifecycle.Request{Subagent: "asker", Input: json.RawMessage(`{"task":"t"}`)})
		if err == nil || !errors.Is(err, client.ErrUnavailable) || ctx.Err() != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("dispatch as client: %v", err)
	}
	var out map[string]any
	if err := dsp.Result(ctx, &out); err != nil {
		t.Fatalf("the asking thread: %v; violations %q", err, e.all())
	}
	if out["answer"] != "B" || out["answered_by"] != "answerer:agents" {
		t.Errorf("the thread resumed with %v, want the oracle's answer B from answerer:agents", out)
	}
	if v := e.seen("answerer-agents"); len(v) > 0 {
		t.Errorf("answerer-agents was told of permission violations: %q", v)
	}
	// And it cannot read the lifecycle stream.
	ajs, err := jetstream.New(e.conn("answerer-agents"))
	if err != nil {
		t.Fatal(err)
	}
	sctx, scancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer scancel()
	if _, err := ajs.OrderedConsumer(sctx, lifecycle.StreamLifecycle, jetstream.OrderedConsumerConfig{}); err == nil {
		t.Error("answerer-agents opened a consumer on the lifecycle stream")
	}
}
