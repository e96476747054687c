package answerer_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/agoratest"
	"github.com/agora-dispatch/agora/pkg/answerer"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/services/router"
)

// Serve answers the questions of the route "human" (where the built-in
// routing sends every question). The handler picks an option; the router
// accepts the answer and re-dispatches the thread with it.
func Example() {
	nc, ask, stop := startAgora()
	defer stop()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ask("Rewrite function A or B?", "A", "B") // a sub-agent asks; the router routes it

	h := answerer.HandlerFunc(func(ctx context.Context, q lifecycle.Question) (answerer.Reply, error) {
		fmt.Println("asked:", q.Question, q.Options)
		if len(q.Options) == 0 {
			return answerer.Decline("I only choose between options"), nil
		}
		return answerer.Answer(q.Options[len(q.Options)-1]), nil
	})
	err := answerer.Serve(ctx, nc, "human", h,
		answerer.WithAnsweredBy("example"),
		answerer.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))),
		answerer.WithReport(func(r answerer.Report) {
			fmt.Println("answered:", r.Reply.Answer, "→", r.Status)
			cancel() // one question is enough for the example
		}))
	fmt.Println("stopped:", err)
	// Output:
	// asked: Rewrite function A or B? [A B]
	// answered: B → accepted
	// stopped: <nil>
}

// startAgora runs an embedded, provisioned JetStream server with a router
// (package agoratest); ask publishes a sub-agent's needs_input as a worker
// would.
func startAgora() (nc *nats.Conn, ask func(question string, options ...string), stop func()) {
	ctx := context.Background()
	// No dispatcher runs: the router asks at once instead of waiting for
	// the asking dispatch's record.
	a, err := agoratest.Start(ctx, agoratest.Options{Router: &router.Config{RecordWait: time.Millisecond}})
	if err != nil {
		panic(err)
	}
	if nc, err = nats.Connect(a.URL); err != nil {
		panic(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		panic(err)
	}
	ask = func(question string, options ...string) {
		id := lifecycle.NewID()
		ni := &lifecycle.NeedsInput{Common: lifecycle.Common{DispatchID: id, ThreadID: id, Subagent: "planner"},
			QuestionID: lifecycle.QuestionID(id), Question: question, Options: options, Kind: "decision"}
		_, m, err := lifecycle.Message(lifecycle.Source("example", "worker"), ni)
		if err != nil {
			panic(err)
		}
		if _, err := js.PublishMsg(ctx, m); err != nil {
			panic(err)
		}
	}
	return nc, ask, func() {
		nc.Close()
		a.Stop()
	}
}
