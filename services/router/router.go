// Package router turns a sub-agent's question into an answer and the
// answer into the thread's next round (docs/wire.md, "Questions and answers";
// docs/router.md).
//
// The router consumes `needs_input` events (durable consumer `router` on
// AGORA_LIFECYCLE). For each it creates a question record in the
// agora_questions bucket, keyed by the question id (q-<dispatch_id>), and
// publishes `question.asked` on agora.questions.<route>.<question_id>.asked,
// where the route is chosen by the routing file. Answerers on that route
// answer through the NATS micro endpoint agora.api.answer.<route> (service
// "agora-router", endpoint answer-route), which replies synchronously, or
// on agora.answers.<route>.<question_id> in AGORA_ANSWERS (durable consumer
// `router-answers`). NATS names no sender, so these doors are scoped by
// subject: the route is the subject's, and an answer or decline to a
// question that is not on that route now (it escalated or fell back
// elsewhere, or was never there) is refused as invalid, with the reason,
// and recorded in the question's history. Subject permissions then decide
// which routes a user may answer. The generic endpoint agora.api.answer
// (endpoint answer) answers any route; deployments grant it only to
// trusted users (operators, the CLI, an inbox that serves every route).
// Every history entry names its door. The first valid answer wins by
// compare-and-set on the record's revision; it is re-dispatched exactly once
// on agora.requests.<subagent> (Nats-Msg-Id = the question id) as a new
// request of the same thread, round + 1, carrying the answer and the
// sub-agent's partial state. Later, duplicate and invalid answers are
// refused with a reason and kept in the question's history.
//
// Deadlines, escalation ladders and expiry actions are stored in the record,
// so they survive restarts: every replica watches the bucket and acts on
// questions past due with compare-and-set, so two replicas never both act.
// Every change that must publish events writes them into the record first
// (an outbox with fixed event ids) and publishes them after; whoever sees
// them later — another replica, or this one after a restart — publishes
// them again, and the streams' duplicate windows drop the copies.
//
// A dispatch has exactly one terminal event. When a question expires with
// on_expiry fail or cancel, when an answer would take the thread past its
// round limit, or when the thread is cancelled while paused, the paused
// dispatch already has its terminal event (needs_input), so the thread's
// end is recorded on a new dispatch id of the same thread (round + 1,
// parent = the paused dispatch) whose only lifecycle event is that end:
// failed unanswered, failed max-rounds or cancelled. That id is chosen once,
// by the compare-and-set that ends the question, and kept in the record.
//
// A thread paused on a question is cancelled through the dispatcher, which
// marks the paused dispatch's record (cancel_requested in agora_dispatches)
// and then publishes the core message agora.control.cancel-thread.<thread_id>.
// The router withdraws the question when it gets that message, and also
// when it finds the mark: before it accepts an answer, acts on a deadline or
// asks the question, at start and every minute. Withdrawing publishes
// question.withdrawn and ends the thread cancelled, with the canceller's
// name and reason, so a client waiting on the thread sees it end.
//
// Questions are asked once (docs/router.md, "Ask once"): a question that
// matches one still waiting on its route joins it (status joined), one answer
// resumes every waiting thread, each with its own re-dispatch, and a route
// may remember its answers (agora_decisions) or take an answerer's suggestion
// at its auto_accept.
//
// The question record is JSON: the fields of lifecycle.Question plus
// traceparent, origin, ladder, step, on_expiry, asks, declined,
// partial_state or partial_state_ref, request (the settings the re-dispatch
// copies), max_rounds, comment, next_dispatch_id, outcome, history (every
// answer attempt and decline with its result and reason), match_key,
// dedupe_key and open_rev (what it matches, and the open.<match> key it
// holds), thread_left, fanout, release and memorize (what asking once still
// owes after it ended), pending (events not yet published) and updated_at.
package router

import (
	"context"
	"encoding/json"
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
	"github.com/agora-dispatch/agora/internal/chain"
	"github.com/agora-dispatch/agora/internal/config"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/internal/svc"
	"github.com/agora-dispatch/agora/pkg/consume"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// MicroName is the name of the router's NATS micro service, which serves
// agora.api.answer and agora.api.answer.<route>.
const MicroName = "agora-router"

// opTimeout bounds the NATS work of one message or request.
const opTimeout = 15 * time.Second

// Deps are the router's collaborators (svc.Deps). Every field is
// optional.
type Deps = svc.Deps

// Service is a router. Create it with New and start it with Run.
type Service struct {
	cfg      Config
	nc       *nats.Conn
	ownConn  bool
	log      *slog.Logger
	metrics  *metrics
	gatherer prometheus.Gatherer
	source   string
	routes   atomic.Pointer[Routes]

	js         jetstream.JetStream
	chains     *chain.Reader // a dispatch's status, when an answer has no question (unknown)
	store      store
	dispatches jetstream.KeyValue
	subagents  jetstream.KeyValue
	decisions  jetstream.KeyValue // open questions by match, remembered decisions
	events     jetstream.Stream
	asks       jetstream.Consumer
	answers    jetstream.Consumer

	locks     [64]sync.Mutex
	joins     joinQueues // joins to one question, written together (once.go)
	idx       *index
	cancelled *cancelMemo
	inflight  sync.Map // question ids being advanced by the scanner
	// work is Run's context for in-flight work, which outlives a stop by
	// ShutdownTimeout; background follow-ups run in it.
	work context.Context

	running atomic.Bool
	serving atomic.Bool
	ready   chan struct{}
}

// New checks cfg, loads the routing file and prepares a router. An invalid
// routing file is an error naming its line and problem. New connects to
// NATS when deps.Conn is nil; it does not touch JetStream until Run.
func New(cfg Config, deps Deps) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("router: config: %w", err)
	}
	cfg = cfg.withDefaults()
	routes := DefaultRoutes()
	if cfg.RoutesFile != "" {
		r, err := LoadRoutes(cfg.RoutesFile)
		if err != nil {
			return nil, fmt.Errorf("%w (%s)", err, config.Var(cfg, "RoutesFile"))
		}
		routes = r
	}
	s := &Service{cfg: cfg, log: svc.Logger(deps.Logger, "service", "router", "router_id", cfg.ID), ready: make(chan struct{}), idx: newIndex(), cancelled: newCancelMemo()}
	s.routes.Store(routes)
	reg, gatherer := svc.Registry(deps.Registerer)
	s.gatherer = gatherer
	m, err := newMetrics(reg, s.idx)
	if err != nil {
		return nil, err
	}
	s.metrics = m
	s.source = lifecycle.Source("router", cfg.ID)
	if s.nc, s.ownConn, err = svc.Conn(deps.Conn, "router", cfg.ID, cfg.NATSURL, cfg.NATSCreds, s.log); err != nil {
		return nil, err
	}
	return s, nil
}

// Routes returns the routes in use.
func (s *Service) Routes() *Routes { return s.routes.Load() }

// Reload reads the routing file again (on SIGHUP). An invalid file is
// logged and returned, and the routes in use stay. Questions already asked
// keep their stored deadline, ladder and expiry action; the new routes
// apply to new questions, escalation targets and fallbacks. Reload is safe
// to call at any time, concurrently with Run.
func (s *Service) Reload() error {
	if s.cfg.RoutesFile == "" {
		s.log.Info("no routing file to reload; the built-in routes stay", "var", config.Var(s.cfg, "RoutesFile"))
		return nil
	}
	r, err := LoadRoutes(s.cfg.RoutesFile)
	if err != nil {
		s.log.Error("routing file is invalid: keeping the previous routes", "file", s.cfg.RoutesFile, "err", err)
		return err
	}
	s.routes.Store(r)
	s.log.Info("routes reloaded", "file", s.cfg.RoutesFile, "routes", len(r.list))
	return nil
}

// Ready is closed once Run serves every door.
func (s *Service) Ready() <-chan struct{} { return s.ready }

// bind looks up the router's buckets, stream and consumers, retrying a
// timeout (a cluster electing leaders) until ctx ends; a missing one stops
// the router at once with the provisioning hint (svc.Bind).
func (s *Service) bind(ctx context.Context) error {
	return svc.Bind(ctx, s.log, opTimeout, s.bindOnce)
}

func (s *Service) bindOnce(ctx context.Context) error {
	js, err := jetstream.New(s.nc)
	if err != nil {
		return fmt.Errorf("router: jetstream: %w", err)
	}
	s.js = js
	o := svc.NewOpener(ctx, js, "router")
	kv := o.KeyValue(lifecycle.BucketQuestions)
	if err := o.Err(); err != nil {
		return err
	}
	s.store = store{kv: kv, js: js}
	s.dispatches = o.KeyValue(lifecycle.BucketDispatches)
	s.subagents = o.KeyValue(lifecycle.BucketSubagents)
	s.decisions = o.KeyValue(lifecycle.BucketDecisions)
	s.events = o.Stream(lifecycle.StreamLifecycle)
	s.asks = o.Consumer(lifecycle.StreamLifecycle, provision.ConsumerRouter)
	s.answers = o.Consumer(lifecycle.StreamAnswers, provision.ConsumerRouterAns)
	if err := o.Err(); err != nil {
		return err
	}
	// Last: its subscription is made once, by a bind that succeeds.
	if s.chains, err = chain.NewReader(js); err != nil {
		return fmt.Errorf("router: %w", err)
	}
	return nil
}

// Run serves until ctx ends, then shuts down gracefully: it stops the micro
// endpoint and the consumers, lets in-flight work finish for up to
// ShutdownTimeout, and closes the connection New opened. Unacknowledged
// messages are redelivered to another router; records keep every decision
// and the events still to publish. Run returns nil after a clean shutdown;
// it may be called once.
func (s *Service) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("router: Run called twice")
	}
	if err := s.bind(ctx); err != nil {
		s.closeConn()
		return err
	}
	defer s.chains.Close() // last: work finishing may still read a status
	// work outlives ctx by ShutdownTimeout so in-flight work finishes.
	work, abandon := context.WithCancel(context.WithoutCancel(ctx))
	defer abandon()
	s.work = work
	r, err := s.start(work, abandon)
	if err != nil {
		abandon()
		s.closeConn()
		return err
	}
	s.serving.Store(true)
	// The endpoints' subscriptions reach the server before Ready: a
	// request sent on Ready then finds them (not "no responders").
	if err := s.nc.FlushTimeout(5 * time.Second); err != nil {
		s.log.Warn("flush", "err", err)
	}
	close(s.ready)
	rt := s.routes.Load()
	s.log.Info("router started", "routes", rt.Source(), "route_count", len(rt.list), "tick", s.cfg.Tick, "concurrency", s.cfg.Concurrency)

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-r.httpErr:
		s.log.Error("http server failed; stopping", "err", runErr)
	}
	s.serving.Store(false)
	s.shutdown(r, abandon)
	abandon()
	<-r.watchDone
	s.closeConn()
	s.log.Info("router stopped")
	return runErr
}

// running is what a running router stops at shutdown.
type running struct {
	pool           *svc.Pool
	watchDone      <-chan struct{}
	csub           *nats.Subscription
	asks, answers  jetstream.ConsumeContext
	msvc           micro.Service
	srv            *http.Server // nil without HTTPAddr
	httpErr        <-chan error // Serve's failure; nil without HTTPAddr
	stopTick       context.CancelFunc
	tickDone       chan struct{}
	stopsOnFailure []func()
}

// start starts the router's work in order: the records' watch, the
// thread cancels, the two consumers, the micro service, the HTTP server
// and the scan loop. When a step fails, what started is stopped again,
// last first.
func (s *Service) start(work context.Context, abandon context.CancelFunc) (*running, error) {
	r := &running{pool: svc.NewPool(s.cfg.Concurrency)}
	fail := func(err error) (*running, error) {
		for i := len(r.stopsOnFailure) - 1; i >= 0; i-- {
			r.stopsOnFailure[i]()
		}
		return nil, err
	}
	watchDone, err := s.watch(work)
	if err != nil {
		return fail(err)
	}
	r.watchDone = watchDone
	r.stopsOnFailure = append(r.stopsOnFailure, func() { abandon(); <-watchDone })
	if err := s.consume(work, r); err != nil {
		return fail(err)
	}
	if err := s.startMicro(work, r); err != nil {
		return fail(err)
	}
	if s.cfg.HTTPAddr != "" {
		r.srv = &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second}
		addr, httpErr, err := svc.ServeHTTP("router", config.Var(s.cfg, "HTTPAddr"), s.cfg.HTTPAddr, r.srv, nil)
		if err != nil {
			return fail(err)
		}
		r.httpErr = httpErr
		s.log.Info("http listening", "addr", addr.String())
	}
	r.tickDone = make(chan struct{})
	tickCtx, stopTick := context.WithCancel(work)
	r.stopTick = stopTick
	go func() {
		defer close(r.tickDone)
		s.scanLoop(tickCtx, work, r.pool)
	}()
	return r, nil
}

// consume subscribes to thread cancels and consumes the needs_input and
// answers streams.
func (s *Service) consume(work context.Context, r *running) error {
	// Cancels of paused threads are core messages: subscribe before the
	// consumers start so no question is asked for a thread cancelled now.
	csub, err := s.nc.Subscribe(lifecycle.CancelThreadPrefix+"*", func(m *nats.Msg) {
		r.pool.Go(func() { s.onCancelThread(work, m) })
	})
	if err != nil {
		return fmt.Errorf("router: subscribe %s*: %w", lifecycle.CancelThreadPrefix, err)
	}
	_ = csub.SetPendingLimits(-1, -1)
	r.csub = csub
	r.stopsOnFailure = append(r.stopsOnFailure, func() { _ = csub.Unsubscribe() })

	asks, err := s.asks.Consume(func(m jetstream.Msg) {
		r.pool.Go(func() { s.settle(m, s.onNeedsInput(work, m)) })
	}, jetstream.PullMaxMessages(s.cfg.Concurrency), jetstream.PullExpiry(5*time.Second), jetstream.ConsumeErrHandler(s.consumeErr("needs_input")))
	if err != nil {
		return fmt.Errorf("router: consume needs_input: %w", err)
	}
	r.asks = asks
	r.stopsOnFailure = append(r.stopsOnFailure, asks.Stop)
	answers, err := s.answers.Consume(func(m jetstream.Msg) {
		r.pool.Go(func() { s.settle(m, s.onAnswerMsg(work, m)) })
	}, jetstream.PullMaxMessages(s.cfg.Concurrency), jetstream.PullExpiry(5*time.Second), jetstream.ConsumeErrHandler(s.consumeErr("answers")))
	if err != nil {
		return fmt.Errorf("router: consume answers: %w", err)
	}
	r.answers = answers
	r.stopsOnFailure = append(r.stopsOnFailure, answers.Stop)
	return nil
}

// startMicro adds the router's micro service and its endpoints. Each
// endpoint is served by lanes in one queue group, each handling its
// request to the end before it returns, so micro's stats time the real
// handling and count the error replies while requests are still handled
// side by side (docs/dispatcher.md, "The micro service").
func (s *Service) startMicro(work context.Context, r *running) error {
	msvc, err := micro.AddService(s.nc, micro.Config{
		Name: MicroName, Version: buildinfo.Version(),
		Description: "Agora router: answers to questions",
		Metadata:    map[string]string{"instance": s.cfg.ID, "source": s.source},
	})
	if err != nil {
		return fmt.Errorf("router: micro service: %w", err)
	}
	r.msvc = msvc
	r.stopsOnFailure = append(r.stopsOnFailure, func() { _ = msvc.Stop() })
	api := msvc.AddGroup("agora.api")
	for _, e := range []struct {
		name, subject string
		h             func(context.Context, micro.Request)
	}{
		{"answer", "answer", s.microAnswer},
		// agora.api.answer.<route>: the route is the subject's last token.
		{"answer-route", "answer.*", s.microAnswer},
		{"questions", "questions", s.microQuestions},
		// agora.api.questions.<route>: one route's waiting questions.
		{"questions-route", "questions.*", s.microQuestions},
		{"decisions", "decisions", s.microDecisions},
		{"decisions-forget", "decisions.forget", s.microForget},
		// agora.api.reverse.<route>: a person reverses an accepted suggestion.
		{"reverse-route", "reverse.*", s.microReverse},
	} {
		if err := svc.AddLanes(api, r.pool, e.name, e.subject, map[string]string{"endpoint": e.name}, func(r micro.Request) { e.h(work, r) }); err != nil {
			return fmt.Errorf("router: %w", err)
		}
	}
	return nil
}

// shutdown stops taking work and lets the work in flight finish for
// ShutdownTimeout; past it, it is abandoned (it is redelivered, or
// finished from the records).
func (s *Service) shutdown(r *running, abandon context.CancelFunc) {
	s.log.Info("router stopping: no new work; waiting for in-flight work", "shutdown_timeout", s.cfg.ShutdownTimeout)
	_ = r.msvc.Stop()
	_ = r.csub.Unsubscribe()
	r.asks.Drain()
	r.answers.Drain()
	r.stopTick()
	<-r.tickDone
	if r.srv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = r.srv.Shutdown(sctx)
		cancel()
	}
	done := make(chan struct{})
	go func() {
		<-r.asks.Closed()
		<-r.answers.Closed()
		r.pool.Wait()
		close(done)
	}()
	svc.AwaitWork(s.log, done, s.cfg.ShutdownTimeout, func() {
		abandon()
		r.asks.Stop()
		r.answers.Stop()
	}, "shutdown timeout passed: abandoning in-flight work (it is redelivered, or finished from the records)", "in-flight work did not end")
}

func (s *Service) closeConn() { svc.Release(s.nc, s.ownConn) }

func (s *Service) consumeErr(door string) jetstream.ConsumeErrHandler {
	return svc.ConsumeErrs(s.log, "door", door)
}

// Handler serves /metrics and /healthz.
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", svc.MetricsHandler(s.gatherer))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		st := s.nc.Status()
		if st != nats.CONNECTED || !s.serving.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			_ = json.NewEncoder(w).Encode(map[string]any{"status": "unavailable", "nats": st.String(), "serving": s.serving.Load()})
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"status": "ok", "nats": "connected", "router_id": s.cfg.ID, "pending_questions": s.idx.asked()})
	})
	return mux
}

// mutex serialises the work of this process on one question, which keeps
// compare-and-set conflicts for the replicas' races only.
func (s *Service) mutex(qid string) *sync.Mutex {
	return &s.locks[stripe(qid, len(s.locks))]
}

// lock blocks until it holds qid's mutex and returns what releases it:
// defer s.lock(qid)().
func (s *Service) lock(qid string) (unlock func()) {
	mu := s.mutex(qid)
	mu.Lock()
	return mu.Unlock
}

// stripe picks one of n locks for id.
func stripe(id string, n int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	return int(h.Sum32() % uint32(n))
}

// verdict is what becomes of a stream message (pkg/consume's verdict),
// decided by the message's handler and applied in one place, settle.
type verdict = consume.Verdict

// ack: done (or nothing to do).
var ack = consume.Ack()

// retryIn: a temporary failure; redeliver after d.
func retryIn(d time.Duration) verdict { return consume.Nak(d) }

// term: poison; never redeliver.
func term(why string) verdict { return consume.Term(why) }

func (s *Service) settle(m jetstream.Msg, v verdict) {
	if err := consume.Settle(context.Background(), m, v); err != nil {
		s.log.Warn("settle message", "subject", m.Subject(), "err", err)
	}
}
