// Command a2a-client drives an Agora sub-agent with a2a-go's own client,
// as any A2A client would (docs/a2a.md): it reads the agent card, sends a
// task, prints the question the task asks (input-required), answers it on
// the same task and prints the completed task's output. With
// AGORA_A2A_PUSH_SECRET set (the server's), it also listens for the push
// notifications of the task on 127.0.0.1, verifies each signature and
// prints what it was told.
//
//	go run ./examples/a2a-client -url http://127.0.0.1:8080 -skill demo
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2aclient"
	"github.com/a2aproject/a2a-go/v2/a2aclient/agentcard"

	"github.com/agora-dispatch/agora/answerers/webhook"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := run(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "a2a-client:", err)
		os.Exit(1)
	}
}

type bearer struct{ token string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	if b.token != "" {
		r = r.Clone(r.Context())
		r.Header.Set("Authorization", "Bearer "+b.token)
	}
	return http.DefaultTransport.RoundTrip(r)
}

func run(ctx context.Context) error {
	url := flag.String("url", "http://127.0.0.1:8080", "where Agora's A2A agent card is served")
	skill := flag.String("skill", "demo", "the sub-agent: a skill id of the card")
	task := flag.String("task", "rename the config loader", "what to ask the sub-agent")
	answer := flag.String("answer", "", "the answer to its question (default: its first option)")
	binding := flag.String("binding", string(a2a.TransportProtocolJSONRPC), "JSONRPC or HTTP+JSON")
	wait := flag.Bool("wait", false, "do not answer: wait for the question to be answered through another door (the inbox, Slack, the CLI)")
	flag.Parse()
	hc := &http.Client{Transport: bearer{os.Getenv("AGORA_A2A_TOKEN")}, Timeout: 2 * time.Minute}

	card, err := agentcard.NewResolver(hc).Resolve(ctx, *url)
	if err != nil {
		return fmt.Errorf("agent card: %w", err)
	}
	fmt.Printf("card: %s, %d skills, streaming %v, pushNotifications %v\n", card.Name, len(card.Skills), card.Capabilities.Streaming, card.Capabilities.PushNotifications)
	c, err := a2aclient.NewFromCard(ctx, card, a2aclient.WithJSONRPCTransport(hc), a2aclient.WithRESTTransport(hc),
		a2aclient.WithConfig(a2aclient.Config{PreferredTransports: []a2a.TransportProtocol{a2a.TransportProtocol(*binding)}}))
	if err != nil {
		return err
	}
	defer c.Destroy()

	m := a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart(*task))
	m.Metadata = map[string]any{"skill": *skill}
	req := &a2a.SendMessageRequest{Message: m}
	var rcv *receiver
	if secret := os.Getenv("AGORA_A2A_PUSH_SECRET"); secret != "" && card.Capabilities.PushNotifications {
		if rcv, err = listen(secret); err != nil {
			return err
		}
		req.Config = &a2a.SendMessageConfig{PushConfig: &a2a.PushConfig{URL: rcv.url, Token: "a2a-client"}}
		fmt.Println("push: listening at", rcv.url)
	}

	fmt.Printf("send: skill %s, %q\n", *skill, *task)
	t, err := sendTask(ctx, c, req)
	if err != nil {
		return err
	}
	fmt.Printf("task %s: %s\n", t.ID, t.Status.State)
	if t.Status.State != a2a.TaskStateInputRequired {
		return fmt.Errorf("task %s is %s, not input-required", t.ID, t.Status.State)
	}
	q := t.Status.Message
	var options []any
	for _, p := range q.Parts {
		if d, ok := p.Data().(map[string]any); ok {
			options, _ = d["options"].([]any)
		}
	}
	fmt.Printf("  question %v: %q, options %v\n", q.Metadata["question_id"], q.Parts[0].Text(), options)
	if *wait {
		fmt.Println("waiting for an answer through another door")
		if t, err = awaitEnd(ctx, c, t.ID); err != nil {
			return err
		}
	} else {
		a := *answer
		if a == "" && len(options) > 0 {
			a, _ = options[0].(string)
		}
		fmt.Printf("answer: %q\n", a)
		t, err = sendTask(ctx, c, &a2a.SendMessageRequest{Message: a2a.NewMessageForTask(a2a.MessageRoleUser, t, a2a.NewTextPart(a))})
		if err != nil {
			return err
		}
	}
	fmt.Printf("task %s: %s\n", t.ID, t.Status.State)
	for _, art := range t.Artifacts {
		out, _ := json.Marshal(art.Parts[0].Data())
		fmt.Printf("  artifact %s: %s\n", art.Name, out)
	}
	if t.Status.State != a2a.TaskStateCompleted {
		return fmt.Errorf("task %s ended %s", t.ID, t.Status.State)
	}
	if rcv != nil {
		return rcv.await(ctx, a2a.TaskStateCompleted)
	}
	return nil
}

// awaitEnd reads task id every second until it has left input-required
// and working: answered elsewhere and run to its end.
func awaitEnd(ctx context.Context, c *a2aclient.Client, id a2a.TaskID) (*a2a.Task, error) {
	for {
		t, err := c.GetTask(ctx, &a2a.GetTaskRequest{ID: id})
		if err != nil {
			return nil, err
		}
		switch t.Status.State {
		case a2a.TaskStateInputRequired, a2a.TaskStateWorking, a2a.TaskStateSubmitted:
		default:
			return t, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

func sendTask(ctx context.Context, c *a2aclient.Client, req *a2a.SendMessageRequest) (*a2a.Task, error) {
	res, err := c.SendMessage(ctx, req)
	if err != nil {
		return nil, err
	}
	t, ok := res.(*a2a.Task)
	if !ok {
		return nil, fmt.Errorf("the agent answered %T, not a task", res)
	}
	return t, nil
}

// receiver takes push notifications on loopback, each signature verified.
type receiver struct {
	url  string
	mu   sync.Mutex
	seen map[string]bool
	done chan a2a.TaskState
}

func listen(secret string) (*receiver, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &receiver{url: "http://" + ln.Addr().String() + "/push", seen: map[string]bool{}, done: make(chan a2a.TaskState, 16)}
	go func() {
		_ = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			body, _ := io.ReadAll(req.Body)
			if err := webhook.Verify(secret, req.Header.Get(webhook.SignatureHeader), body, time.Now(), 5*time.Minute); err != nil {
				fmt.Println("push: refused:", err)
				http.Error(w, err.Error(), http.StatusUnauthorized)
				return
			}
			id := req.Header.Get(webhook.EventIDHeader)
			r.mu.Lock()
			repeat := r.seen[id]
			r.seen[id] = true
			r.mu.Unlock()
			if repeat {
				return
			}
			var sr a2a.StreamResponse
			if err := json.Unmarshal(body, &sr); err != nil {
				fmt.Println("push: undecodable:", err)
				return
			}
			var state a2a.TaskState
			switch v := sr.Event.(type) {
			case *a2a.Task:
				state = v.Status.State
			case *a2a.TaskStatusUpdateEvent:
				state = v.Status.State
			}
			fmt.Printf("push: %-26s %T, event %s, signature verified, token %q\n", state, sr.Event, id, req.Header.Get("A2A-Notification-Token"))
			r.done <- state
		}))
	}()
	return r, nil
}

// await waits for a notification of state.
func (r *receiver) await(ctx context.Context, state a2a.TaskState) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		select {
		case s := <-r.done:
			if s == state {
				return nil
			}
		case <-ctx.Done():
			return errors.New("no push notification of " + string(state))
		}
	}
}
