// Package systemtest starts the real Agora services — dispatcher, worker
// and router — on a test's in-process JetStream server (through stack), so
// answerers and SDKs are tested against the whole system rather than
// pieces of it.
package systemtest

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/runtime"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/services/dispatcher"
	"github.com/agora-dispatch/agora/services/router"
	"github.com/agora-dispatch/agora/services/worker"
	"github.com/agora-dispatch/agora/stack"
)

// Logger discards logs unless the test runs with -v.
func Logger() *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// Options shape a System. The zero value is a working default.
type Options struct {
	// Routes is the routing file's content; empty uses the default routes.
	Routes string
	// WorkerConcurrency is the worker's slot count (default 4).
	WorkerConcurrency int
	// Retention is how long finished work stays readable (default 7 days).
	Retention time.Duration
	// Housekeeping, when set, is the interval of every periodic pass: the
	// worker's workspace sweep, the dispatcher's reconciler, and the
	// router's scan and cancel sweep (AGORA_WORKER_SWEEP_INTERVAL,
	// AGORA_DISPATCHER_RECONCILE_GRACE, AGORA_ROUTER_TICK,
	// AGORA_ROUTER_CANCEL_SWEEP), so a test's run outlives many of each.
	Housekeeping time.Duration
	// Registerer receives every service's metrics (stack.Options).
	Registerer prometheus.Registerer
	// Worker, when set, adjusts the worker's configuration (a stand-in
	// CLI's binary, the helpers turned off).
	Worker func(*worker.Config)
	// Runtimes are the worker's runtimes besides the built-in ones
	// (worker.Deps.Runtimes).
	Runtimes map[string]runtime.Runtime
	// Provision adjusts provisioning (a short duplicate window, so the
	// streams' age limits can follow a short retention); its Retention is
	// Retention's.
	Provision provision.Config
}

// System is a running Agora on a test server. Everything stops when the
// test ends.
type System struct {
	Server *natstest.Server
	Client *client.Client

	t  *testing.T
	st *stack.Stack
}

// Start provisions a fresh server and runs the dispatcher, a worker and
// the router on it, each on its own connection, until the test ends; an
// error a service returns fails the test.
func Start(t *testing.T, o Options) *System {
	t.Helper()
	pc := o.Provision
	pc.Retention = o.Retention
	srv := natstest.StartProvisioned(t, pc)
	var routes string
	if o.Routes != "" {
		routes = filepath.Join(t.TempDir(), "routes.yaml")
		if err := os.WriteFile(routes, []byte(o.Routes), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if o.WorkerConcurrency == 0 {
		o.WorkerConcurrency = 4
	}
	tick := 100 * time.Millisecond
	if o.Housekeeping > 0 {
		tick = o.Housekeeping
	}
	wc := worker.Config{WorkspaceRoot: t.TempDir(), Concurrency: o.WorkerConcurrency, PullExpiry: 500 * time.Millisecond,
		KillGrace: 500 * time.Millisecond, ShutdownTimeout: 5 * time.Second, SweepInterval: o.Housekeeping}
	if o.Worker != nil {
		o.Worker(&wc)
	}
	st, err := stack.Start(t.Context(), stack.Options{
		URL:        srv.URL,
		Dispatcher: &dispatcher.Config{ShutdownTimeout: 5 * time.Second, Retention: o.Retention, ReconcileGrace: o.Housekeeping},
		Workers:    []worker.Config{wc},
		Runtimes:   o.Runtimes,
		Router:     &router.Config{RoutesFile: routes, Tick: tick, CancelSweep: o.Housekeeping, ShutdownTimeout: 5 * time.Second, Retention: o.Retention},
		Logger:     Logger(),
		Registerer: o.Registerer,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := st.Close(); err != nil {
			t.Error(err)
		}
	})
	return &System{Server: srv, Client: st.Client(), t: t, st: st}
}

// Go runs f (an answerer, say) until the test ends; an error it returns
// fails the test.
func (s *System) Go(name string, f func(context.Context) error) {
	s.st.Go(name, f)
}

// Shell registers an exec sub-agent that runs script with sh -c; requests
// may set the variables envAllow names.
func (s *System) Shell(name, script string, envAllow ...string) {
	s.t.Helper()
	d := subagent.Definition{Name: name, Runtime: subagent.RuntimeExec, Command: []string{"sh", "-c", script}, Timeout: "1m", EnvAllow: envAllow}
	if _, err := s.Client.ApplySubagent(s.t.Context(), d); err != nil {
		s.t.Fatal(err)
	}
}
