package client_test

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/services/dispatcher"
)

var planner = subagent.Definition{Name: "planner", Runtime: subagent.RuntimeExec, Command: []string{"./plan"}, MaxRounds: 5}

// define registers sub-agent definitions through the client.
func (e *env) define(t *testing.T, defs ...subagent.Definition) {
	t.Helper()
	for _, d := range defs {
		if _, err := e.c.ApplySubagent(t.Context(), d); err != nil {
			t.Fatal(err)
		}
	}
}

// dispatch dispatches req through the env's client and fails the test on
// an error.
//
// A later round is made the resume of an answered question first, as the
// router makes one (natstest.Answered): the dispatcher accepts no other.
func (e *env) dispatch(ctx context.Context, t *testing.T, req lifecycle.Request, opts ...client.DispatchOption) *client.Dispatch {
	t.Helper()
	if req.Round > 0 {
		req = natstest.Answered(t, e.js, req)
	}
	d, err := e.c.Dispatch(ctx, req, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// startDispatcher runs a dispatcher on the env's server until the test
// ends.
func (e *env) startDispatcher(t *testing.T) {
	t.Helper()
	log := slog.New(slog.DiscardHandler)
	if os.Getenv("AGORA_TEST_LOG") != "" {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	svc, err := dispatcher.New(dispatcher.Config{ShutdownTimeout: 5 * time.Second}, dispatcher.Deps{Conn: e.srv.Conn(t), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Go(t, "dispatcher", svc.Run)
	testkit.WaitReady(t, 10*time.Second, "dispatcher", svc.Ready())
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
	e := &env{srv: srv, nc: srv.Conn(t), js: srv.JetStream(t)}
	var err error
	if e.c, err = client.New(e.nc); err != nil {
		t.Fatal(err)
	}
	e.define(t, planner)
	e.startDispatcher(t)
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
