package lifecycle_test

import (
	"fmt"
	"time"

	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

func ExampleNew() {
	d := &lifecycle.Failed{
		Common: lifecycle.Common{DispatchID: "01JD", ThreadID: "01JT", Subagent: "planner"},
		Reason: lifecycle.ReasonTimeout,
		Detail: "no answer within 30m",
	}
	e, err := lifecycle.New(lifecycle.Source("worker", "w-1"), d,
		lifecycle.WithTime(time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("id:", e.ID())
	fmt.Println("type:", e.Type())
	fmt.Println("source:", e.Source())
	fmt.Println("subject:", e.Subject())
	fmt.Println("time:", e.Time().Format(time.RFC3339))
	fmt.Println("dataschema:", e.DataSchema())
	fmt.Println("data:", string(e.Data()))
	// Output:
	// id: 01JD.terminal
	// type: dev.agora.dispatch.failed
	// source: /agora/worker/w-1
	// subject: 01JD
	// time: 2025-01-02T03:04:05Z
	// dataschema: https://raw.githubusercontent.com/agora-dispatch/agora/main/schema/cloudevents/dispatch.failed.json
	// data: {"dispatch_id":"01JD","thread_id":"01JT","parent_id":"","round":0,"subagent":"planner","reason":"timeout","detail":"no answer within 30m","exit_code":null,"duration_ms":0}
}

func ExampleEncode() {
	d := &lifecycle.Started{
		Common:   lifecycle.Common{DispatchID: "01JD", ThreadID: "01JT", Subagent: "planner"},
		WorkerID: "w-1",
		Attempt:  2,
	}
	e, err := lifecycle.New(lifecycle.Source("worker", "w-1"), d,
		lifecycle.WithTime(time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)))
	if err != nil {
		fmt.Println(err)
		return
	}
	subject, err := lifecycle.Subject(d)
	if err != nil {
		fmt.Println(err)
		return
	}
	m, err := lifecycle.Encode(subject, e)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("subject:", m.Subject)
	for _, h := range []string{"Nats-Msg-Id", "content-type", "ce-specversion", "ce-id", "ce-type", "ce-source", "ce-subject", "ce-time"} {
		fmt.Printf("%s: %s\n", h, m.Header.Get(h))
	}
	fmt.Println("body:", string(m.Data))

	back, err := lifecycle.Decode(m.Header, m.Data)
	if err != nil {
		fmt.Println(err)
		return
	}
	data, err := lifecycle.Parse(back)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("parsed: %T attempt %d\n", data, data.(*lifecycle.Started).Attempt)
	// Output:
	// subject: agora.lifecycle.started.01JT.01JD
	// Nats-Msg-Id: 01JD.started.2
	// content-type: application/json
	// ce-specversion: 1.0
	// ce-id: 01JD.started.2
	// ce-type: dev.agora.dispatch.started
	// ce-source: /agora/worker/w-1
	// ce-subject: 01JD
	// ce-time: 2025-01-02T03:04:05Z
	// body: {"dispatch_id":"01JD","thread_id":"01JT","parent_id":"","round":0,"subagent":"planner","worker_id":"w-1","attempt":2}
	// parsed: *lifecycle.Started attempt 2
}
