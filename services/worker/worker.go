// Package worker runs sub-agents for dispatches taken from JetStream.
//
// Every worker shares the one durable pull consumer `workers` on
// AGORA_DISPATCH. Each of its slots pulls one message at a time, prepares a
// fresh workspace, runs the sub-agent's runtime in its own process group
// with a default-deny environment, resolves the needs_input sentinel, and
// publishes exactly one terminal lifecycle event (id <dispatch_id>.terminal)
// before it acknowledges the message. A worker that dies mid-run leaves the
// message to be redelivered; the fixed terminal id and a look for an
// existing terminal event before each run keep the outcome single.
package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/agora-dispatch/agora/internal/crashpoint"
	"github.com/agora-dispatch/agora/internal/egress"
	"github.com/agora-dispatch/agora/internal/runtimes"
	"github.com/agora-dispatch/agora/internal/sandbox"
	"github.com/agora-dispatch/agora/internal/sandbox/contain"
	"github.com/agora-dispatch/agora/internal/svc"
	"github.com/agora-dispatch/agora/pkg/consume"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/runtime"
)

// Deps are the worker's collaborators. Every field is optional.
type Deps struct {
	// Conn is an existing NATS connection; when nil, New connects to
	// Config.NATSURL and Run closes the connection it made.
	Conn *nats.Conn
	// Logger receives structured logs; default slog.Default().
	Logger *slog.Logger
	// Registerer receives the worker's metrics; default a new registry
	// served by Handler.
	Registerer prometheus.Registerer
	// Runtimes adds or replaces runtimes by definition runtime name
	// (built in: exec, claude-code, codex and gemini-cli,
	// internal/runtimes): each says what to run, and the worker runs it in
	// the run's sandbox (docs/subagents.md, "Writing a runtime").
	Runtimes map[string]runtime.Runtime
	// InProcess runs Go code in the worker's process in place of the
	// command of every sub-agent whose runtime it names, unconfined: for
	// tests and benches (InProcess).
	InProcess map[string]InProcess
	// Egress is the template of every run's egress proxy
	// (internal/egress): its Dialer, Resolver and AllowPrivate reach runs'
	// proxies; Allow comes from each definition. The zero value dials the
	// real network and refuses private destinations.
	Egress egress.Config
}

// Service is a worker. Create it with New and start it with Run or RunOnce.
type Service struct {
	cfg       Config
	nc        *nats.Conn
	ownConn   bool
	log       *slog.Logger
	metrics   *metrics
	gatherer  prometheus.Gatherer
	runtimes  map[string]runtime.Runtime
	inProcess map[string]InProcess
	source    string

	bindOnce sync.Once
	bindErr  error
	js       jetstream.JetStream
	work     jetstream.Consumer
	dispatch jetstream.Stream
	events   jetstream.Stream
	defs     jetstream.KeyValue
	state    jetstream.ObjectStore
	// artifacts is agora_artifacts; caps bound what one run uploads
	// (artifacts.go).
	artifacts jetstream.ObjectStore
	caps      artifactCaps
	ackWait   time.Duration

	cancels  cancels
	defCache defCache
	launcher *sandbox.Launcher
	host     *contain.Host // contains every run (internal/sandbox/contain)
	exe      string        // the worker's own executable; "" when unknown
	spares   *spares       // parked workspaces (workspace.go); nil with KeepWorkspaces
}

// Outcome is how one dispatch ended on this worker.
type Outcome struct {
	DispatchID string
	Kind       lifecycle.Kind   // the terminal kind, or "" when skipped
	Reason     lifecycle.Reason // for failed
	ExitCode   int              // the runtime's exit code, -1 when none
	Skipped    bool             // already terminal: acked without running
	Fenced     bool             // a newer attempt owns the dispatch: nothing published
}

// ErrShutdown is the cause a run ends with when it is cancelled because
// the worker is stopping and the shutdown timeout passed.
var ErrShutdown = errors.New("worker: shutting down")

var (
	errTimeout   = errors.New("worker: timeout")
	errCancelled = errors.New("worker: cancelled")
)

// New checks cfg and prepares a worker. It connects to NATS when deps.Conn
// is nil; it does not touch JetStream until Run.
func New(cfg Config, deps Deps) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("worker: config: %w", err)
	}
	if err := crashpoint.Check(); err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	cfg = cfg.withDefaults()
	s := &Service{cfg: cfg, log: svc.Logger(deps.Logger, "service", "worker", "worker_id", cfg.ID)}
	s.caps, _ = cfg.artifactCaps() // checked by Validate
	reg, gatherer := svc.Registry(deps.Registerer)
	s.gatherer = gatherer
	m, err := newMetrics(reg, cfg.Concurrency)
	if err != nil {
		return nil, err
	}
	s.metrics = m
	s.runtimes = runtimes.Builtin(cfg.Runtimes)
	for k, v := range deps.Runtimes {
		s.runtimes[k] = v
	}
	s.inProcess = deps.InProcess
	s.source = lifecycle.Source("worker", cfg.ID)
	if s.launcher, err = sandbox.New(sandbox.Options{Bin: cfg.SandboxLauncher, RunUID: cfg.SandboxUID}); err != nil {
		if cfg.SandboxLauncher != "" {
			return nil, fmt.Errorf("worker: AGORA_SANDBOX_LAUNCHER=%s: %w", cfg.SandboxLauncher, err)
		}
		return nil, fmt.Errorf("worker: %w", err)
	}
	// The worker's own executable serves the sub-agent's require_input MCP
	// tool (AGORA_SUBAGENT_MCP=serve); every run's root shows it.
	if exe, err := os.Executable(); err == nil {
		s.exe = exe
	}
	s.host = contain.New(contain.Options{Launcher: s.launcher, Egress: deps.Egress, Helper: cfg.SandboxHelper, Exe: s.exe,
		WatchWorkspace: cfg.KeepWorkspaces || cfg.SandboxWorkspace == "watch"})
	if !cfg.KeepWorkspaces {
		s.spares = &spares{max: max(cfg.Concurrency, 1)}
	}
	// Processes of the worker's user cannot read its memory, environment
	// or descriptors through /proc. Not for a worker that is not root and
	// gives runs user namespaces: a non-dumpable process cannot write its
	// children's uid maps, so it could start no launcher; its runs are
	// another user namespace's, without capabilities, and cannot trace
	// it (docs/sandbox.md, "Namespaces").
	if os.Geteuid() == 0 || s.launcher.Mode() != sandbox.ModeNamespaces {
		if err := nonDumpable(); err != nil {
			return nil, fmt.Errorf("worker: %w", err)
		}
	}
	if s.nc, s.ownConn, err = svc.Conn(deps.Conn, "worker", cfg.ID, cfg.NATSURL, cfg.NATSCreds, s.log); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Service) bind(ctx context.Context) error {
	s.bindOnce.Do(func() { s.bindErr = s.doBind(ctx) })
	return s.bindErr
}

func (s *Service) doBind(ctx context.Context) error {
	js, err := jetstream.New(s.nc)
	if err != nil {
		return fmt.Errorf("worker: jetstream: %w", err)
	}
	s.js = js
	// A cluster electing leaders answers with timeouts for a while: retry
	// until shutdown; only a missing stream or bucket stops the worker.
	return svc.Bind(ctx, s.log, 0, func(ctx context.Context) error {
		o := svc.NewOpener(ctx, js, "worker")
		s.work = o.Consumer(lifecycle.StreamDispatch, lifecycle.ConsumerWorkers)
		s.dispatch = o.Stream(lifecycle.StreamDispatch)
		s.events = o.Stream(lifecycle.StreamLifecycle)
		s.defs = o.KeyValue(lifecycle.BucketSubagents)
		s.state = o.ObjectStore(lifecycle.BucketState)
		s.artifacts = o.ObjectStore(lifecycle.BucketArtifacts)
		if err := o.Err(); err != nil {
			return err
		}
		s.ackWait = s.work.CachedInfo().Config.AckWait
		s.announce(ctx, js)
		return nil
	})
}

// announce writes each runtime this worker offers into agora_runtimes, so
// that a definition naming one is accepted (client.Runtimes,
// docs/subagents.md "Writing a runtime"). The work does not depend on it:
// a failure is logged, and the next start announces again.
func (s *Service) announce(ctx context.Context, js jetstream.JetStream) {
	kv, err := js.KeyValue(ctx, lifecycle.BucketRuntimes)
	if err != nil {
		s.log.Warn("cannot announce this worker's runtimes: definitions naming one that is not built in are refused until a worker does", "bucket", lifecycle.BucketRuntimes, "err", err)
		return
	}
	now := time.Now().UTC()
	for _, name := range s.offered() {
		b, _ := json.Marshal(lifecycle.RuntimeAnnouncement{Runtime: name, WorkerID: s.cfg.ID, AnnouncedAt: now})
		if _, err := kv.Put(ctx, name, b); err != nil {
			s.log.Warn("cannot announce a runtime", "runtime", name, "err", err)
		}
	}
}

// Run pulls and runs dispatches until ctx ends, then shuts down gracefully:
// it stops pulling, lets in-flight runs finish for up to ShutdownTimeout,
// cancels those still running (they end `cancelled`), and closes the
// connection it opened. It returns nil after a clean shutdown.
func (s *Service) Run(ctx context.Context) error {
	if err := s.bind(ctx); err != nil {
		s.closeConn()
		return err
	}
	unsubscribe, err := s.subscribe()
	if err != nil {
		s.closeConn()
		return err
	}
	defer unsubscribe()
	srv, err := s.serveHTTP()
	if err != nil {
		s.closeConn()
		return err
	}
	s.logStart()

	// What a killed worker left in the root goes now, and again from time
	// to time (a run killed with its worker frees its lock a moment later).
	s.sweep()
	defer s.spares.drain()
	defer s.launcher.Close()
	s.host.SweepCgroups() // what killed workers left
	defer s.host.Close()
	sweepCtx, stopSweep := context.WithCancel(ctx)
	defer stopSweep()
	var sweeper sync.WaitGroup
	defer sweeper.Wait()
	sweeper.Go(func() { s.sweepEvery(sweepCtx) })

	consumed := make(chan struct{})
	go func() {
		defer close(consumed)
		s.consumeWork(ctx)
	}()
	<-ctx.Done()
	s.log.Info("worker stopping: no new work; waiting for in-flight runs", "shutdown_timeout", s.cfg.ShutdownTimeout.String())
	<-consumed
	if srv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = srv.Shutdown(sctx)
		cancel()
	}
	s.closeConn()
	s.log.Info("worker stopped")
	return nil
}

// subscribe subscribes to the max-deliveries advisory and to cancels; the
// function returned unsubscribes from both.
func (s *Service) subscribe() (unsubscribe func(), err error) {
	// The advisory tells one worker (queue group) that a dispatch ran out
	// of deliveries, so it ends failed redelivery-exhausted.
	adv, err := s.nc.QueueSubscribe(maxDeliveriesSubject, "agora-workers", func(m *nats.Msg) { s.onMaxDeliveries(m) })
	if err != nil {
		return nil, fmt.Errorf("worker: subscribe advisories: %w", err)
	}
	csub, err := s.subscribeCancels()
	if err != nil {
		_ = adv.Unsubscribe()
		return nil, err
	}
	return func() {
		_ = csub.Unsubscribe()
		_ = adv.Unsubscribe()
	}, nil
}

// serveHTTP serves the worker's HTTP endpoints when an address is set;
// the server returned (nil without one) is shut down by Run.
func (s *Service) serveHTTP() (*http.Server, error) {
	if s.cfg.HTTPAddr == "" {
		return nil, nil
	}
	srv := &http.Server{Addr: s.cfg.HTTPAddr, Handler: s.Handler(), ReadHeaderTimeout: 5 * time.Second}
	ln, err := listen(s.cfg.HTTPAddr)
	if err != nil {
		return nil, fmt.Errorf("worker: AGORA_WORKER_HTTP_ADDR=%s: %w", s.cfg.HTTPAddr, err)
	}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("http server", "err", err)
		}
	}()
	return srv, nil
}

// logStart logs how the worker runs and contains its runs.
func (s *Service) logStart() {
	s.log.Info("worker started", "concurrency", s.cfg.Concurrency, "workspace_root", s.cfg.WorkspaceRoot, "ack_wait", s.ackWait.String(), "sandbox", s.launcher.Mode(), "launcher", s.launcher.Executable(),
		"landlock_abi", s.launcher.Host().LandlockABI, "private_proc", s.launcher.Host().PrivateProc, "cgroups", s.host.Cgroups())
	if err := s.launcher.Spawner(); err != nil {
		// Runs are contained as before; each launcher's start costs more.
		s.log.Warn("sandbox: no spawner, launchers are forked from the worker itself (more CPU per run, docs/sandbox.md \"The spawner\")", "err", err)
	}
}

// sweepEvery sweeps the workspace root every SweepInterval until ctx ends.
func (s *Service) sweepEvery(ctx context.Context) {
	t := time.NewTicker(s.cfg.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.sweep()
		}
	}
}

// consumeWork consumes the work stream until ctx ends and the runs in
// flight are done. Each slot pulls one message at a time
// (docs/worker.md); a run in flight when ctx ends may finish for
// ShutdownTimeout, then its context is cancelled and it ends cancelled
// (handle.go). Handle settles its message itself, at the point the
// dispatch's events allow, and keeps it in progress while the runtime
// runs.
func (s *Service) consumeWork(ctx context.Context) {
	_ = consume.Run(ctx, s.work, func(ctx context.Context, m jetstream.Msg) consume.Verdict {
		s.Handle(ctx, m)
		return consume.Leave()
	}, consume.Options{
		Slots: s.cfg.Concurrency, PullExpiry: s.cfg.PullExpiry, FinishPulls: true, KeepAlive: -1,
		ShutdownTimeout: s.cfg.ShutdownTimeout, Logger: s.log,
	})
}

// subscribeCancels listens on agora.control.cancel.* for the whole worker
// and waits until the server has the interest, so no cancel is missed.
func (s *Service) subscribeCancels() (*nats.Subscription, error) {
	sub, err := s.nc.Subscribe("agora.control.cancel.*", s.cancels.deliver)
	if err != nil {
		return nil, fmt.Errorf("worker: subscribe cancels: %w", err)
	}
	_ = sub.SetPendingLimits(-1, -1)
	if err := s.nc.Flush(); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("worker: subscribe cancels: %w", err)
	}
	return sub, nil
}

func (s *Service) closeConn() {
	if s.ownConn {
		_ = s.nc.Drain()
	}
}

// RunOnce handles exactly one dispatch and returns how it ended: the mode
// for one-shot workers in Kubernetes Jobs. It waits for work until ctx
// ends. A dispatch that was already terminal is acked, reported as
// Skipped, and RunOnce returns.
func (s *Service) RunOnce(ctx context.Context) (Outcome, error) {
	defer s.closeConn()
	if err := s.bind(ctx); err != nil {
		return Outcome{}, err
	}
	csub, err := s.subscribeCancels()
	if err != nil {
		return Outcome{}, err
	}
	defer csub.Unsubscribe()
	s.sweep()
	defer s.spares.drain()
	defer s.launcher.Close()
	for {
		msg, err := s.work.Next(jetstream.FetchMaxWait(s.cfg.PullExpiry))
		if ctx.Err() != nil {
			if err == nil {
				_ = consume.Settle(ctx, msg, consume.Nak(0)) // pulled while stopping: hand it back
			}
			return Outcome{}, ctx.Err()
		}
		if err != nil {
			if errors.Is(err, nats.ErrTimeout) || errors.Is(err, jetstream.ErrNoHeartbeat) {
				continue
			}
			return Outcome{}, fmt.Errorf("worker: pull: %w", err)
		}
		runCtx, stop := context.WithCancelCause(context.WithoutCancel(ctx))
		go func() {
			select {
			case <-ctx.Done():
				select {
				case <-time.After(s.cfg.ShutdownTimeout):
					stop(ErrShutdown)
				case <-runCtx.Done():
				}
			case <-runCtx.Done():
			}
		}()
		out := s.Handle(runCtx, msg)
		stop(nil)
		return out, nil
	}
}

// Handler serves /metrics and /healthz.
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", svc.MetricsHandler(s.gatherer))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if s.nc.Status() != nats.CONNECTED {
			w.WriteHeader(http.StatusServiceUnavailable)
			_ = json.NewEncoder(w).Encode(map[string]string{"status": "unavailable", "nats": s.nc.Status().String()})
			return
		}
		h := s.launcher.Host()
		_ = json.NewEncoder(w).Encode(map[string]any{"status": "ok", "nats": "connected", "worker_id": s.cfg.ID,
			"sandbox": map[string]any{"isolation": s.launcher.Mode(), "launcher": s.launcher.Executable(),
				"landlock_abi": h.LandlockABI, "filesystem": h.LandlockABI >= 1, "network": h.LandlockABI >= 4,
				"private_proc": h.PrivateProc, "cgroups": s.host.Cgroups()}})
	})
	return mux
}

// Sandbox reports what the sandbox launcher can apply on this host.
func (s *Service) Sandbox() sandbox.Host { return s.launcher.Host() }

// Isolation names how runs' process trees are contained: pid-namespace,
// subreaper or direct.
func (s *Service) Isolation() string { return string(s.launcher.Mode()) }

// Cgroups reports whether runs get their own cgroups (processes and
// memory bounded as a whole).
func (s *Service) Cgroups() bool { return s.host.Cgroups() }

// ID returns the worker id used in `started` events.
func (s *Service) ID() string { return s.cfg.ID }

// ExitCode maps a one-shot outcome to the process exit code: 0 for
// finished, needs_input, an already-terminal dispatch or one a newer
// attempt owns; the runtime's own
// code for provider-failed; 1 for everything else.
func ExitCode(o Outcome) int {
	switch {
	case o.Skipped, o.Fenced, o.Kind == lifecycle.KindFinished, o.Kind == lifecycle.KindNeedsInput:
		return 0
	case o.Kind == lifecycle.KindFailed && o.Reason == lifecycle.ReasonProviderFailed && o.ExitCode > 0:
		return o.ExitCode
	}
	return 1
}

// offered lists the runtimes this worker runs, sorted.
func (s *Service) offered() []string {
	names := slices.Collect(maps.Keys(s.runtimes))
	for n := range s.inProcess {
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	return names
}
