package a2aserver_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2aclient/agentcard"

	"github.com/agora-dispatch/agora/answerers/inbox"
	"github.com/agora-dispatch/agora/answerers/webhook"
	"github.com/agora-dispatch/agora/harness/systemtest"
	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/services/a2aserver"
)

const pushSecret = "push-secret-of-16+bytes"

// withPush offers push notifications; test receivers listen on loopback,
// so private addresses are allowed.
func withPush(c *a2aserver.Config) {
	c.PushSecret, c.PushAllowPrivate, c.PushBackoff = pushSecret, true, 20*time.Millisecond
}

// withStrictPush offers push notifications to public addresses only.
func withStrictPush(c *a2aserver.Config) { c.PushSecret = pushSecret }

// receiver is a push notification endpoint that verifies every POST's
// signature as docs/webhook.md tells a receiver to, and takes each event
// id once.
type receiver struct {
	url string
	mu  sync.Mutex
	// events are the events taken, in order; tokens their
	// A2A-Notification-Token.
	events []a2a.Event
	tokens []string
	taken  map[string]int // event id → 2xx answers
	bad    []string       // POSTs that failed verification
	fail   int            // answer 503 to this many more POSTs
	failed int            // POSTs answered 503
}

func newReceiver(t *testing.T) *receiver {
	t.Helper()
	r := &receiver{taken: map[string]int{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		defer r.mu.Unlock()
		if err := webhook.Verify(pushSecret, req.Header.Get(webhook.SignatureHeader), body, time.Now(), 5*time.Minute); err != nil {
			r.bad = append(r.bad, err.Error())
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		if r.fail > 0 {
			r.fail--
			r.failed++
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		id := req.Header.Get(webhook.EventIDHeader)
		r.taken[id]++
		if r.taken[id] > 1 {
			return // a repeat: taken once already
		}
		var sr a2a.StreamResponse
		if err := json.Unmarshal(body, &sr); err != nil {
			r.bad = append(r.bad, "undecodable: "+err.Error())
			return
		}
		r.events = append(r.events, sr.Event)
		r.tokens = append(r.tokens, req.Header.Get("A2A-Notification-Token"))
	}))
	t.Cleanup(srv.Close)
	r.url = srv.URL + "/hook"
	t.Cleanup(func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if len(r.bad) > 0 {
			t.Errorf("push notifications that failed verification: %v", r.bad)
		}
		for id, n := range r.taken {
			if n > 1 {
				t.Errorf("event %s delivered %d times", id, n)
			}
		}
	})
	return r
}

// stateOf is the task state an event pushes.
func stateOf(ev a2a.Event) a2a.TaskState {
	switch v := ev.(type) {
	case *a2a.Task:
		return v.Status.State
	case *a2a.TaskStatusUpdateEvent:
		return v.Status.State
	}
	return ""
}

// states are the states pushed so far.
func (r *receiver) states() []a2a.TaskState {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []a2a.TaskState
	for _, ev := range r.events {
		out = append(out, stateOf(ev))
	}
	return out
}

// wait waits for an event pushing state and returns it.
func (r *receiver) wait(t *testing.T, state a2a.TaskState) a2a.Event {
	t.Helper()
	var got a2a.Event
	testkit.Eventually(t, 30*time.Second, "a push notification of "+string(state), func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, ev := range r.events {
			if stateOf(ev) == state {
				got = ev
				return true
			}
		}
		return false
	})
	return got
}

// startInbox runs the inbox with its development token on the same Agora
// and returns its URL and the token.
func (e *env) startInbox(t *testing.T) (string, string) {
	t.Helper()
	in, err := inbox.New(inbox.Config{DevToken: true}, inbox.Deps{Client: e.sys.Client, Logger: systemtest.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	e.sys.Go("inbox", in.Run)
	select {
	case <-in.Ready():
	case <-t.Context().Done():
		t.Fatal("the inbox never got ready")
	}
	srv := httptest.NewServer(in.Handler())
	t.Cleanup(srv.Close)
	return srv.URL, in.DevToken()
}

// answerInInbox answers question qid through the inbox's JSON API, as a
// person signed in there does.
func answerInInbox(t *testing.T, url, token, qid, answer string) {
	t.Helper()
	body, _ := json.Marshal(map[string]string{"answer": answer})
	var last string
	testkit.Eventually(t, 30*time.Second, "the inbox takes the answer to "+qid, func() bool {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/inbox/api/questions/"+qid+"/answer", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			last = err.Error()
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		last = resp.Status + " " + string(b)
		return resp.StatusCode == http.StatusOK && strings.Contains(string(b), `"status":"accepted"`)
	})
	if t.Failed() {
		t.Logf("the inbox's last answer: %s", last)
	}
}

// A client registers a webhook with its message; the task reaches
// input-required, a person answers in the inbox (not through A2A), and
// the webhook is told of every state of the task, signed as the webhook
// notifier signs, to completed with the output; tasks/get shows the same.
// Over both bindings, streaming and not; a receiver that answers 503 once
// gets the notification again, taken once.
func TestPushAnsweredInTheInbox(t *testing.T) {
	e := newEnv(t)
	url := e.serve(t, withPush)
	inboxURL, inboxToken := e.startInbox(t)
	for _, tc := range []struct {
		binding   a2a.TransportProtocol
		streaming bool
	}{
		{a2a.TransportProtocolJSONRPC, false},
		{a2a.TransportProtocolJSONRPC, true},
		{a2a.TransportProtocolHTTPJSON, false},
		{a2a.TransportProtocolHTTPJSON, true},
	} {
		name := string(tc.binding)
		if tc.streaming {
			name += "/streaming"
		}
		t.Run(name, func(t *testing.T) {
			rcv := newReceiver(t)
			rcv.fail = 1
			c := connectTo(t, url, "token-a", tc.binding)
			req := start("chooser", "pick one")
			req.Config = &a2a.SendMessageConfig{PushConfig: &a2a.PushConfig{URL: rcv.url, Token: "tok-" + name}}
			var task *a2a.Task
			if tc.streaming {
				var first *a2a.Task
				var last *a2a.TaskStatusUpdateEvent
				for ev, err := range c.SendStreamingMessage(t.Context(), req) {
					if err != nil {
						t.Fatal(err)
					}
					switch v := ev.(type) {
					case *a2a.Task:
						first = v
					case *a2a.TaskStatusUpdateEvent:
						last = v
					}
				}
				if first == nil || last == nil {
					t.Fatalf("stream: task %v, last update %v", first, last)
				}
				task = &a2a.Task{ID: first.ID, ContextID: first.ContextID, Status: last.Status}
			} else {
				task = send(t, c, req)
			}
			qid := checkQuestion(t, task)
			asked, ok := rcv.wait(t, a2a.TaskStateInputRequired).(*a2a.TaskStatusUpdateEvent)
			if !ok || asked.TaskID != task.ID || asked.ContextID != task.ContextID {
				t.Fatalf("the input-required notification %#v, want a status update of task %s", asked, task.ID)
			}
			checkQuestion(t, &a2a.Task{ID: asked.TaskID, Status: asked.Status})

			answerInInbox(t, inboxURL, inboxToken, qid, "B")
			done, ok := rcv.wait(t, a2a.TaskStateCompleted).(*a2a.Task)
			if !ok || done.ID != task.ID || len(done.Artifacts) != 1 ||
				!reflect.DeepEqual(done.Artifacts[0].Parts[0].Data(), map[string]any{"chose": "B"}) {
				t.Fatalf("the completed notification %#v, want task %s with the output {chose: B}", done, task.ID)
			}
			want := []a2a.TaskState{a2a.TaskStateSubmitted, a2a.TaskStateWorking, a2a.TaskStateInputRequired,
				a2a.TaskStateWorking, a2a.TaskStateWorking, a2a.TaskStateCompleted}
			if got := rcv.states(); !reflect.DeepEqual(got, want) {
				t.Errorf("states pushed %v, want %v (accepted, started, asked; accepted, started, finished)", got, want)
			}
			rcv.mu.Lock()
			if rcv.failed != 1 || rcv.tokens[0] != "tok-"+name {
				t.Errorf("%d POSTs refused with 503 (want 1, then retried); token %q", rcv.failed, rcv.tokens[0])
			}
			rcv.mu.Unlock()

			got, err := c.GetTask(t.Context(), &a2a.GetTaskRequest{ID: task.ID})
			if err != nil || got.Status.State != a2a.TaskStateCompleted || len(got.Artifacts) != 1 ||
				!reflect.DeepEqual(got.Artifacts[0].Parts[0].Data(), map[string]any{"chose": "B"}) {
				t.Errorf("tasks/get after the inbox's answer: %+v %v, want completed with the output", got, err)
			}
			q, err := e.sys.Client.Question(t.Context(), qid)
			if err != nil || q.AnsweredBy != "dev" {
				t.Errorf("question %s answered by %q (%v), want the inbox's dev", qid, q.AnsweredBy, err)
			}
		})
	}
}

// The push notification config methods: a config registered on a task is
// read, listed and deleted by the task's principal only, and survives the
// server (it lives in JetStream): a server started later lists it and
// delivers to it. A private address, a non-HTTP URL and a server without
// a push secret are the protocol's errors, and the card says so.
func TestPushConfigs(t *testing.T) {
	e := newEnv(t)
	url := e.serve(t, withPush)
	strict := e.serve(t, withStrictPush)
	for _, tc := range []struct {
		url  string
		push bool
	}{{e.url, false}, {url, true}} {
		card, err := agentcard.NewResolver(http.DefaultClient).Resolve(t.Context(), tc.url)
		if err != nil {
			t.Fatal(err)
		}
		if card.Capabilities.PushNotifications != tc.push {
			t.Errorf("card at %s: pushNotifications %v, want %v", tc.url, card.Capabilities.PushNotifications, tc.push)
		}
	}
	for _, b := range bindings {
		t.Run(string(b), func(t *testing.T) {
			rcv := newReceiver(t)
			a, other := connectTo(t, url, "token-a", b), connectTo(t, url, "token-b", b)
			task := send(t, a, start("chooser", "pick one"))
			checkQuestion(t, task)

			if _, err := e.connect(t, "token-a", b).CreateTaskPushConfig(t.Context(), &a2a.PushConfig{TaskID: task.ID, URL: rcv.url}); !errors.Is(err, a2a.ErrPushNotificationNotSupported) {
				t.Errorf("a config on a server without a push secret: %v, want push notification not supported", err)
			}
			s := connectTo(t, strict, "token-a", b)
			for _, u := range []string{rcv.url, "http://10.1.2.3/hook", "http://[::1]:8080/hook", "ftp://example.com/hook"} {
				if _, err := s.CreateTaskPushConfig(t.Context(), &a2a.PushConfig{TaskID: task.ID, URL: u}); !errors.Is(err, a2a.ErrInvalidParams) {
					t.Errorf("a config for %s: %v, want invalid params", u, err)
				}
			}

			saved, err := a.CreateTaskPushConfig(t.Context(), &a2a.PushConfig{TaskID: task.ID, ID: "mine", URL: rcv.url, Token: "t1"})
			if err != nil || saved.ID != "mine" || saved.TaskID != task.ID {
				t.Fatalf("tasks/pushNotificationConfig/set: %+v %v", saved, err)
			}
			got, err := a.GetTaskPushConfig(t.Context(), &a2a.GetTaskPushConfigRequest{TaskID: task.ID, ID: "mine"})
			if err != nil || got.URL != rcv.url || got.Token != "t1" {
				t.Errorf("get: %+v %v", got, err)
			}
			if _, err := other.ListTaskPushConfigs(t.Context(), &a2a.ListTaskPushConfigRequest{TaskID: task.ID}); !errors.Is(err, a2a.ErrTaskNotFound) {
				t.Errorf("team-b lists team-a's configs: %v, want task not found", err)
			}
			if _, err := other.CreateTaskPushConfig(t.Context(), &a2a.PushConfig{TaskID: task.ID, URL: rcv.url}); !errors.Is(err, a2a.ErrTaskNotFound) {
				t.Errorf("team-b registers on team-a's task: %v, want task not found", err)
			}

			later := connectTo(t, e.serve(t, withPush), "token-a", b)
			list, err := later.ListTaskPushConfigs(t.Context(), &a2a.ListTaskPushConfigRequest{TaskID: task.ID})
			if err != nil || len(list) != 1 || list[0].ID != "mine" {
				t.Fatalf("a later server lists %+v %v, want the config mine", list, err)
			}
			send(t, later, reply(task, "A"))
			if done, ok := rcv.wait(t, a2a.TaskStateCompleted).(*a2a.Task); !ok || done.ID != task.ID {
				t.Errorf("completed notification %#v", done)
			}

			if err := later.DeleteTaskPushConfig(t.Context(), &a2a.DeleteTaskPushConfigRequest{TaskID: task.ID, ID: "mine"}); err != nil {
				t.Fatal(err)
			}
			if list, err := a.ListTaskPushConfigs(t.Context(), &a2a.ListTaskPushConfigRequest{TaskID: task.ID}); err != nil || len(list) != 0 {
				t.Errorf("after the delete: %+v %v, want none", list, err)
			}
			if _, err := a.GetTaskPushConfig(t.Context(), &a2a.GetTaskPushConfigRequest{TaskID: task.ID, ID: "mine"}); !errors.Is(err, a2a.ErrInvalidParams) {
				t.Errorf("get of a deleted config: %v, want invalid params", err)
			}
		})
	}
}
