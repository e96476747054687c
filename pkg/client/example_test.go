package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/agora-dispatch/agora/agoratest"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/services/dispatcher"
)

// The examples run against an embedded JetStream server with a dispatcher
// and the sub-agent "planner" (startExampleAgora). No worker runs in them,
// so a dispatch stays queued until it is cancelled.

// startExampleAgora starts what an example runs against: an embedded,
// provisioned JetStream server with the sub-agent "planner" and a
// dispatcher (package agoratest). Stop ends it.
func startExampleAgora() *agoratest.Agora {
	a, err := agoratest.Start(context.Background(), agoratest.Options{
		Dispatcher: &dispatcher.Config{ShutdownTimeout: 5 * time.Second},
		Subagents:  []subagent.Definition{{Name: "planner", Runtime: subagent.RuntimeExec, Command: []string{"./plan"}, MaxRounds: 5}},
	})
	if err != nil {
		panic(err)
	}
	return a
}

// exampleClient starts the example Agora and connects a client to it, as
// ExampleClient_Dispatch shows, with a context that bounds the example to
// 10s; stop cancels it and closes the client and the Agora.
func exampleClient() (c *client.Client, ctx context.Context, stop func()) {
	agora := startExampleAgora()
	c, err := client.Connect(agora.URL)
	if err != nil {
		agora.Stop()
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	return c, ctx, func() { cancel(); c.Close(); agora.Stop() }
}

// cancelledDispatch dispatches to "planner" and cancels its thread as
// "ops", for "not needed": with no worker running, that is how a thread
// ends in the examples.
func cancelledDispatch(ctx context.Context, c *client.Client) (*client.Dispatch, error) {
	d, err := c.Dispatch(ctx, lifecycle.Request{Subagent: "planner"})
	if err != nil {
		return nil, err
	}
	if _, err := c.CancelThread(ctx, d.ThreadID, client.CancelBy("ops", "not needed")); err != nil {
		return nil, err
	}
	return d, nil
}

func ExampleClient_Dispatch() {
	agora := startExampleAgora()
	defer agora.Stop()
	c, err := client.Connect(agora.URL)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()

	ctx := context.Background()
	d, err := c.Dispatch(ctx, lifecycle.Request{
		DispatchID: "release-plan-42", // optional: makes retries safe
		Subagent:   "planner",
		Input:      json.RawMessage(`{"task": "plan the release"}`),
		Labels:     map[string]string{"team": "payments"},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(d.DispatchID, d.Record.Status)
	fmt.Println("thread:", d.ThreadID)
	fmt.Println("timeout:", d.Record.Request.Timeout, "max rounds:", d.Record.Request.MaxRounds)
	// Output:
	// release-plan-42 accepted
	// thread: release-plan-42
	// timeout: 30m0s max rounds: 5
}

func ExampleClient_Dispatch_invalid() {
	c, ctx, stop := exampleClient()
	defer stop()

	_, err := c.Dispatch(ctx, lifecycle.Request{
		Subagent: "planner",
		Input:    json.RawMessage(`["not", "an", "object"]`),
		Timeout:  "soon",
		Env:      map[string]string{"AGORA_API_TOKENS": "x"},
	})
	fmt.Println(errors.Is(err, client.ErrInvalidRequest))
	var p *client.Problem
	if errors.As(err, &p) {
		for _, f := range p.Errors {
			fmt.Printf("%s: %s\n", f.Field, f.Message)
		}
	}
	// Output:
	// true
	// input: must be a JSON object, not an array
	// timeout: "soon" is not a positive duration such as 30m or 1h30m
	// env: "AGORA_API_TOKENS" is reserved: a sub-agent never gets AGORA_* or NATS_* variables
}

func ExampleDispatch_Wait() {
	c, ctx, stop := exampleClient()
	defer stop()

	// No worker runs here: the dispatch is cancelled, so Wait has a
	// terminal event.
	d, err := cancelledDispatch(ctx, c)
	if err != nil {
		fmt.Println(err)
		return
	}
	it, err := d.Wait(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(it.Kind(), "by", it.Data.(*lifecycle.Cancelled).By)
	// Output: cancelled by ops
}

func ExampleClient_Watch() {
	c, ctx, stop := exampleClient()
	defer stop()

	d, _ := c.Dispatch(ctx, lifecycle.Request{Subagent: "planner"})
	_, _ = c.Cancel(ctx, d.DispatchID)
	for it, err := range c.Watch(ctx, client.Filter{DispatchID: d.DispatchID, FromStart: true}) {
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(it.Kind(), it.Event.Type())
		if it.Kind().Terminal() {
			break
		}
	}
	// Output:
	// accepted dev.agora.dispatch.accepted
	// cancelled dev.agora.dispatch.cancelled
}

func ExampleClient_Cancel() {
	c, ctx, stop := exampleClient()
	defer stop()

	d, _ := c.Dispatch(ctx, lifecycle.Request{Subagent: "planner"})
	rec, err := c.Cancel(ctx, d.DispatchID, client.CancelBy("alice", "wrong input"))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(rec.Status, rec.Result.By, rec.Result.Detail)
	again, _ := c.Cancel(ctx, d.DispatchID, client.CancelBy("bob", ""))
	fmt.Println("idempotent:", again.Result.By)
	_, err = c.Cancel(ctx, "no-such-dispatch")
	fmt.Println(errors.Is(err, client.ErrNotFound))
	// Output:
	// cancelled alice wrong input
	// idempotent: alice
	// true
}

func ExampleClient_Status() {
	c, ctx, stop := exampleClient()
	defer stop()

	d, _ := c.Dispatch(ctx, lifecycle.Request{DispatchID: "status-1", Subagent: "planner", Target: "repo/app"})
	rec, err := c.Status(ctx, d.DispatchID)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(rec.DispatchID, rec.Status, rec.Request.Target)
	th, _ := c.Thread(ctx, d.ThreadID)
	fmt.Println(len(th.Rounds), "round, status", th.Status)
	// Output:
	// status-1 accepted repo/app
	// 1 round, status accepted
}

func ExampleClient_Questions() {
	c, ctx, stop := exampleClient()
	defer stop()

	pending, err := c.Questions(ctx, client.QuestionFilter{Status: "asked"})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, q := range pending {
		fmt.Println(q.QuestionID, q.Question, q.Options)
	}
	fmt.Println(len(pending), "pending questions")
	// Output: 0 pending questions
}

// Answer goes to the router (agora.api.answer). This example only shows
// the error handling; it does not run.
func ExampleClient_Answer() {
	c, err := client.Connect("nats://127.0.0.1:4222")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	reply, err := c.Answer(context.Background(), "q-01J0EXAMPLE", lifecycle.Answer{Answer: "B", AnsweredBy: "alice@example.com"})
	switch {
	case errors.Is(err, client.ErrAlreadyAnswered):
		var ae *client.AnswerError
		errors.As(err, &ae)
		fmt.Println("too late: answered by", ae.Reply.AnsweredBy)
	case errors.Is(err, client.ErrInvalidAnswer):
		fmt.Println("refused:", err)
	case errors.Is(err, client.ErrNotFound):
		fmt.Println("no such question")
	case err != nil:
		fmt.Println(err)
	default:
		fmt.Println("accepted at", reply.AnsweredAt)
	}
}

func ExampleClient_Follow() {
	c, ctx, stop := exampleClient()
	defer stop()

	d, err := cancelledDispatch(ctx, c)
	if err != nil {
		fmt.Println(err)
		return
	}
	// The callback gets the Item type Watch yields.
	final, err := c.Follow(ctx, d.ThreadID, func(it client.Item) {
		fmt.Println("event:", it.Kind(), "round", it.Data.Base().Round)
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("thread ended:", final.Kind())
	// Output:
	// event: accepted round 0
	// event: cancelled round 0
	// thread ended: cancelled
}

func ExampleDispatch_Result() {
	c, ctx, stop := exampleClient()
	defer stop()

	d, err := cancelledDispatch(ctx, c)
	if err != nil {
		fmt.Println(err)
		return
	}
	// A finished thread decodes its output into plan; a failed or
	// cancelled one answers a *client.ThreadError.
	var plan struct{ Steps []string }
	err = d.Result(ctx, &plan)
	var te *client.ThreadError
	if errors.As(err, &te) {
		fmt.Println(te.Kind, "—", te.Detail)
		return
	}
	fmt.Println(plan.Steps)
	// Output: cancelled — ops: not needed
}
