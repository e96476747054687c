package a2aserver_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"iter"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2aclient"
	"github.com/a2aproject/a2a-go/v2/a2aclient/agentcard"

	"github.com/agora-dispatch/agora/harness/systemtest"
	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/services/a2aserver"
)

// A sub-agent that asks which of A or B on round 0 and writes its choice
// on round 1.
const chooser = `if grep -q '"answer"' "$AGORA_INPUT_FILE"; then
  sed -n 's/.*"answer": *"\([^"]*\)".*/{"chose":"\1"}/p' "$AGORA_INPUT_FILE" > "$AGORA_OUTPUT_FILE"
else
  echo '{"question":"Rewrite A or B?","options":["A","B"],"kind":"decision","context":"Same signature.","partial_state":{"seen":2}}' > "$AGORA_NEEDS_INPUT_FILE"
fi`

// Asks for an approval on round 0, then writes what it was given.
const approver = `case "$AGORA_ROUND" in
0) echo '{"question":"Deploy now?","kind":"approval"}' > "$AGORA_NEEDS_INPUT_FILE" ;;
*) cp "$AGORA_INPUT_FILE" "$AGORA_OUTPUT_FILE" ;;
esac`

type env struct {
	sys        *systemtest.System
	url        string
	principals string // the principals file
	// paths are the request lines the A2A server was sent.
	mu    sync.Mutex
	paths map[string]bool
}

// saw reports whether the server was sent a request for line.
func (e *env) saw(line string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.paths[line]
}

func hashOf(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// newEnv starts Agora with the chooser sub-agent, and the A2A server on
// a test listener for two principals, team-a and team-b.
func newEnv(t *testing.T) *env {
	t.Helper()
	sys := systemtest.Start(t, systemtest.Options{})
	sys.Shell("chooser", chooser)
	sys.Shell("echo", `cp "$AGORA_INPUT_FILE" "$AGORA_OUTPUT_FILE"`)
	sys.Shell("silent", "true")
	sys.Shell("approver", approver)
	sys.Shell("sleeper", "sleep 60")
	f := filepath.Join(t.TempDir(), "principals.yaml")
	body := fmt.Sprintf("principals:\n  - {name: team-a, token_sha256: %s}\n  - {name: team-b, token_sha256: %s}\n", hashOf("token-a"), hashOf("token-b"))
	if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	e := &env{sys: sys, principals: f, paths: map[string]bool{}}
	e.url = e.serve(t)
	return e
}

// serve starts another A2A server on the same Agora and returns its URL:
// what a restarted process would be. Each of opts changes its config.
func (e *env) serve(t *testing.T, opts ...func(*a2aserver.Config)) string {
	t.Helper()
	cfg := a2aserver.Config{PrincipalsFile: e.principals}
	for _, o := range opts {
		o(&cfg)
	}
	svc, err := a2aserver.New(cfg, a2aserver.Deps{Client: e.sys.Client, Logger: systemtest.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	e.sys.Go("a2a", svc.Run)
	select {
	case <-svc.Ready():
	case <-t.Context().Done():
		t.Fatal("the A2A server never got ready")
	}
	h := svc.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.mu.Lock()
		e.paths[r.Method+" "+r.URL.Path] = true
		e.mu.Unlock()
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// connect resolves the agent card and makes a2a-go's client for token,
// speaking binding.
func (e *env) connect(t *testing.T, token string, binding a2a.TransportProtocol) *a2aclient.Client {
	t.Helper()
	return connectTo(t, e.url, token, binding)
}

// connectTo is connect for the server at url.
func connectTo(t *testing.T, url, token string, binding a2a.TransportProtocol) *a2aclient.Client {
	t.Helper()
	hc := &http.Client{Transport: bearer{token, http.DefaultTransport}, Timeout: time.Minute}
	card, err := agentcard.NewResolver(hc).Resolve(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	c, err := a2aclient.NewFromCard(t.Context(), card, a2aclient.WithJSONRPCTransport(hc), a2aclient.WithRESTTransport(hc),
		a2aclient.WithConfig(a2aclient.Config{PreferredTransports: []a2a.TransportProtocol{binding}}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Destroy() })
	return c
}

// start sends a message that starts skill with text.
func start(skill, text string) *a2a.SendMessageRequest {
	m := a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart(text))
	m.Metadata = map[string]any{"skill": skill}
	return &a2a.SendMessageRequest{Message: m}
}

// reply sends text on task.
func reply(task *a2a.Task, text string) *a2a.SendMessageRequest {
	m := a2a.NewMessageForTask(a2a.MessageRoleUser, task, a2a.NewTextPart(text))
	return &a2a.SendMessageRequest{Message: m}
}

// send sends req and wants a task back.
func send(t *testing.T, c *a2aclient.Client, req *a2a.SendMessageRequest) *a2a.Task {
	t.Helper()
	res, err := c.SendMessage(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	task, ok := res.(*a2a.Task)
	if !ok {
		t.Fatalf("result %T, want a task", res)
	}
	return task
}

// checkQuestion wants task input-required with the chooser's question:
// its text, context and options (a data part), the question id in the
// message's metadata. It returns the question id.
func checkQuestion(t *testing.T, task *a2a.Task) string {
	t.Helper()
	if task.Status.State != a2a.TaskStateInputRequired || task.Status.Message == nil {
		t.Fatalf("task %s: %s, want input-required with a message", task.ID, task.Status.State)
	}
	m := task.Status.Message
	if m.Role != a2a.MessageRoleAgent || len(m.Parts) != 3 {
		t.Fatalf("question message: role %s, %d parts, want the agent's, 3 parts", m.Role, len(m.Parts))
	}
	if got := m.Parts[0].Text(); got != "Rewrite A or B?" {
		t.Errorf("question text %q", got)
	}
	if got := m.Parts[1].Text(); got != "Same signature." {
		t.Errorf("context text %q", got)
	}
	data, ok := m.Parts[2].Data().(map[string]any)
	if !ok || !reflect.DeepEqual(data["options"], []any{"A", "B"}) || data["kind"] != "decision" {
		t.Errorf("options part %#v, want options [A B], kind decision", m.Parts[2].Data())
	}
	qid, _ := m.Metadata["question_id"].(string)
	if qid == "" || data["question_id"] != qid {
		t.Errorf("question id: metadata %v, data part %v", m.Metadata["question_id"], data["question_id"])
	}
	return qid
}

var bindings = []a2a.TransportProtocol{a2a.TransportProtocolJSONRPC, a2a.TransportProtocolHTTPJSON}

// Over both bindings, with a2a-go's own client: a message with
// metadata.skill starts the sub-agent, its question comes back as
// input-required, a message on the task answers it through the router
// as the caller's principal, and the task completes with the output. The
// task is the thread, the caller's own.
func TestAskAnswerComplete(t *testing.T) {
	e := newEnv(t)
	for _, b := range bindings {
		t.Run(string(b), func(t *testing.T) {
			c := e.connect(t, "token-a", b)
			task := send(t, c, start("chooser", "pick one"))
			qid := checkQuestion(t, task)
			rec, err := e.sys.Client.Status(t.Context(), string(task.ID))
			if err != nil || rec.ThreadID != string(task.ID) || rec.Principal != "team-a" {
				t.Fatalf("the task's thread: %+v %v, want thread %s of team-a", rec, err, task.ID)
			}
			if rec.Request == nil || string(rec.Request.Input) != `{"task":"pick one"}` {
				t.Errorf("the sub-agent's input: %+v", rec.Request)
			}

			done := send(t, c, reply(task, "B"))
			if done.ID != task.ID || done.ContextID != task.ContextID {
				t.Errorf("ids changed across rounds: %s/%s, then %s/%s", task.ID, task.ContextID, done.ID, done.ContextID)
			}
			if done.Status.State != a2a.TaskStateCompleted || len(done.Artifacts) != 1 || len(done.Artifacts[0].Parts) != 1 {
				t.Fatalf("after the answer: %s with %d artifacts, want completed with the output", done.Status.State, len(done.Artifacts))
			}
			if out := done.Artifacts[0].Parts[0].Data(); !reflect.DeepEqual(out, map[string]any{"chose": "B"}) {
				t.Errorf("output %#v, want {chose: B}", out)
			}
			q, err := e.sys.Client.Question(t.Context(), qid)
			if err != nil || q.AnsweredBy != "a2a:team-a" || q.Answer != "B" {
				t.Errorf("question %s: answered %q by %q (%v), want B by a2a:team-a", qid, q.Answer, q.AnsweredBy, err)
			}
			got, err := c.GetTask(t.Context(), &a2a.GetTaskRequest{ID: task.ID})
			if err != nil || got.Status.State != a2a.TaskStateCompleted {
				t.Errorf("tasks/get: %v %v, want completed", got, err)
			}
		})
	}
	for _, line := range []string{"POST /a2a", "POST /a2a/message:send"} {
		if !e.saw(line) {
			t.Errorf("no %s: the client did not speak both bindings", line)
		}
	}
}

// A data part is the sub-agent's input, with the text as its task; a run
// that asks nothing completes at once, and one that writes no output
// completes with an empty object.
func TestInputAndOutput(t *testing.T) {
	e := newEnv(t)
	c := e.connect(t, "token-a", a2a.TransportProtocolJSONRPC)
	m := a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart("go"), a2a.NewDataPart(map[string]any{"n": 1.0, "tags": []any{"x"}}))
	m.Metadata = map[string]any{"skill": "echo"}
	done := send(t, c, &a2a.SendMessageRequest{Message: m})
	want := map[string]any{"n": 1.0, "tags": []any{"x"}, "task": "go"}
	if done.Status.State != a2a.TaskStateCompleted || len(done.Artifacts) != 1 || !reflect.DeepEqual(done.Artifacts[0].Parts[0].Data(), want) {
		t.Errorf("echo: %s %+v, want completed with %v", done.Status.State, done.Artifacts, want)
	}
	done = send(t, c, start("silent", "anything"))
	if done.Status.State != a2a.TaskStateCompleted || len(done.Artifacts) != 1 || !reflect.DeepEqual(done.Artifacts[0].Parts[0].Data(), map[string]any{}) {
		t.Errorf("silent: %s %+v, want completed with {}", done.Status.State, done.Artifacts)
	}
}

// An approval is answered with approve or reject, as text or as the
// data part's decision; anything else is refused and leaves it waiting.
func TestApproval(t *testing.T) {
	e := newEnv(t)
	c := e.connect(t, "token-a", a2a.TransportProtocolHTTPJSON)
	task := send(t, c, start("approver", "ship it"))
	if task.Status.State != a2a.TaskStateInputRequired || task.Status.Message.Metadata["kind"] != "approval" {
		t.Fatalf("task %s: %+v, want input-required for an approval", task.ID, task.Status)
	}
	qid, _ := task.Status.Message.Metadata["question_id"].(string)
	if _, err := c.SendMessage(t.Context(), reply(task, "maybe")); !errors.Is(err, a2a.ErrInvalidParams) {
		t.Errorf("an approval answered maybe: %v, want invalid params", err)
	}
	m := a2a.NewMessageForTask(a2a.MessageRoleUser, task, a2a.NewDataPart(map[string]any{"decision": "approve", "comment": "go ahead"}))
	m.Metadata = map[string]any{"question_id": qid}
	done := send(t, c, &a2a.SendMessageRequest{Message: m})
	if done.Status.State != a2a.TaskStateCompleted {
		t.Fatalf("after approving: %s, want completed", done.Status.State)
	}
	q, err := e.sys.Client.Question(t.Context(), qid)
	if err != nil || q.Decision != "approve" || q.AnsweredBy != "a2a:team-a" {
		t.Errorf("question %s: %+v %v, want approved by a2a:team-a", qid, q, err)
	}
	if out := fmt.Sprint(done.Artifacts[0].Parts[0].Data()); !strings.Contains(out, "go ahead") {
		t.Errorf("the next round's input (its output) %s lacks the comment", out)
	}
}

// A task is read from Agora's records, not from the process that started
// it: another server (a restart) reads the waiting task with its
// question, takes the answer on it and completes it.
func TestTaskOutlivesTheServer(t *testing.T) {
	e := newEnv(t)
	task := send(t, e.connect(t, "token-a", a2a.TransportProtocolJSONRPC), start("chooser", "pick one"))
	checkQuestion(t, task)
	c := connectTo(t, e.serve(t), "token-a", a2a.TransportProtocolHTTPJSON)
	got, err := c.GetTask(t.Context(), &a2a.GetTaskRequest{ID: task.ID})
	if err != nil {
		t.Fatal(err)
	}
	checkQuestion(t, got)
	if got.ContextID != task.ContextID {
		t.Errorf("context id %s, was %s", got.ContextID, task.ContextID)
	}
	if len(got.History) != 2 || got.History[0].Role != a2a.MessageRoleUser || got.History[0].Parts[0].Text() != "pick one" ||
		got.History[1].Role != a2a.MessageRoleAgent || got.History[1].Parts[0].Text() != "Rewrite A or B?" {
		t.Errorf("history on the new server %+v, want the input, then the question", got.History)
	}
	done := send(t, c, reply(got, "A"))
	if done.Status.State != a2a.TaskStateCompleted || len(done.Artifacts) != 1 ||
		!reflect.DeepEqual(done.Artifacts[0].Parts[0].Data(), map[string]any{"chose": "A"}) {
		t.Fatalf("after the answer on the new server: %+v", done)
	}
}

// SubscribeToTask on a server that never saw the task (a restart) streams
// it from Agora's records and the lifecycle stream: the task, then its
// events to completed with the output; an ended task is
// UnsupportedOperation, another principal's not found. tasks/get has the
// whole history there: the input, the question, the answer.
func TestSubscribeAfterRestart(t *testing.T) {
	e := newEnv(t)
	later := e.serve(t)
	for _, b := range bindings {
		t.Run(string(b), func(t *testing.T) {
			dir := t.TempDir()
			if err := os.Chmod(dir, 0o755); err != nil { // the run may be another user
				t.Fatal(err)
			}
			gate := filepath.Join(dir, "go")
			name := "gated-" + strings.ToLower(strings.ReplaceAll(string(b), "+", "-"))
			d := subagent.Definition{Name: name, Runtime: subagent.RuntimeExec, Timeout: "1m", Sandbox: subagent.Sandbox{ReadPaths: []string{dir}},
				Command: []string{"sh", "-c", fmt.Sprintf(`while [ ! -e %q ]; do sleep 0.05; done; echo '{"ok":true}' > "$AGORA_OUTPUT_FILE"`, gate)}}
			if _, err := e.sys.Client.ApplySubagent(t.Context(), d); err != nil {
				t.Fatal(err)
			}
			req := start(name, "go")
			req.Config = &a2a.SendMessageConfig{ReturnImmediately: true}
			task := send(t, e.connect(t, "token-a", b), req)

			c := connectTo(t, later, "token-a", b)
			var states []a2a.TaskState
			var output any
			for ev, err := range c.SubscribeToTask(t.Context(), &a2a.SubscribeToTaskRequest{ID: task.ID}) {
				if err != nil {
					t.Fatal(err)
				}
				switch v := ev.(type) {
				case *a2a.Task:
					if v.ID != task.ID {
						t.Fatalf("streamed task %s, want %s", v.ID, task.ID)
					}
					if err := os.WriteFile(gate, nil, 0o644); err != nil {
						t.Fatal(err)
					}
				case *a2a.TaskArtifactUpdateEvent:
					output = v.Artifact.Parts[0].Data()
				case *a2a.TaskStatusUpdateEvent:
					states = append(states, v.Status.State)
				}
			}
			if len(states) == 0 || states[len(states)-1] != a2a.TaskStateCompleted || !reflect.DeepEqual(output, map[string]any{"ok": true}) {
				t.Fatalf("subscribed: states %v, output %v; want to completed with {ok: true}", states, output)
			}
			if _, err := collect(c.SubscribeToTask(t.Context(), &a2a.SubscribeToTaskRequest{ID: task.ID})); !errors.Is(err, a2a.ErrUnsupportedOperation) {
				t.Errorf("subscribing to an ended task: %v, want unsupported operation", err)
			}
			other := connectTo(t, later, "token-b", b)
			if _, err := collect(other.SubscribeToTask(t.Context(), &a2a.SubscribeToTaskRequest{ID: task.ID})); !errors.Is(err, a2a.ErrTaskNotFound) {
				t.Errorf("team-b subscribing to team-a's task: %v, want task not found", err)
			}
		})
	}

	// The whole history of an answered task, from the records alone.
	task := send(t, e.connect(t, "token-a", a2a.TransportProtocolJSONRPC), start("chooser", "pick one"))
	send(t, e.connect(t, "token-a", a2a.TransportProtocolJSONRPC), reply(task, "B"))
	got, err := connectTo(t, later, "token-a", a2a.TransportProtocolHTTPJSON).GetTask(t.Context(), &a2a.GetTaskRequest{ID: task.ID})
	if err != nil {
		t.Fatal(err)
	}
	var texts []string
	for _, m := range got.History {
		texts = append(texts, string(m.Role)+": "+m.Parts[0].Text())
	}
	if want := []string{"ROLE_USER: pick one", "ROLE_AGENT: Rewrite A or B?", "ROLE_USER: B"}; !reflect.DeepEqual(texts, want) {
		t.Errorf("history %q, want %q", texts, want)
	}
	one := 1
	got, err = connectTo(t, later, "token-a", a2a.TransportProtocolJSONRPC).GetTask(t.Context(), &a2a.GetTaskRequest{ID: task.ID, HistoryLength: &one})
	if err != nil || len(got.History) != 1 || got.History[0].Parts[0].Text() != "B" {
		t.Errorf("historyLength 1: %+v %v, want the answer alone", got, err)
	}
}

// collect reads a stream to its end and returns its events and its error.
func collect(seq iter.Seq2[a2a.Event, error]) ([]a2a.Event, error) {
	var evs []a2a.Event
	for ev, err := range seq {
		if err != nil {
			return evs, err
		}
		evs = append(evs, ev)
	}
	return evs, nil
}

// Each sub-agent is an agent of its own too: its card at
// /a2a/agents/<name> lists it alone, and a message sent there starts it
// with no metadata at all, over both bindings; an unknown one has no card.
func TestCardPerSubagent(t *testing.T) {
	e := newEnv(t)
	card, err := agentcard.NewResolver(http.DefaultClient).Resolve(t.Context(), e.url+"/a2a/agents/chooser")
	if err != nil {
		t.Fatal(err)
	}
	if len(card.Skills) != 1 || card.Skills[0].ID != "chooser" || card.SupportedInterfaces[0].URL != e.url+"/a2a/agents/chooser" {
		t.Fatalf("chooser's card: skills %+v at %+v", card.Skills, card.SupportedInterfaces)
	}
	for _, b := range bindings {
		t.Run(string(b), func(t *testing.T) {
			c := connectTo(t, e.url+"/a2a/agents/chooser", "token-a", b)
			m := a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart("pick one"))
			task := send(t, c, &a2a.SendMessageRequest{Message: m})
			checkQuestion(t, task)
			done := send(t, c, reply(task, "A"))
			if done.Status.State != a2a.TaskStateCompleted {
				t.Fatalf("after the answer: %s, want completed", done.Status.State)
			}
			other := a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart("hi"))
			other.Metadata = map[string]any{"skill": "echo"}
			if _, err := c.SendMessage(t.Context(), &a2a.SendMessageRequest{Message: other}); !errors.Is(err, a2a.ErrInvalidParams) {
				t.Errorf("another skill at chooser's endpoint: %v, want invalid params", err)
			}
		})
	}
	resp, err := http.Get(e.url + "/a2a/agents/nobody/.well-known/agent-card.json")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("an unknown sub-agent's card: %s, want 404", resp.Status)
	}
}

// SendStreamingMessage starts a thread too: the stream ends on
// input-required with the question, and an answer streams to completed.
func TestStreaming(t *testing.T) {
	e := newEnv(t)
	for _, b := range bindings {
		t.Run(string(b), func(t *testing.T) {
			c := e.connect(t, "token-a", b)
			last := func(req *a2a.SendMessageRequest) (*a2a.TaskStatusUpdateEvent, *a2a.Task) {
				var st *a2a.TaskStatusUpdateEvent
				var first *a2a.Task
				for ev, err := range c.SendStreamingMessage(t.Context(), req) {
					if err != nil {
						t.Fatal(err)
					}
					switch v := ev.(type) {
					case *a2a.Task:
						first = v
					case *a2a.TaskStatusUpdateEvent:
						st = v
					}
				}
				if st == nil {
					t.Fatal("no status update streamed")
				}
				return st, first
			}
			st, task := last(start("chooser", "pick one"))
			if task == nil {
				t.Fatal("the stream did not start with the task")
			}
			checkQuestion(t, &a2a.Task{ID: st.TaskID, Status: st.Status})
			st, _ = last(reply(task, "A"))
			if st.Status.State != a2a.TaskStateCompleted {
				t.Fatalf("after the answer: %s, want completed", st.Status.State)
			}
		})
	}
}

// tasks/cancel cancels the thread as its principal; the task ends
// canceled, and so does the thread.
func TestCancel(t *testing.T) {
	e := newEnv(t)
	for _, b := range bindings {
		t.Run(string(b), func(t *testing.T) {
			c := e.connect(t, "token-a", b)
			task := send(t, c, start("chooser", "pick one"))
			checkQuestion(t, task)
			got, err := c.CancelTask(t.Context(), &a2a.CancelTaskRequest{ID: task.ID, Metadata: map[string]any{"reason": "not needed"}})
			if err != nil || got.Status.State != a2a.TaskStateCanceled {
				t.Fatalf("tasks/cancel: %+v %v, want canceled", got, err)
			}
			testkit.Eventually(t, 30*time.Second, "the thread ends cancelled", func() bool {
				th, err := e.sys.Client.Thread(t.Context(), string(task.ID))
				return err == nil && th.Status == lifecycle.KindCancelled
			})
			got, err = c.GetTask(t.Context(), &a2a.GetTaskRequest{ID: task.ID})
			if err != nil || got.Status.State != a2a.TaskStateCanceled {
				t.Fatalf("tasks/get after the cancel: %+v %v, want canceled", got, err)
			}
			if _, err := c.CancelTask(t.Context(), &a2a.CancelTaskRequest{ID: task.ID}); err != nil {
				t.Errorf("a second cancel: %v, want the canceled task", err)
			}
		})
	}
}

// A running task cancelled while a2a-go still follows it ends canceled,
// and so does its thread (the worker stops the run).
func TestCancelWhileRunning(t *testing.T) {
	e := newEnv(t)
	c := e.connect(t, "token-a", a2a.TransportProtocolJSONRPC)
	req := start("sleeper", "wait")
	req.Config = &a2a.SendMessageConfig{ReturnImmediately: true}
	task := send(t, c, req)
	testkit.Eventually(t, 30*time.Second, "the task is working", func() bool {
		got, err := c.GetTask(t.Context(), &a2a.GetTaskRequest{ID: task.ID})
		return err == nil && got.Status.State == a2a.TaskStateWorking
	})
	got, err := c.CancelTask(t.Context(), &a2a.CancelTaskRequest{ID: task.ID})
	if err != nil || got.Status.State != a2a.TaskStateCanceled {
		t.Fatalf("tasks/cancel of a running task: %+v %v, want canceled", got, err)
	}
	testkit.Eventually(t, 30*time.Second, "the thread ends cancelled", func() bool {
		th, err := e.sys.Client.Thread(t.Context(), string(task.ID))
		return err == nil && th.Status == lifecycle.KindCancelled
	})
	if got, err := c.GetTask(t.Context(), &a2a.GetTaskRequest{ID: task.ID}); err != nil || got.Status.State != a2a.TaskStateCanceled {
		t.Errorf("tasks/get after the run stopped: %+v %v, want canceled", got, err)
	}
}

// A task is its principal's: another principal's get, cancel and message
// on it are the protocol's task-not-found, as for an id that does not
// exist. A bad skill, a data part that is not an object, two data parts
// and a file part are the protocol's errors, and start nothing.
func TestRefusals(t *testing.T) {
	e := newEnv(t)
	for _, b := range bindings {
		t.Run(string(b), func(t *testing.T) {
			a, other := e.connect(t, "token-a", b), e.connect(t, "token-b", b)
			task := send(t, a, start("chooser", "pick one"))
			checkQuestion(t, task)
			for _, id := range []a2a.TaskID{task.ID, "no-such-task"} {
				if _, err := other.GetTask(t.Context(), &a2a.GetTaskRequest{ID: id}); !errors.Is(err, a2a.ErrTaskNotFound) {
					t.Errorf("team-b tasks/get %s: %v, want task not found", id, err)
				}
				if _, err := other.CancelTask(t.Context(), &a2a.CancelTaskRequest{ID: id}); !errors.Is(err, a2a.ErrTaskNotFound) {
					t.Errorf("team-b tasks/cancel %s: %v, want task not found", id, err)
				}
			}
			if _, err := other.SendMessage(t.Context(), reply(task, "A")); !errors.Is(err, a2a.ErrTaskNotFound) {
				t.Errorf("team-b's answer on team-a's task: %v, want task not found", err)
			}
			if q, err := e.sys.Client.Question(t.Context(), checkQuestion(t, task)); err != nil || q.Status != "asked" {
				t.Errorf("the question after team-b's tries: %s %v, want asked", q.Status, err)
			}
			if _, err := a.SendMessage(t.Context(), reply(task, "C")); !errors.Is(err, a2a.ErrInvalidParams) {
				t.Errorf("an answer that is not an option: %v, want invalid params", err)
			}
			if got, err := a.GetTask(t.Context(), &a2a.GetTaskRequest{ID: task.ID}); err != nil || got.Status.State != a2a.TaskStateInputRequired {
				t.Errorf("the task after a refused answer: %+v %v, want input-required still", got, err)
			}

			if _, err := a.SendMessage(t.Context(), start("no-such-agent", "hi")); !errors.Is(err, a2a.ErrInvalidParams) {
				t.Errorf("unknown skill: %v, want invalid params", err)
			}
			if _, err := a.SendMessage(t.Context(), start("", "hi")); !errors.Is(err, a2a.ErrInvalidParams) {
				t.Errorf("no skill among several: %v, want invalid params", err)
			}
			for name, parts := range map[string][]*a2a.Part{
				"a data part that is not an object": {a2a.NewDataPart([]any{1.0, 2.0})},
				"two data parts":                    {a2a.NewDataPart(map[string]any{"a": 1.0}), a2a.NewDataPart(map[string]any{"b": 2.0})},
			} {
				m := a2a.NewMessage(a2a.MessageRoleUser, parts...)
				m.Metadata = map[string]any{"skill": "echo"}
				if _, err := a.SendMessage(t.Context(), &a2a.SendMessageRequest{Message: m}); !errors.Is(err, a2a.ErrInvalidParams) {
					t.Errorf("%s: %v, want invalid params", name, err)
				}
			}
			file := a2a.NewMessage(a2a.MessageRoleUser, a2a.NewRawPart([]byte("binary")))
			file.Metadata = map[string]any{"skill": "echo"}
			if _, err := a.SendMessage(t.Context(), &a2a.SendMessageRequest{Message: file}); !errors.Is(err, a2a.ErrUnsupportedContentType) {
				t.Errorf("a file part: %v, want content type not supported", err)
			}
		})
	}
}

// The agent card lists every sub-agent as a skill, both bindings at
// /a2a, streaming, and the bearer scheme; /a2a itself wants a token.
func TestAgentCard(t *testing.T) {
	e := newEnv(t)
	card, err := agentcard.NewResolver(http.DefaultClient).Resolve(t.Context(), e.url)
	if err != nil {
		t.Fatal(err)
	}
	var skills []string
	for _, s := range card.Skills {
		skills = append(skills, s.ID)
	}
	if want := []string{"approver", "chooser", "echo", "silent", "sleeper"}; !reflect.DeepEqual(skills, want) {
		t.Errorf("skills %v, want %v", skills, want)
	}
	if !card.Capabilities.Streaming {
		t.Error("the card does not announce streaming")
	}
	if len(card.SupportedInterfaces) != 2 || card.SupportedInterfaces[0].URL != e.url+"/a2a" || card.SupportedInterfaces[1].URL != e.url+"/a2a" {
		t.Errorf("interfaces %+v, want JSON-RPC and HTTP+JSON at %s/a2a", card.SupportedInterfaces, e.url)
	}
	if s, ok := card.SecuritySchemes["bearerAuth"].(a2a.HTTPAuthSecurityScheme); !ok || s.Scheme != "Bearer" || len(card.SecurityRequirements) != 1 {
		t.Errorf("security %+v %+v, want the bearer scheme required", card.SecuritySchemes, card.SecurityRequirements)
	}
	for _, path := range []string{"/a2a", "/a2a/tasks/x"} {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, e.url+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("POST %s without a token: %s, want 401", path, resp.Status)
		}
	}
}

// ListTasks lists the caller's tasks only, newest first, filtered by
// state and context and paged; artifacts only when asked for. Over both
// bindings.
func TestListTasks(t *testing.T) {
	e := newEnv(t)
	a := e.connect(t, "token-a", a2a.TransportProtocolJSONRPC)
	var mine []a2a.TaskID
	for _, req := range []*a2a.SendMessageRequest{start("echo", "one"), start("chooser", "pick one"), start("echo", "three")} {
		mine = append(mine, send(t, a, req).ID)
	}
	slices.Reverse(mine)
	theirs := send(t, e.connect(t, "token-b", a2a.TransportProtocolJSONRPC), start("echo", "theirs")).ID
	ids := func(ts []*a2a.Task) []a2a.TaskID {
		var out []a2a.TaskID
		for _, t := range ts {
			out = append(out, t.ID)
		}
		return out
	}
	for _, b := range bindings {
		t.Run(string(b), func(t *testing.T) {
			c := e.connect(t, "token-a", b)
			all, err := c.ListTasks(t.Context(), &a2a.ListTasksRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if got := ids(all.Tasks); !reflect.DeepEqual(got, mine) || all.TotalSize != 3 || all.NextPageToken != "" {
				t.Errorf("team-a's tasks %v (total %d, next %q), want %v", got, all.TotalSize, all.NextPageToken, mine)
			}
			for _, task := range all.Tasks {
				if len(task.Artifacts) != 0 {
					t.Errorf("task %s listed with artifacts it was not asked for", task.ID)
				}
			}
			waiting, err := c.ListTasks(t.Context(), &a2a.ListTasksRequest{Status: a2a.TaskStateInputRequired})
			if err != nil || !reflect.DeepEqual(ids(waiting.Tasks), mine[1:2]) {
				t.Errorf("input-required: %v %v, want %v", ids(waiting.Tasks), err, mine[1:2])
			}
			page, err := c.ListTasks(t.Context(), &a2a.ListTasksRequest{PageSize: 2, IncludeArtifacts: true})
			if err != nil || !reflect.DeepEqual(ids(page.Tasks), mine[:2]) || page.NextPageToken == "" || len(page.Tasks[0].Artifacts) != 1 {
				t.Fatalf("first page: %v (next %q) %v, want %v with the artifacts", ids(page.Tasks), page.NextPageToken, err, mine[:2])
			}
			page, err = c.ListTasks(t.Context(), &a2a.ListTasksRequest{PageSize: 2, PageToken: page.NextPageToken})
			if err != nil || !reflect.DeepEqual(ids(page.Tasks), mine[2:]) || page.NextPageToken != "" {
				t.Errorf("second page: %v (next %q) %v, want %v", ids(page.Tasks), page.NextPageToken, err, mine[2:])
			}
			other, err := e.connect(t, "token-b", b).ListTasks(t.Context(), &a2a.ListTasksRequest{})
			if err != nil || !reflect.DeepEqual(ids(other.Tasks), []a2a.TaskID{theirs}) {
				t.Errorf("team-b's tasks %v %v, want only %s", ids(other.Tasks), err, theirs)
			}
		})
	}
}
