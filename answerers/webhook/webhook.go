// Package webhook is Agora's generic notifier: it POSTs every question
// asked on its routes to a configured URL as signed JSON — the question,
// its options each with a signed answer link, the deadline — so any
// system (e-mail, chat, a ticket queue) can bring it to a person. It does
// not answer: answers come back through the links, which the inbox serves,
// or through the normal answer door (docs/webhook.md).
//
// Each route's asked events are consumed through the route's durable
// answerer-<route> on AGORA_QUESTIONS. A question no longer asked is
// skipped; a POST that fails is retried with backoff (Retry-After
// honoured); one that keeps failing, or that the receiver refuses (a 4xx
// other than 408 and 429), declines the question to the route's fallback,
// so it is never silently stuck.
package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/agora-dispatch/agora/internal/clip"
	"github.com/agora-dispatch/agora/internal/hook"
	"github.com/agora-dispatch/agora/internal/svc"
	"github.com/agora-dispatch/agora/pkg/answerer"
	"github.com/agora-dispatch/agora/pkg/answerlink"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/consume"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// Deps are the notifier's collaborators. Every field is optional.
type Deps struct {
	// Conn is an existing NATS connection, which stays the caller's; when
	// nil, New connects to Config.NATSURL and Run closes it.
	Conn *nats.Conn
	// Logger receives structured logs; default slog.Default().
	Logger *slog.Logger
	// Registerer receives the metrics; default a new registry.
	Registerer prometheus.Registerer
	// HTTPClient makes the POSTs; default one with Config.Timeout.
	HTTPClient *http.Client
}

// Server is a webhook notifier. Create it with New and run it with Run.
type Server struct {
	cfg      Config
	nc       *nats.Conn
	c        *client.Client
	ownConn  bool
	log      *slog.Logger
	http     *http.Client
	links    *answerlink.Minter
	metrics  *metrics
	gatherer prometheus.Gatherer
	ready    chan struct{}
	running  atomic.Bool
}

// New checks cfg and prepares the notifier. It connects to NATS when deps
// has no Conn; it does not touch JetStream until Run.
func New(cfg Config, deps Deps) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("webhook: config: %w", err)
	}
	cfg = cfg.withDefaults()
	// A redirect is never followed: it would send the signed body and its
	// signature to a URL nobody configured (docs/webhook.md).
	s := &Server{cfg: cfg, log: svc.Logger(deps.Logger, "service", "webhook"), http: hook.NoRedirects(deps.HTTPClient, cfg.Timeout), ready: make(chan struct{})}
	if cfg.LinkKey != "" {
		m, err := answerlink.New(cfg.LinkKey)
		if err != nil {
			return nil, fmt.Errorf("webhook: %w", err)
		}
		s.links = m
	}
	reg, gatherer := svc.Registry(deps.Registerer)
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	s.metrics, s.gatherer = m, gatherer
	if s.c, s.nc, s.ownConn, err = svc.Client(nil, deps.Conn, "webhook", cfg.NATSURL, cfg.NATSCreds, s.log); err != nil {
		return nil, err
	}
	return s, nil
}

// Ready is closed once Run consumes every route.
func (s *Server) Ready() <-chan struct{} { return s.ready }

// Run posts the routes' questions until ctx ends. It fails at once when
// the streams are not provisioned. Run may be called once.
func (s *Server) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("webhook: Run called twice")
	}
	if s.ownConn {
		defer s.nc.Close()
	}
	js, err := jetstream.New(s.nc)
	if err != nil {
		return fmt.Errorf("webhook: jetstream: %w", err)
	}
	bctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	consumers := map[string]jetstream.Consumer{}
	for _, route := range s.cfg.Routes {
		durable := "answerer-" + route
		c, err := js.CreateOrUpdateConsumer(bctx, lifecycle.StreamQuestions, jetstream.ConsumerConfig{
			Durable: durable, Description: "answerer for route " + route + " (webhook)",
			FilterSubject: "agora.questions." + route + ".*.asked",
			AckPolicy:     jetstream.AckExplicitPolicy, AckWait: ackWait, MaxDeliver: -1,
			MaxAckPending: 64, DeliverPolicy: jetstream.DeliverAllPolicy,
		})
		if err != nil {
			return fmt.Errorf("webhook: consumer %s on %s: %w", durable, lifecycle.StreamQuestions, err)
		}
		consumers[route] = c
	}
	var srv *http.Server
	if s.cfg.HTTPAddr != "" {
		ln, err := net.Listen("tcp", s.cfg.HTTPAddr)
		if err != nil {
			return fmt.Errorf("webhook: %s: %w", s.cfg.HTTPAddr, err)
		}
		srv = &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
	}
	var wg sync.WaitGroup
	for route, c := range consumers {
		wg.Go(func() { s.pull(ctx, route, c) })
	}
	close(s.ready)
	s.log.Info("webhook started", "routes", s.cfg.Routes, "url", s.cfg.URL, "links", s.links != nil)
	<-ctx.Done()
	wg.Wait()
	if srv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = srv.Shutdown(sctx)
		cancel()
	}
	s.log.Info("webhook stopped")
	return nil
}

// Handler serves /healthz and /metrics.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.gatherer, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		status, code := "ok", http.StatusOK
		if s.nc.Status() != nats.CONNECTED {
			status, code = "nats "+strings.ToLower(s.nc.Status().String()), http.StatusServiceUnavailable
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(map[string]string{"status": status})
	})
	return mux
}

// ackWait is the consumer's AckWait; a delivery in progress (retrying a
// POST) is kept alive with in-progress acks.
const ackWait = 30 * time.Second

// pull handles the route's asked events one at a time until ctx ends. A
// delivery in flight is stopped with ctx and its question handed back.
func (s *Server) pull(ctx context.Context, route string, c jetstream.Consumer) {
	log := s.log.With("route", route)
	_ = consume.Run(ctx, c, func(ctx context.Context, m jetstream.Msg) consume.Verdict {
		return s.handle(ctx, route, m, log)
	}, consume.Options{PullExpiry: 5 * time.Second, KeepAlive: consume.KeepAliveEvery(ackWait), ShutdownTimeout: -1, Logger: log})
}

// handle delivers one asked event; its verdict settles the message.
func (s *Server) handle(ctx context.Context, route string, m jetstream.Msg, log *slog.Logger) consume.Verdict {
	q, _, err := answerer.DecodeQuestion(m)
	if err != nil {
		log.Error("undecodable question terminated", "subject", m.Subject(), "err", err)
		return consume.Term("")
	}
	log = log.With("question_id", q.QuestionID)
	switch result := s.deliver(ctx, route, q, log); result {
	case resultStopping:
		return consume.Nak(time.Second)
	case resultDeclineFailed:
		return consume.Nak(5 * time.Second)
	default:
		s.metrics.deliveries.WithLabelValues(route, result).Inc()
		return consume.DoubleAck()
	}
}

// Results of one delivery, as counted in agora_webhook_deliveries_total.
const (
	resultDelivered     = "delivered"
	resultSkipped       = "skipped"  // no longer asked on this route
	resultDeclined      = "declined" // the POST failed for good: sent to the fallback
	resultStopping      = "stopping"
	resultDeclineFailed = "decline-failed"
)

// deliver POSTs q until the receiver takes it, the question closes, or the
// attempts run out (then it is declined).
func (s *Server) deliver(ctx context.Context, route string, q *lifecycle.Question, log *slog.Logger) string {
	body, err := s.body(route, q)
	if err != nil {
		log.Error("question not posted: body", "err", err)
		return s.decline(ctx, route, q, "webhook: "+err.Error(), log)
	}
	var last string
	for attempt := 1; ; attempt++ {
		if !s.waiting(ctx, route, q.QuestionID) {
			log.Info("question no longer waits on this route: not posted")
			return resultSkipped
		}
		retryAfter, permanent, err := s.post(ctx, q.QuestionID, body)
		if err == nil {
			log.Info("question posted", "attempt", attempt)
			return resultDelivered
		}
		last = err.Error()
		if ctx.Err() != nil {
			return resultStopping
		}
		if permanent || attempt >= s.cfg.Attempts {
			log.Warn("question not posted: declining it to the route's fallback", "attempt", attempt, "err", err)
			return s.decline(ctx, route, q, fmt.Sprintf("webhook: the question could not be posted (%d attempts): %s", attempt, last), log)
		}
		wait := s.backoff(attempt)
		if retryAfter > 0 {
			wait = retryAfter
		}
		s.metrics.retries.WithLabelValues(route).Inc()
		log.Warn("post failed; retrying", "attempt", attempt, "retry_in", wait, "err", err)
		if !sleep(ctx, wait) {
			return resultStopping
		}
	}
}

func (s *Server) backoff(attempt int) time.Duration { return hook.Backoff(s.cfg.Backoff, attempt) }

// post sends one signed POST. It reports a Retry-After the receiver asked
// for, and whether the failure is one a retry cannot fix.
func (s *Server) post(ctx context.Context, qid string, body []byte) (retryAfter time.Duration, permanent bool, err error) {
	retryAfter, permanent, err = hook.Post(ctx, s.http, hook.Request{URL: s.cfg.URL, Secret: s.cfg.Secret, EventID: qid, Body: body,
		Header: http.Header{"User-Agent": {"agora-webhook"}}})
	if errors.Is(err, hook.ErrRedirect) {
		err = fmt.Errorf("%w; set AGORA_WEBHOOK_URL to the receiver's own URL", err)
	}
	return retryAfter, permanent, err
}

// waiting reports whether the question still waits on route, as the
// router says (agora.api.questions.<route>: the notifier reads no question
// record); true when it cannot tell.
func (s *Server) waiting(ctx context.Context, route, qid string) bool {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	page, err := s.c.WaitingOnRoute(rctx, route, client.WaitingRequest{QuestionID: qid})
	if err != nil {
		return true
	}
	return len(page.Questions) == 1
}

// decline sends the question to the route's fallback.
func (s *Server) decline(ctx context.Context, route string, q *lifecycle.Question, reason string, log *slog.Logger) string {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	rep, err := s.c.Decline(dctx, q.QuestionID, "answerer:webhook", clip.String(reason, 1000), client.AnswerVia(route))
	var ae *client.AnswerError
	switch {
	case err == nil:
		log.Info("question declined to the fallback", "status", rep.Status)
	case errors.As(err, &ae) && ae.Reply.Status != client.AnswerRetry:
		log.Info("decline not taken: the question moved on", "status", ae.Reply.Status, "reason", ae.Reply.Reason)
	default:
		log.Warn("decline not delivered; will retry", "err", err)
		return resultDeclineFailed
	}
	s.metrics.declined.WithLabelValues(route).Inc()
	return resultDeclined
}

func sleep(ctx context.Context, d time.Duration) bool { return hook.Sleep(ctx, d) }
