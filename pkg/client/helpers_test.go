package client_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/services/dispatcher"
)

var planner = subagent.Definition{Name: "planner", Runtime: subagent.RuntimeExec, Command: []string{"./plan"}, MaxRounds: 5}

func putDefinition(ctx context.Context, js jetstream.JetStream, d subagent.Definition) error {
	kv, err := js.KeyValue(ctx, lifecycle.BucketSubagents)
	if err != nil {
		return err
	}
	data, _ := json.Marshal(d)
	_, err = kv.Put(ctx, d.Name, data)
	return err
}

// runDispatcher runs a dispatcher on nc until the returned stop is called.
func runDispatcher(nc *nats.Conn) (stop func(), err error) {
	log := slog.New(slog.DiscardHandler)
	if os.Getenv("AGORA_TEST_LOG") != "" {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	svc, err := dispatcher.New(dispatcher.Config{ShutdownTimeout: 5 * time.Second}, dispatcher.Deps{Conn: nc, Logger: log})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	select {
	case <-svc.Ready():
	case err := <-done:
		cancel()
		return nil, err
	}
	return func() { cancel(); <-done }, nil
}

// env is a provisioned test server with a dispatcher and a client.
type env struct {
	srv *natstest.Server
	nc  *nats.Conn
	js  jetstream.JetStream
	c   *client.Client
}

func newEnv(t *testing.T) *env {
	t.Helper()
	srv := natstest.StartProvisioned(t, provision.Config{})
	e := &env{srv: srv, nc: srv.Conn(t)}
	var err error
	if e.js, err = jetstream.New(e.nc); err != nil {
		t.Fatal(err)
	}
	if err := putDefinition(t.Context(), e.js, planner); err != nil {
		t.Fatal(err)
	}
	stop, err := runDispatcher(srv.Conn(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	if e.c, err = client.New(e.nc); err != nil {
		t.Fatal(err)
	}
	return e
}

// publishAsWorker publishes a lifecycle event as a worker would; the
// tests use it where a real worker's outcome is not the point.
func (e *env) publishAsWorker(t *testing.T, d lifecycle.Data) {
	t.Helper()
	_, msg, err := lifecycle.Message(lifecycle.Source("worker", "test"), d)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.js.PublishMsg(t.Context(), msg); err != nil {
		t.Fatal(err)
	}
}
