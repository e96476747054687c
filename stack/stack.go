// Package stack assembles Agora. Start starts an embedded NATS server with
// JetStream (or joins a running one), provisions it, registers sub-agents
// and runs the services its Options ask for, each on a NATS connection of
// its own, behind one HTTP handler. It is the one place that wires the
// system (docs/design.md, "Components"): `agora dev`, the benchmark, the
// chaos audit, the system tests and agoratest all start Agora through it,
// while each service's own main runs that service alone (internal/svc).
package stack

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/agora-dispatch/agora/answerers/inbox"
	"github.com/agora-dispatch/agora/answerers/slack"
	"github.com/agora-dispatch/agora/internal/natsserver"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/runtime"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/services/a2aserver"
	"github.com/agora-dispatch/agora/services/auditlog"
	"github.com/agora-dispatch/agora/services/dispatcher"
	"github.com/agora-dispatch/agora/services/mcpserver"
	"github.com/agora-dispatch/agora/services/router"
	"github.com/agora-dispatch/agora/services/worker"
)

// ErrServer is wrapped by the error of a Start whose embedded server did
// not start (its port is taken, its store cannot be opened).
var ErrServer = errors.New("embedded NATS")

// Options say what Start runs. The zero value joins nothing and runs
// nothing: set URL or Server, and the services wanted.
type Options struct {
	// URL is a running NATS server to join. Empty: Start starts an
	// embedded server with Server's settings, and Close stops it.
	URL string
	// Server configures the embedded server (Port -1 picks a free port).
	// With neither StoreDir nor Memory its store is a temporary directory
	// that Close removes.
	Server natsserver.Config
	// Provision, when set, provisions Agora's streams, consumers and
	// buckets with it before anything else runs.
	Provision *provision.Config
	// Subagents are registered through the client (validated, written
	// only when changed) before the services start.
	Subagents []subagent.Definition

	// Each service runs when its configuration is set, on the connection
	// Start opens for it, with Logger and Registerer; the NATS settings
	// of its Config are not used.
	Dispatcher *dispatcher.Config
	Router     *router.Config
	// Audit runs the decision log's writer (docs/audit.md).
	Audit   *auditlog.Config
	Workers []worker.Config // a worker service per entry
	Inbox   *inbox.Config
	Slack   *slack.Config
	// MCP, when set, serves the MCP server at /mcp on Handler, acting
	// through the stack's client.
	MCP *mcpserver.Config
	// A2A, when set, serves the sub-agents as an A2A agent at /a2a and its
	// card at /.well-known/agent-card.json on Handler (docs/a2a.md),
	// acting through the stack's client. Without tokens or a principals
	// file of its own it takes the dispatcher's, so /a2a asks what /v1
	// asks.
	A2A *a2aserver.Config

	// Runtimes add or replace the runtimes of every worker
	// (worker.Deps.Runtimes).
	Runtimes map[string]runtime.Runtime
	// InProcess runs Go code in place of the sub-agents of the runtimes
	// it names, in every worker's process (worker.Deps.InProcess: tests
	// and benches).
	InProcess map[string]worker.InProcess
	// Logger receives every service's logs; default discarded.
	Logger *slog.Logger
	// Registerer receives every service's metrics (the dispatcher serves
	// it at /metrics when it is also a Gatherer); default a registry per
	// service. It takes one worker's metrics only.
	Registerer prometheus.Registerer
	// ReadyTimeout bounds Start's wait for the services to be ready;
	// default a minute.
	ReadyTimeout time.Duration
}

// Stack is a running Agora. Its methods are safe for concurrent use.
type Stack struct {
	log     *slog.Logger
	srv     *server.Server // nil when joined
	tempDir string         // the embedded store Close removes
	url     string
	nc      *nats.Conn // the stack's own: provisioning, the client
	js      jetstream.JetStream
	client  *client.Client
	conns   []*nats.Conn // the services', closed after they stop
	router  *router.Service
	inbox   *inbox.Server
	handler http.Handler

	stopping  chan struct{}  // closed when Close starts
	tasks     sync.WaitGroup // the services' goroutines and their stoppers
	mu        sync.Mutex
	errs      []error       // of services that returned one, in order
	failed    chan struct{} // closed at the first of errs
	closeOnce sync.Once
	closeErr  error
}

// task is one service (or function given to Go) running.
type task struct {
	name  string
	ready <-chan struct{} // nil: nothing to wait for
	done  chan struct{}   // closed when its Run returned
}

// Start starts the server (or joins Options.URL), provisions it, registers
// the sub-agents and runs the services, and returns once every service
// that reports readiness is ready. ctx bounds the start only: the services
// run until Close. On error everything started is stopped again.
func Start(ctx context.Context, o Options) (_ *Stack, err error) {
	s := &Stack{log: o.Logger, url: o.URL, stopping: make(chan struct{}), failed: make(chan struct{})}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	defer func() {
		if err != nil {
			_ = s.Close()
		}
	}()
	if s.url == "" {
		if err := s.startServer(o.Server); err != nil {
			return nil, err
		}
	}
	if s.nc, err = s.connect("agora stack"); err != nil {
		return nil, err
	}
	if s.js, err = jetstream.New(s.nc); err != nil {
		return nil, fmt.Errorf("stack: %w", err)
	}
	if s.client, err = client.New(s.nc); err != nil {
		return nil, fmt.Errorf("stack: %w", err)
	}
	if o.Provision != nil {
		if err := provision.Ensure(ctx, s.js, *o.Provision); err != nil {
			return nil, fmt.Errorf("stack: provision: %w", err)
		}
	}
	for _, d := range o.Subagents {
		if _, err := s.client.ApplySubagent(ctx, d); err != nil {
			return nil, fmt.Errorf("sub-agent %s: %w", d.Name, err)
		}
	}
	svcs, handler, err := s.build(ctx, o)
	if err != nil {
		return nil, err
	}
	s.handler = handler
	var tasks []task
	for _, sv := range svcs {
		tasks = append(tasks, s.run(sv.name, sv.run, sv.ready))
	}
	if err := s.waitReady(ctx, tasks, cmp.Or(o.ReadyTimeout, time.Minute)); err != nil {
		return nil, err
	}
	return s, nil
}

// startServer starts the embedded server, in a temporary store when cfg
// names none.
func (s *Stack) startServer(cfg natsserver.Config) error {
	if cfg.StoreDir == "" && !cfg.Memory {
		dir, err := os.MkdirTemp("", "agora-stack-")
		if err != nil {
			return fmt.Errorf("stack: %w", err)
		}
		s.tempDir, cfg.StoreDir = dir, dir
	}
	srv, err := natsserver.Start(cfg)
	if err != nil {
		host := cmp.Or(cfg.Host, "127.0.0.1")
		port := strconv.Itoa(cmp.Or(cfg.Port, 4222))
		return fmt.Errorf("%w on %s:%s: %w", ErrServer, host, port, err)
	}
	s.srv, s.url = srv, srv.ClientURL()
	if cfg.Token != "" {
		s.url = strings.Replace(s.url, "nats://", "nats://"+cfg.Token+"@", 1)
	}
	return nil
}

// service is a built service before it runs.
type service struct {
	name  string
	run   func(context.Context) error
	ready <-chan struct{}
}

// build makes the services o asks for, each on a connection of its own,
// and the handler that serves them.
func (s *Stack) build(ctx context.Context, o Options) ([]service, http.Handler, error) {
	var svcs []service
	mux := http.NewServeMux()
	health := map[string]http.Handler{}
	for i, wcfg := range o.Workers {
		name := "worker"
		if len(o.Workers) > 1 {
			name = fmt.Sprintf("worker-%d", i+1)
		}
		nc, err := s.connect("agora-" + name)
		if err != nil {
			return nil, nil, err
		}
		w, err := worker.New(wcfg, worker.Deps{Conn: nc, Logger: s.log, Registerer: o.Registerer, Runtimes: o.Runtimes, InProcess: o.InProcess})
		if err != nil {
			return nil, nil, err
		}
		svcs, health[name] = append(svcs, service{name: name, run: w.Run}), w.Handler()
	}
	if o.Dispatcher != nil {
		nc, err := s.connect("agora-dispatcher")
		if err != nil {
			return nil, nil, err
		}
		d, err := dispatcher.New(*o.Dispatcher, dispatcher.Deps{Conn: nc, Logger: s.log, Registerer: o.Registerer})
		if err != nil {
			return nil, nil, err
		}
		svcs, health["dispatcher"] = append(svcs, service{"dispatcher", d.Run, d.Ready()}), d.Handler()
		mux.Handle("/", d.Handler()) // /v1/…, /metrics
	}
	if o.Router != nil {
		nc, err := s.connect("agora-router")
		if err != nil {
			return nil, nil, err
		}
		if s.router, err = router.New(*o.Router, router.Deps{Conn: nc, Logger: s.log, Registerer: o.Registerer}); err != nil {
			return nil, nil, err
		}
		svcs, health["router"] = append(svcs, service{"router", s.router.Run, s.router.Ready()}), s.router.Handler()
	}
	if o.Audit != nil {
		nc, err := s.connect("agora-auditlog")
		if err != nil {
			return nil, nil, err
		}
		a, err := auditlog.New(*o.Audit, auditlog.Deps{Conn: nc, Logger: s.log, Registerer: o.Registerer})
		if err != nil {
			return nil, nil, err
		}
		svcs, health["auditlog"] = append(svcs, service{"auditlog", a.Run, a.Ready()}), a.Handler()
	}
	if o.Inbox != nil {
		nc, err := s.connect("agora-inbox")
		if err != nil {
			return nil, nil, err
		}
		if s.inbox, err = inbox.New(*o.Inbox, inbox.Deps{Conn: nc, Logger: s.log, Registerer: o.Registerer}); err != nil {
			return nil, nil, err
		}
		svcs, health["inbox"] = append(svcs, service{"inbox", s.inbox.Run, s.inbox.Ready()}), s.inbox.Handler()
		mux.Handle(inbox.Prefix+"/", s.inbox.Handler())
	}
	if o.Slack != nil {
		nc, err := s.connect("agora-slack")
		if err != nil {
			return nil, nil, err
		}
		sa, err := slack.New(*o.Slack, slack.Deps{Conn: nc, Logger: s.log, Registerer: o.Registerer})
		if err != nil {
			return nil, nil, err
		}
		svcs = append(svcs, service{"slack", sa.Run, sa.Ready()})
		mux.Handle("/slack/", sa.Handler())
	}
	if o.MCP != nil {
		ms, err := mcpserver.New(ctx, *o.MCP, mcpserver.Deps{Client: s.client, Logger: s.log})
		if err != nil {
			return nil, nil, err
		}
		mux.Handle("/mcp", ms.Handler())
	}
	if o.A2A != nil {
		cfg := *o.A2A
		if len(cfg.APITokens) == 0 && cfg.PrincipalsFile == "" && o.Dispatcher != nil {
			cfg.APITokens, cfg.PrincipalsFile = o.Dispatcher.APITokens, o.Dispatcher.PrincipalsFile
		}
		as, err := a2aserver.New(cfg, a2aserver.Deps{Client: s.client, Logger: s.log})
		if err != nil {
			return nil, nil, err
		}
		svcs = append(svcs, service{name: "a2a", run: as.Run})
		h := as.Handler()
		mux.Handle(a2aserver.Path, h)
		mux.Handle(a2aserver.Path+"/", h)
		mux.Handle(a2aserver.CardPath, h)
	}
	mux.Handle("GET /healthz", healthOf(health, map[string]string{"inbox": inbox.Prefix + "/healthz"}))
	return svcs, mux, nil
}

// connect opens a connection named name that reconnects forever; Close
// closes it after the services stop.
func (s *Stack) connect(name string) (*nats.Conn, error) {
	nc, err := nats.Connect(s.url, nats.Name(name), nats.MaxReconnects(-1))
	if err != nil {
		return nil, fmt.Errorf("stack: connect %s: %w", name, err)
	}
	s.mu.Lock()
	s.conns = append(s.conns, nc)
	s.mu.Unlock()
	return nc, nil
}

// run runs a service until Close, recording the error it returns.
func (s *Stack) run(name string, run func(context.Context) error, ready <-chan struct{}) task {
	r := task{name: name, ready: ready, done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	s.tasks.Go(func() {
		select {
		case <-s.stopping:
			cancel()
		case <-r.done:
		}
	})
	s.tasks.Go(func() {
		defer close(r.done)
		defer cancel()
		if err := run(ctx); err != nil {
			s.mu.Lock()
			if s.errs = append(s.errs, fmt.Errorf("%s: %w", name, err)); len(s.errs) == 1 {
				close(s.failed)
			}
			s.mu.Unlock()
		}
	})
	return r
}

// waitReady waits until every task that reports readiness is ready, one fails, ctx ends or timeout passes.
func (s *Stack) waitReady(ctx context.Context, tasks []task, timeout time.Duration) error {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for _, r := range tasks {
		if r.ready == nil {
			continue
		}
		select {
		case <-r.ready:
		case <-s.failed:
			return s.firstErr()
		case <-r.done:
			return fmt.Errorf("stack: %s stopped before it was ready", r.name)
		case <-ctx.Done():
			return fmt.Errorf("stack: waiting for %s: %w", r.name, ctx.Err())
		case <-timer.C:
			return fmt.Errorf("stack: %s not ready within %s", r.name, timeout)
		}
	}
	return nil
}

func (s *Stack) firstErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.errs) == 0 {
		return nil
	}
	return s.errs[0]
}

// Go runs run beside the services until Close (an answerer, say); an error
// it returns is reported by Wait and Close like a service's. Call it
// before Close.
func (s *Stack) Go(name string, run func(ctx context.Context) error) {
	s.run(name, run, nil)
}

// Wait blocks until ctx ends (nil) or a service, or a function given to
// Go, returns an error (that error). It stops nothing: call Close.
func (s *Stack) Wait(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return nil
	case <-s.failed:
		return s.firstErr()
	}
}

// Reload rereads the router's routing file and the inbox's users file, as
// SIGHUP does to their own processes; an invalid file is logged and the
// one in use stays. It returns what failed.
func (s *Stack) Reload() error {
	var errs []error
	if s.router != nil {
		if err := s.router.Reload(); err != nil {
			s.log.Error("routing file not reloaded; keeping the previous routes", "err", err)
			errs = append(errs, err)
		} else {
			s.log.Info("routing file reloaded")
		}
	}
	if s.inbox != nil {
		if err := s.inbox.ReloadUsers(); err != nil {
			s.log.Error("inbox users file not reloaded; keeping the previous users", "err", err)
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Close stops the services (each gets its own shutdown timeout), closes
// their connections and the stack's, stops the embedded server and
// removes a temporary store. It returns the errors the services returned,
// joined. Safe to call more than once; later calls return the same.
func (s *Stack) Close() error {
	s.closeOnce.Do(func() {
		close(s.stopping)
		s.tasks.Wait()
		s.mu.Lock()
		conns := s.conns
		s.closeErr = errors.Join(s.errs...)
		s.mu.Unlock()
		for i := len(conns) - 1; i >= 0; i-- {
			conns[i].Close()
		}
		if s.srv != nil {
			s.srv.Shutdown()
			s.srv.WaitForShutdown()
		}
		if s.tempDir != "" {
			_ = os.RemoveAll(s.tempDir)
		}
	})
	return s.closeErr
}

// URL is the NATS client URL, with the embedded server's token when it has
// one: what a client in another process connects to.
func (s *Stack) URL() string { return s.url }

// Conn is the stack's own connection, the one the client uses. It stays
// the stack's: Close closes it.
func (s *Stack) Conn() *nats.Conn { return s.nc }

// JetStream is a JetStream context on Conn.
func (s *Stack) JetStream() jetstream.JetStream { return s.js }

// Client is an Agora client on Conn.
func (s *Stack) Client() *client.Client { return s.client }

// Server is the embedded server, nil when the stack joined Options.URL.
func (s *Stack) Server() *server.Server { return s.srv }

// Handler serves every running service on one listener: the dispatcher's
// API and /metrics at /, the inbox under /inbox/, Slack's interactivity
// under /slack/, MCP at /mcp, A2A at /a2a with its agent card at
// /.well-known/agent-card.json, and /healthz, which reports every service
// (healthOf). Nothing is served until Start returned.
func (s *Stack) Handler() http.Handler { return s.handler }

// DevToken is the inbox's dev sign-in token (inbox.Server.DevToken), empty
// when no inbox runs or it has none.
func (s *Stack) DevToken() string {
	if s.inbox == nil {
		return ""
	}
	return s.inbox.DevToken()
}
