package agent_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/answerers/agent"
	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/pkg/answerer"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/services/dispatcher"
	"github.com/agora-dispatch/agora/services/router"
	"github.com/agora-dispatch/agora/services/worker"
)

func quietLogger() *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// system runs the real dispatcher, worker and router on a test server.
type system struct {
	t   *testing.T
	srv *natstest.Server
	c   *client.Client
}

func startSystem(t *testing.T, routes string) *system {
	t.Helper()
	srv := natstest.StartProvisioned(t, provision.Config{})
	file := filepath.Join(t.TempDir(), "routes.yaml")
	if err := os.WriteFile(file, []byte(routes), 0o600); err != nil {
		t.Fatal(err)
	}
	// Connections first: cleanups run last-in first-out, so the services
	// stop before their connections close.
	dconn, wconn, rconn, aconn := srv.Conn(t), srv.Conn(t), srv.Conn(t), srv.Conn(t)
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
	d, err := dispatcher.New(dispatcher.Config{ShutdownTimeout: 5 * time.Second}, dispatcher.Deps{Conn: dconn, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	run("dispatcher", d.Run)
	w, err := worker.New(worker.Config{WorkspaceRoot: t.TempDir(), Concurrency: 4, PullExpiry: 500 * time.Millisecond, KillGrace: 500 * time.Millisecond, ShutdownTimeout: 5 * time.Second},
		worker.Deps{Conn: wconn, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	run("worker", w.Run)
	r, err := router.New(router.Config{RoutesFile: file, Tick: 100 * time.Millisecond, ShutdownTimeout: 5 * time.Second}, router.Deps{Conn: rconn, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	run("router", r.Run)
	for _, ready := range []<-chan struct{}{d.Ready(), r.Ready()} {
		select {
		case <-ready:
		case <-time.After(time.Minute):
			t.Fatal("services not ready")
		}
	}
	c, err := client.New(dconn)
	if err != nil {
		t.Fatal(err)
	}
	s := &system{t: t, srv: srv, c: c}
	// The agent answerer serves the route "agents".
	a, err := agent.New(c, agent.Config{Subagent: "oracle", Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	run("agent answerer", func(ctx context.Context) error {
		return answerer.Serve(ctx, aconn, "agents", a, answerer.WithLogger(quietLogger()), answerer.WithConcurrency(2))
	})
	return s
}

// shell registers an exec sub-agent running script with sh -c.
func (s *system) shell(name, script string) {
	s.t.Helper()
	js, err := jetstream.New(s.srv.Conn(s.t))
	if err != nil {
		s.t.Fatal(err)
	}
	kv, err := js.KeyValue(s.t.Context(), lifecycle.BucketSubagents)
	if err != nil {
		s.t.Fatal(err)
	}
	b, _ := json.Marshal(subagent.Definition{Name: name, Runtime: subagent.RuntimeExec, Command: []string{"sh", "-c", script}, Timeout: "1m"})
	if _, err := kv.Put(s.t.Context(), name, b); err != nil {
		s.t.Fatal(err)
	}
}

// planner asks in round 0 and, resumed, copies its input.json (answer and
// partial state included) into its output.
const planner = `if [ "$AGORA_ROUND" = "0" ]; then
  printf '{"question":"Rewrite function A or B?","options":["A","B"],"context":"same signature","kind":"decision","partial_state":{"analysis":"call sites mapped","n":1e400}}' > "$AGORA_NEEDS_INPUT_FILE"
else
  cp "$AGORA_INPUT_FILE" "$AGORA_OUTPUT_FILE"
fi`

const routes = `routes:
  - name: agents
    match: {subagent: planner}
    answerer: oracle
    fallback: people
  - name: people
    answerer: human
`

// TestAgentAnswersAndThreadResumes: dispatch → needs_input → the agent
// answerer dispatches the oracle sub-agent → its answer is re-dispatched →
// round 1 finishes with the answer and the partial state in its input.
func TestAgentAnswersAndThreadResumes(t *testing.T) {
	s := startSystem(t, routes)
	s.shell("planner", planner)
	s.shell("oracle", `printf '{"answer":"B","comment":"B keeps the API","seen":%s}' "$(cat "$AGORA_INPUT_FILE")" > "$AGORA_OUTPUT_FILE"`)

	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	d, err := s.c.Dispatch(ctx, lifecycle.Request{Subagent: "planner", Input: json.RawMessage(`{"task":"refactor"}`), Labels: map[string]string{"team": "core"}})
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	end, err := s.c.WaitThread(ctx, d.ThreadID, func(_ lifecycle.Event, dt lifecycle.Data) {
		if l, ok := dt.(lifecycle.Lifecycle); ok {
			kinds = append(kinds, string(l.LifecycleKind())+"@"+string(rune('0'+l.Base().Round)))
		}
	})
	if err != nil {
		t.Fatalf("WaitThread: %v (events %v)", err, kinds)
	}
	fin, ok := end.Data.(*lifecycle.Finished)
	if !ok {
		t.Fatalf("thread ended %T %+v (events %v)", end.Data, end.Data, kinds)
	}
	if fin.Round != 1 || fin.ThreadID != d.ThreadID || fin.ParentID != d.ID {
		t.Errorf("finished in round %d, thread %s, parent %s", fin.Round, fin.ThreadID, fin.ParentID)
	}
	var in map[string]json.RawMessage
	if err := json.Unmarshal(fin.Output, &in); err != nil {
		t.Fatalf("output %s: %v", fin.Output, err)
	}
	if string(in["answer"]) != `"B"` || string(in["answered_by"]) != `"answerer:agents"` || string(in["comment"]) != `"B keeps the API"` || string(in["task"]) != `"refactor"` {
		t.Errorf("round 1 input = %s", fin.Output)
	}
	if string(in["partial_state"]) != `{"analysis":"call sites mapped","n":1e400}` {
		t.Errorf("round 1 partial_state = %s", in["partial_state"])
	}
	// The oracle saw the question.
	qs, err := s.c.Questions(ctx, client.QuestionFilter{ThreadID: d.ThreadID})
	if err != nil || len(qs) != 1 {
		t.Fatalf("questions = %+v, %v", qs, err)
	}
	rec, err := s.c.Status(ctx, agent.DispatchID(qs[0]))
	if err != nil {
		t.Fatal(err)
	}
	if rec.Result == nil || !strings.Contains(string(rec.Result.Output), `"question":"Rewrite function A or B?"`) || !strings.Contains(string(rec.Result.Output), `"subagent":"planner"`) {
		t.Errorf("the oracle's output = %+v", rec.Result)
	}
	if qs[0].Status != "answered" || qs[0].Route != "agents" || qs[0].AnsweredBy != "answerer:agents" {
		t.Errorf("question = %+v", qs[0])
	}
}

// TestAgentDeclines: when the answering sub-agent fails, needs input
// itself or gives no answer, the question goes to the fallback route,
// where a person answers and the thread resumes.
func TestAgentDeclines(t *testing.T) {
	tests := []struct {
		name   string
		oracle string
		want   string
	}{
		{"fails", `echo broken >&2; exit 3`, "failed (provider-failed)"},
		{"needs input", `printf '{"question":"What is A?"}' > "$AGORA_NEEDS_INPUT_FILE"`, "needs input itself: What is A?"},
		{"no answer", `printf '{"thinking":"hard"}' > "$AGORA_OUTPUT_FILE"`, "without an answer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := startSystem(t, routes)
			s.shell("planner", planner)
			s.shell("oracle", tt.oracle)
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			d, err := s.c.Dispatch(ctx, lifecycle.Request{Subagent: "planner", Input: json.RawMessage(`{}`)})
			if err != nil {
				t.Fatal(err)
			}
			// Wait for the question to reach the people route.
			var q lifecycle.Question
			for {
				qs, err := s.c.Questions(ctx, client.QuestionFilter{ThreadID: d.ThreadID, Route: "people"})
				if err != nil {
					t.Fatal(err)
				}
				if len(qs) == 1 {
					q = qs[0]
					break
				}
				select {
				case <-ctx.Done():
					t.Fatal("the question never reached the fallback route")
				case <-time.After(50 * time.Millisecond):
				}
			}
			if !strings.Contains(q.Detail, "declined by agents") || !strings.Contains(q.Detail, tt.want) {
				t.Errorf("detail = %q, want %q", q.Detail, tt.want)
			}
			if tt.name == "needs input" {
				// The oracle's own question: its thread is cancelled, so the
				// question is withdrawn rather than left waiting.
				for {
					qs, err := s.c.Questions(ctx, client.QuestionFilter{Subagent: "oracle"})
					if err != nil {
						t.Fatal(err)
					}
					if len(qs) == 1 && qs[0].Status == "withdrawn" {
						break
					}
					select {
					case <-ctx.Done():
						t.Fatalf("the oracle's question was not withdrawn: %+v", qs)
					case <-time.After(50 * time.Millisecond):
					}
				}
			}
			if _, err := s.c.Answer(ctx, q.QuestionID, lifecycle.Answer{Answer: "A", AnsweredBy: "alice"}); err != nil {
				t.Fatal(err)
			}
			end, err := s.c.WaitThread(ctx, d.ThreadID, nil)
			if err != nil {
				t.Fatal(err)
			}
			if fin, ok := end.Data.(*lifecycle.Finished); !ok || !strings.Contains(string(fin.Output), `"answer":"A"`) {
				t.Fatalf("thread ended %+v", end.Data)
			}
		})
	}
}
