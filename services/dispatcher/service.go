// Package dispatcher is Agora's front door (docs/design.md;
// docs/dispatcher.md).
//
// It takes dispatch requests through three doors that share one code path:
// the AGORA_REQUESTS stream (durable consumer `dispatcher`), the NATS micro
// service `agora` (agora.api.dispatch, agora.api.cancel, agora.api.status)
// and an HTTP API. It validates each request against the sub-agent
// registry, writes the dispatch record to the agora_dispatches bucket,
// emits `accepted` and queues the completed request on AGORA_DISPATCH. The
// same dispatch id through any door, any number of times, yields one
// dispatch. It keeps the records current from AGORA_LIFECYCLE (durable
// consumer `projection`), with a thread index under thread.<thread_id>, and
// it cancels dispatches and threads.
//
// Several dispatchers may run against one NATS cluster: they share the
// durable consumers and the micro queue group, and every write is
// idempotent or compare-and-set.
package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/agora-dispatch/agora/internal/buildinfo"
	"github.com/agora-dispatch/agora/internal/config"
	"github.com/agora-dispatch/agora/internal/crashpoint"
	"github.com/agora-dispatch/agora/internal/principal"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/internal/svc"
	"github.com/agora-dispatch/agora/pkg/consume"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// opTimeout bounds the NATS work of one request: under the client's
// DefaultTimeout (10 s), so a caller that waits that long hears why a
// request failed (a store that answers no write, say) rather than its own
// timeout.
const opTimeout = 8 * time.Second

// Deps are the dispatcher's collaborators (svc.Deps). Every field is
// optional.
type Deps = svc.Deps

// Service is a dispatcher. Create it with New and start it with Run.
type Service struct {
	cfg      Config
	nc       *nats.Conn
	ownConn  bool
	log      *slog.Logger
	metrics  *metrics
	gatherer prometheus.Gatherer
	source   string
	// principals are who may call the HTTP API (internal/principal).
	principals *principal.Set

	bindMu sync.Mutex
	b      *bindings
	defs   defs // the watched copy of agora_subagents (defs.go)

	running  atomic.Bool
	ready    chan struct{}
	stopping chan struct{}
	stopOnce sync.Once
}

// bindings are the JetStream handles, looked up once.
type bindings struct {
	js         jetstream.JetStream
	requests   jetstream.Consumer
	projection jetstream.Consumer
	events     jetstream.Stream
	work       jetstream.Stream // AGORA_DISPATCH: its duplicate window, and a late look for a work message (queuedAlready)
	subagents  jetstream.KeyValue
	store      store                 // the dispatch records and thread indexes (store.go)
	state      jetstream.ObjectStore // partial-state objects, deleted when their thread ends
	stateLog   jetstream.Stream      // the object store's stream: a deleted object's marker is purged from it
}

// New checks cfg and prepares a dispatcher. It connects to NATS when
// deps.Conn is nil; it does not touch JetStream until Run or the first
// request.
func New(cfg Config, deps Deps) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("dispatcher: config: %w", err)
	}
	if err := crashpoint.Check(); err != nil {
		return nil, fmt.Errorf("dispatcher: %w", err)
	}
	cfg = cfg.withDefaults()
	s := &Service{cfg: cfg, log: svc.Logger(deps.Logger, "service", "dispatcher", "dispatcher_id", cfg.ID), ready: make(chan struct{}), stopping: make(chan struct{})}
	reg, gatherer := svc.Registry(deps.Registerer)
	s.gatherer = gatherer
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	if err := reg.Register(newConsumerLag(s)); err != nil {
		return nil, fmt.Errorf("dispatcher: metrics: %w", err)
	}
	s.metrics = m
	s.source = lifecycle.Source("dispatcher", cfg.ID)
	if s.principals, err = principal.Load(cfg.APITokens, cfg.PrincipalsFile); err != nil {
		return nil, fmt.Errorf("dispatcher: %w", err)
	}
	if s.nc, s.ownConn, err = svc.Conn(deps.Conn, "dispatcher", cfg.ID, cfg.NATSURL, cfg.NATSCreds, s.log); err != nil {
		return nil, err
	}
	return s, nil
}

// bind looks up the streams, consumers and buckets once; a failure is not
// remembered, so a later call tries again.
func (s *Service) bind(ctx context.Context) (*bindings, error) {
	s.bindMu.Lock()
	defer s.bindMu.Unlock()
	if s.b != nil {
		return s.b, nil
	}
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	js, err := jetstream.New(s.nc)
	if err != nil {
		return nil, fmt.Errorf("dispatcher: jetstream: %w", err)
	}
	b := &bindings{js: js}
	o := svc.NewOpener(ctx, js, "dispatcher")
	b.requests = o.Consumer(lifecycle.StreamRequests, lifecycle.ConsumerDispatcher)
	b.projection = o.Consumer(lifecycle.StreamLifecycle, provision.ConsumerProjection)
	b.events = o.Stream(lifecycle.StreamLifecycle)
	b.work = o.Stream(lifecycle.StreamDispatch)
	b.subagents = o.KeyValue(lifecycle.BucketSubagents)
	dispatches := o.KeyValue(lifecycle.BucketDispatches)
	questions := o.KeyValue(lifecycle.BucketQuestions)
	b.state = o.ObjectStore(lifecycle.BucketState)
	if err := o.Err(); err != nil {
		return nil, err
	}
	if b.stateLog, err = js.Stream(ctx, objectStream(lifecycle.BucketState)); err != nil {
		return nil, fmt.Errorf("dispatcher: object store %s: %w", lifecycle.BucketState, err)
	}
	// Last: its subscription is made once, by a bind that succeeds.
	if b.store, err = newStore(js, dispatches, questions); err != nil {
		return nil, err
	}
	s.b = b
	return b, nil
}

// Ready is closed once Run serves every door.
func (s *Service) Ready() <-chan struct{} { return s.ready }

// stop tells long-lived handlers (Server-Sent Events) to end.
func (s *Service) stop() { s.stopOnce.Do(func() { close(s.stopping) }) }

// Run serves every door until ctx ends, then shuts down gracefully: it
// stops taking requests (micro endpoints stopped, consumers drained, HTTP
// listener closed), lets in-flight requests finish for up to
// ShutdownTimeout, and closes the connection New opened. Unacknowledged
// stream messages are redelivered to another dispatcher. Run returns nil
// after a clean shutdown; it may be called once.
func (s *Service) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("dispatcher: Run called twice")
	}
	defer s.stop()
	// A timeout while a cluster elects its leaders is retried until
	// shutdown; a missing stream stops the dispatcher at once (svc.Bind).
	var b *bindings
	err := svc.Bind(ctx, s.log, opTimeout, func(ctx context.Context) (err error) {
		b, err = s.bind(ctx)
		return err
	})
	if err != nil {
		s.closeConn()
		return err
	}
	defer b.store.chain.Close() // last: requests finishing still read statuses
	// work outlives ctx by ShutdownTimeout so in-flight requests finish.
	work, abandon := context.WithCancel(context.WithoutCancel(ctx))
	defer abandon()
	s.startDefinitions(work, b)
	r, err := s.start(work, b)
	if err != nil {
		s.closeConn()
		return err
	}
	// The endpoints' subscriptions reach the server before Ready.
	if err := s.nc.FlushTimeout(opTimeout); err != nil {
		s.log.Warn("flush", "err", err)
	}
	close(s.ready)
	s.log.Info("dispatcher started", "concurrency", s.cfg.Concurrency, "source", s.source)
	recCtx, stopReconcile := context.WithCancel(ctx)
	reconciled := make(chan struct{})
	go func() { defer close(reconciled); s.reconcileLoop(recCtx, b) }()
	defer func() { stopReconcile(); <-reconciled }()

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-r.httpErr:
		s.log.Error("http server failed; stopping", "err", runErr)
	}
	s.shutdown(r, abandon)
	s.closeConn()
	s.log.Info("dispatcher stopped")
	return runErr
}

// startDefinitions starts the watch that keeps a copy of the sub-agent
// definitions. Without it every request reads its definition from the
// bucket: slower, never wrong, so a failed watch does not stop intake,
// and start-up does not wait on the copy for more than opTimeout.
func (s *Service) startDefinitions(work context.Context, b *bindings) {
	defsStarted := make(chan error, 1)
	go s.keepDefinitions(work, b, defsStarted)
	select {
	case err := <-defsStarted:
		if err != nil {
			s.log.Warn("sub-agent definitions are read per request until their watch starts", "err", err, "retry", defsRetry)
		}
	case <-time.After(opTimeout):
		s.log.Warn("sub-agent definitions watch not ready: reading them per request meanwhile", "waited", opTimeout)
	}
}

// serving is what a running dispatcher stops at shutdown: its door
// consumers, its micro service and its HTTP server.
type serving struct {
	proj                  *projection
	intake                jetstream.ConsumeContext
	intakePool, microPool *svc.Pool
	msvc                  micro.Service
	srv                   *http.Server // nil without HTTPAddr
	httpErr               <-chan error // Serve's failure; nil without HTTPAddr
}

// start starts the doors: the status projection, the request stream's
// intake, the micro service and the HTTP API. What started is stopped
// again when a later step fails.
func (s *Service) start(work context.Context, b *bindings) (*serving, error) {
	r := &serving{intakePool: svc.NewPool(s.cfg.Concurrency), microPool: svc.NewPool(s.cfg.Concurrency)}
	var err error
	if r.proj, err = s.startProjection(work, b); err != nil {
		return nil, err
	}
	r.intake, err = b.requests.Consume(func(m jetstream.Msg) {
		r.intakePool.Go(func() { s.handleIntake(work, b, m) })
	}, jetstream.PullMaxMessages(s.cfg.Concurrency), jetstream.PullExpiry(5*time.Second),
		jetstream.ConsumeErrHandler(s.consumeErr("intake")))
	if err != nil {
		r.proj.stop()
		return nil, fmt.Errorf("dispatcher: consume %s: %w", lifecycle.StreamRequests, err)
	}
	if r.msvc, err = s.startMicro(work, r.microPool); err != nil {
		r.intake.Stop()
		r.proj.stop()
		return nil, err
	}
	if s.cfg.HTTPAddr == "" {
		return r, nil
	}
	r.srv = &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	addr, httpErr, err := svc.ServeHTTP("dispatcher", config.Var(s.cfg, "HTTPAddr"), s.cfg.HTTPAddr, r.srv, nil)
	if err != nil {
		_ = r.msvc.Stop()
		r.intake.Stop()
		r.proj.stop()
		return nil, err
	}
	r.httpErr = httpErr
	s.log.Info("http api listening", "addr", addr.String(), "auth", !s.principals.Open(), "principals", s.principals.Len())
	return r, nil
}

// shutdown stops taking requests and lets those in flight finish for
// ShutdownTimeout; past it they are abandoned (they are redelivered or
// retried).
func (s *Service) shutdown(r *serving, abandon context.CancelFunc) {
	s.log.Info("dispatcher stopping: no new requests; waiting for in-flight ones", "shutdown_timeout", s.cfg.ShutdownTimeout)
	s.stop()
	if err := r.msvc.Stop(); err != nil {
		s.log.Warn("stop micro service", "err", err)
	}
	r.intake.Drain()
	r.proj.drain()
	if r.srv != nil {
		go func() {
			sctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
			defer cancel()
			if err := r.srv.Shutdown(sctx); err != nil {
				s.log.Warn("http shutdown", "err", err)
			}
		}()
	}
	done := make(chan struct{})
	go func() {
		<-r.intake.Closed()
		r.proj.wait()
		r.intakePool.Wait()
		r.microPool.Wait()
		close(done)
	}()
	svc.AwaitWork(s.log, done, s.cfg.ShutdownTimeout, func() {
		abandon()
		r.intake.Stop()
		r.proj.stop()
	}, "shutdown timeout passed: abandoning in-flight requests (they are redelivered or retried)", "in-flight requests did not end")
	if r.srv != nil {
		_ = r.srv.Close()
	}
}

func (s *Service) closeConn() { svc.Release(s.nc, s.ownConn) }

func (s *Service) consumeErr(door string) jetstream.ConsumeErrHandler {
	return svc.ConsumeErrs(s.log, "door", door)
}

// startMicro registers the micro service `agora` with its three verbs
// (docs/dispatcher.md, "The micro service"). micro times a request from
// the handler's call to its return and counts an error when the handler
// answered with Request.Error, and NATS delivers one subscription's
// messages one at a time; so each verb is served by several endpoints,
// lanes, on its subject in one queue group: a lane handles its request to
// the end before it returns, while the others take the next requests. The
// lanes of every verb share the pool, the door's bound.
func (s *Service) startMicro(ctx context.Context, p *svc.Pool) (micro.Service, error) {
	ms, err := micro.AddService(s.nc, micro.Config{
		Name: "agora", Version: buildinfo.Version(),
		Description: "Agora dispatcher: dispatch, cancel and status",
		Metadata:    map[string]string{"instance": s.cfg.ID, "source": s.source},
	})
	if err != nil {
		return nil, fmt.Errorf("dispatcher: micro service: %w", err)
	}
	g := ms.AddGroup("agora.api")
	for _, v := range []struct {
		name string
		h    func(context.Context, micro.Request)
	}{{"dispatch", s.microDispatch}, {"cancel", s.microCancel}, {"status", s.microStatus}} {
		h := func(r micro.Request) { v.h(ctx, r) }
		// agora.api.<verb> for trusted users, agora.api.<verb>.<user> for a
		// user granted only its own (natsCaller).
		if err := svc.AddLanes(g, p, v.name, v.name, map[string]string{"verb": v.name}, h); err != nil {
			_ = ms.Stop()
			return nil, fmt.Errorf("dispatcher: %w", err)
		}
		if err := svc.AddLanes(g, p, v.name+"-caller", v.name+".*", map[string]string{"verb": v.name, "caller": "subject"}, h); err != nil {
			_ = ms.Stop()
			return nil, fmt.Errorf("dispatcher: %w", err)
		}
	}
	return ms, nil
}

// verdict is what becomes of a stream message (pkg/consume's verdict),
// decided by the message's handler and applied in one place, settle.
type verdict = consume.Verdict

var (
	ack       = consume.Ack()                // done (or a duplicate)
	retryLate = consume.Nak(2 * time.Second) // a temporary failure: redeliver after a delay
)

// term: poison; never redeliver.
func term(why string) verdict { return consume.Term(why) }

func (s *Service) settle(m jetstream.Msg, v verdict, log *slog.Logger) {
	if err := consume.Settle(context.Background(), m, v); err != nil {
		log.Warn("settle message", "err", err, "action", v.String())
	}
}

// shard picks the projection shard of a lifecycle message: events of one
// dispatch always go to the same shard, in stream order.
func shard(subject string, n int) int {
	id := subject
	if a, err := lifecycle.ParseLifecycleSubject(subject); err == nil {
		id = a.DispatchID
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	return int(h.Sum32() % uint32(n))
}
