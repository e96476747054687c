// Package slack is an Agora answerer that asks people in Slack: every
// question on the routes it serves becomes a Block Kit message in a
// channel or a direct message, answered with its buttons, a menu or a
// modal (docs/slack.md).
//
// For each route in its settings file it consumes the route's asked
// events through the route's durable consumer (answerer-<route> on
// AGORA_QUESTIONS, the one pkg/answerer uses) and posts one message per
// question with chat.postMessage. It does not use pkg/answerer's Serve:
// a person answers minutes or hours later through Slack's interactivity
// request, not within the handler's acknowledgement window, so a
// question's event is acknowledged once its message is posted. A message
// that cannot be posted (Slack down, a bad channel) after the configured
// attempts, 429s waiting their Retry-After, declines the question to the
// route's fallback through agora.api.answer.<route>, so no question is
// left silently waiting.
//
// Handler serves POST /slack/interactions, Slack's interactivity request
// URL; with an app-level token (Config.AppToken) the same interactions
// also arrive over Socket Mode, which needs no public URL. Each HTTP
// request's signature is checked as Slack documents it (v0,
// HMAC-SHA256 of "v0:<timestamp>:<body>" with the signing secret,
// constant-time compare, timestamp within five minutes) and a signature
// seen before is refused: forged, stale and replayed requests get 401 and
// change nothing. Answers go through the route's endpoint
// (client.AnswerVia) with answered_by "slack:<team_id>/<user_id>"; a user
// outside the route's allow-list gets an ephemeral refusal.
//
// Every copy stays true: the message of each open question (channel and
// ts) is kept in the KV bucket agora_slack_messages under
// <route>.<question_id>, so it survives a restart; a watch of the
// agora_questions bucket updates the message with chat.update (what
// happened, by whom, when; no buttons) when the question is answered
// anywhere, withdrawn, expired or moved to another route, and then
// deletes the entry.
package slack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/agora-dispatch/agora/internal/config"
	"github.com/agora-dispatch/agora/internal/svc"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// BucketMessages is the KV bucket of the Slack messages of open
// questions: key <route>.<question_id>, value the channel and ts.
const BucketMessages = lifecycle.BucketSlackMessages

// InteractionsPath is where Handler serves Slack's interactivity
// requests.
const InteractionsPath = "/slack/interactions"

// Deps are the answerer's collaborators. Every field is optional.
type Deps struct {
	// Client is the Agora client to answer through; it stays the
	// caller's. When nil, Conn is used.
	Client *client.Client
	// Conn is an existing NATS connection, which stays the caller's;
	// when both are nil, New connects to Config.NATSURL and Run closes
	// that connection.
	Conn *nats.Conn
	// Logger receives structured logs; default slog.Default().
	Logger *slog.Logger
	// Registerer receives the metrics; default a new registry, served at
	// /metrics when Run serves HTTP itself.
	Registerer prometheus.Registerer
	// HTTPClient calls the Slack Web API; default a client with a 30s
	// timeout.
	HTTPClient *http.Client
}

// Server is the Slack answerer. Create it with New; Run serves the
// routes, Handler serves Slack's interactivity requests. A Server is
// safe for concurrent use.
type Server struct {
	cfg      Config
	settings Settings
	c        *client.Client
	nc       *nats.Conn
	ownConn  bool
	log      *slog.Logger
	metrics  *metrics
	gatherer prometheus.Gatherer
	api      *api
	replays  *replays
	// httpClient calls the Web API (Deps.HTTPClient).
	httpClient *http.Client

	// Set by Run before ready is closed.
	questions jetstream.KeyValue
	messages  jetstream.KeyValue
	index     *index
	ready     chan struct{}
	running   atomic.Bool

	// work owns the goroutines an interaction starts after its reply.
	work    tracker
	workCtx context.Context
	stopAll context.CancelFunc

	reconcileQ chan string
}

// New checks cfg, reads the settings file and prepares the answerer. It
// connects to NATS when deps has neither Client nor Conn; it does not
// touch JetStream until Run.
func New(cfg Config, deps Deps) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("slack: config: %w", err)
	}
	cfg = cfg.withDefaults()
	settings, err := LoadSettings(cfg.SettingsFile)
	if err != nil {
		return nil, fmt.Errorf("%w (%s)", err, config.Var(cfg, "SettingsFile"))
	}
	s := &Server{cfg: cfg, settings: settings, log: svc.Logger(deps.Logger, "service", "slack-answerer"), ready: make(chan struct{}), replays: newReplays(),
		reconcileQ: make(chan string, 1024), index: newIndex()}
	reg, gatherer := svc.Registry(deps.Registerer)
	s.gatherer = gatherer
	if s.metrics, err = newMetrics(reg); err != nil {
		return nil, err
	}
	s.httpClient = deps.HTTPClient
	if s.httpClient == nil {
		s.httpClient = &http.Client{Timeout: 30 * time.Second}
	}
	s.api = newAPI(cfg, s.httpClient, s.log, s.metrics)
	s.workCtx, s.stopAll = context.WithCancel(context.Background())
	if s.c, s.nc, s.ownConn, err = svc.Client(deps.Client, deps.Conn, "slack-answerer", cfg.NATSURL, cfg.NATSCreds, s.log); err != nil {
		return nil, err
	}
	return s, nil
}

// Routes returns the routes served, sorted.
func (s *Server) Routes() []string { return s.settings.RouteNames() }

// Ready is closed once Run has bound its buckets and consumers and loaded
// the messages of open questions.
func (s *Server) Ready() <-chan struct{} { return s.ready }

// Handler serves POST /slack/interactions and GET /slack/healthz. It may
// be mounted before Run starts: until Run is ready, interactions get 503
// (Slack shows the person an error and nothing changes).
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+InteractionsPath, s.interactions)
	mux.HandleFunc("GET /slack/healthz", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-s.ready:
			_, _ = w.Write([]byte("ok\n"))
		default:
			http.Error(w, "starting", http.StatusServiceUnavailable)
		}
	})
	return mux
}

// Run serves the routes until ctx ends: it creates the messages bucket
// and each route's durable consumer when missing, posts the questions,
// keeps the messages true, and serves Handler (and /metrics) itself when
// Config.HTTPAddr is set. On cancel it stops pulling, lets in-flight
// posts and interactions finish for up to the shutdown timeout, stops
// the HTTP server and closes the connection New opened. It returns nil
// after a clean stop. Run may be called once.
func (s *Server) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("slack: Run called twice")
	}
	defer s.closeConn()
	defer s.stopAll()
	consumers, err := s.bind(ctx)
	if errors.Is(err, errStopped) {
		return nil
	}
	if err != nil {
		return err
	}

	// The loops below stop when loopCtx ends; posts in flight then get
	// the shutdown timeout through workCtx.
	loopCtx, stopLoops := context.WithCancel(ctx)
	defer stopLoops()
	var loops sync.WaitGroup
	loaded := make(chan struct{})
	loops.Go(func() { s.watchMessages(loopCtx, loaded) })
	select {
	case <-loaded:
	case <-ctx.Done():
		stopLoops()
		loops.Wait()
		return nil
	}
	loops.Go(func() { s.watchQuestions(loopCtx) })
	loops.Go(func() { s.reconciler(loopCtx) })
	for route, c := range consumers {
		loops.Go(func() { s.pull(loopCtx, route, c) })
	}
	if s.cfg.AppToken != "" {
		loops.Go(func() { s.socketMode(loopCtx) })
	}
	close(s.ready)
	s.log.Info("slack answerer started", "routes", s.Routes(), "open_messages", s.index.len())

	srv, httpErr, err := s.serveHTTP()
	if err != nil {
		stopLoops()
		loops.Wait()
		return err
	}
	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-httpErr:
		s.log.Error("http server failed; stopping", "err", runErr)
	}
	if srv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = srv.Shutdown(sctx)
		cancel()
	}
	stopLoops()
	done := make(chan struct{})
	go func() { loops.Wait(); s.work.close(); close(done) }()
	select {
	case <-done:
	case <-time.After(s.cfg.ShutdownTimeout):
		s.log.Warn("shutdown timeout passed: cancelling Slack calls in flight")
		s.stopAll()
		<-done
	}
	s.log.Info("slack answerer stopped")
	return runErr
}

// errStopped is bind's error when ctx ended before the buckets opened.
var errStopped = errors.New("slack: stopped while binding")

// bind opens the questions and messages buckets and each route's consumer
// of asked events.
func (s *Server) bind(ctx context.Context) (map[string]jetstream.Consumer, error) {
	js, err := jetstream.New(s.nc)
	if err != nil {
		return nil, fmt.Errorf("slack: jetstream: %w", err)
	}
	bctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if s.questions, err = js.KeyValue(bctx, lifecycle.BucketQuestions); err != nil {
		if ctx.Err() != nil {
			return nil, errStopped
		}
		return nil, fmt.Errorf("slack: bucket %s: %w (run `agora dev`, or provision the streams first)", lifecycle.BucketQuestions, err)
	}
	if s.messages, err = js.KeyValue(bctx, BucketMessages); err != nil {
		if ctx.Err() != nil {
			return nil, errStopped
		}
		return nil, fmt.Errorf("slack: bucket %s: %w (run `agora dev`, or provision the streams first)", BucketMessages, err)
	}
	consumers := map[string]jetstream.Consumer{}
	for _, route := range s.Routes() {
		c, err := s.consumer(bctx, js, route)
		if err != nil {
			return nil, err
		}
		consumers[route] = c
	}
	return consumers, nil
}

// serveHTTP serves the interactions endpoint and the metrics when
// Config.HTTPAddr is set; it returns the server (nil without one) and the
// channel of its failure.
func (s *Server) serveHTTP() (*http.Server, <-chan error, error) {
	if s.cfg.HTTPAddr == "" {
		return nil, nil, nil
	}
	mux := http.NewServeMux()
	mux.Handle("/slack/", s.Handler())
	if s.gatherer != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(s.gatherer, promhttp.HandlerOpts{}))
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	addr, httpErr, err := svc.ServeHTTP("slack", config.Var(s.cfg, "HTTPAddr"), s.cfg.HTTPAddr, srv, nil)
	if err != nil {
		return nil, nil, err
	}
	s.log.Info("http listening", "url", "http://"+addr.String()+InteractionsPath)
	return srv, httpErr, nil
}

// questionAckWait is how long a posting may go without news before
// JetStream redelivers the asked event.
const questionAckWait = 30 * time.Second

// consumer creates or binds the route's durable consumer of asked events.
func (s *Server) consumer(ctx context.Context, js jetstream.JetStream, route string) (jetstream.Consumer, error) {
	durable := "answerer-" + route
	c, err := js.CreateOrUpdateConsumer(ctx, lifecycle.StreamQuestions, jetstream.ConsumerConfig{
		Durable: durable, Description: "answerer for route " + route + " (Slack)",
		FilterSubject: "agora.questions." + route + ".*.asked",
		AckPolicy:     jetstream.AckExplicitPolicy, AckWait: questionAckWait, MaxDeliver: -1,
		MaxAckPending: 64, DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("slack: consumer %s on %s: %w", durable, lifecycle.StreamQuestions, err)
	}
	return c, nil
}

func (s *Server) closeConn() {
	if !s.ownConn {
		return
	}
	if err := s.nc.Drain(); err != nil {
		s.nc.Close()
	}
}

// goWork runs f on a goroutine Run waits for on stop; after the stop it
// does nothing.
func (s *Server) goWork(f func(ctx context.Context)) {
	s.work.goFunc(func() { f(s.workCtx) })
}

// tracker is a WaitGroup that refuses new work once closed.
type tracker struct {
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

func (t *tracker) goFunc(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return
	}
	t.wg.Go(f)
}

// close refuses new work and waits for the work under way.
func (t *tracker) close() {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	t.wg.Wait()
}
