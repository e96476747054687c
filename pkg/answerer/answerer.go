// Package answerer is the SDK for Agora answerers: programs that answer the
// questions sub-agents ask (docs/wire.md, "Questions and answers";
// docs/router.md).
//
// The router publishes every question on
// agora.questions.<route>.<question_id>.asked, the route being chosen by its
// routing file. [Serve] consumes the asked events of one route through a
// durable consumer (answerer-<route> on AGORA_QUESTIONS, created if
// missing, shared by every process serving the route), hands each question
// to a [Handler], and submits what the handler returns to the router's
// endpoint of that route, agora.api.answer.<route>, so it learns at once
// whether the answer was accepted. The router accepts answers and declines
// there only for questions on the route now, and deployments let a route's
// NATS user request only its own route's endpoint (not the generic
// agora.api.answer), so an answerer cannot answer another route's
// questions. A handler may answer, decline (the question then goes to the
// route's fallback), or fail: a failure is retried with backoff, and after
// the last attempt the question is declined.
//
// Questions that are no longer waiting on the route (answered, expired,
// withdrawn, or moved to another route) are acknowledged without calling
// the handler.
package answerer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"

	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/consume"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// Reply is what a Handler returns for a question: an answer or a decline.
// Build it with [Answer], [Decide] or [Decline].
type Reply struct {
	// Answer is the answer; for a question with options, one of them.
	Answer string
	// Decision is approve or reject; an approval question needs one.
	Decision string
	// Comment travels with the answer to the resumed sub-agent.
	Comment string
	// Declined refuses to answer: the router sends the question to the
	// route's fallback. Reason says why.
	Declined bool
	Reason   string
	// Suggested makes the answer a suggestion with Confidence (0 to 1):
	// the route takes it as the answer at or above its auto_accept, and
	// otherwise sends the question to its fallback with the suggestion
	// shown preselected (docs/answering.md, "Suggested answers"). Reason
	// is the rationale.
	Suggested  bool
	Confidence float64
}

// Answer is a Reply answering text.
func Answer(text string) Reply { return Reply{Answer: text} }

// Decide is a Reply to an approval question: decision is approve or
// reject.
func Decide(decision, comment string) Reply {
	return Reply{Answer: decision, Decision: decision, Comment: comment}
}

// Decline is a Reply that refuses to answer, so the route's fallback gets
// the question.
func Decline(reason string) Reply { return Reply{Declined: true, Reason: reason} }

// Suggest is a Reply that suggests option (for an approval question,
// approve or reject) with confidence between 0 and 1 and why, rather than
// answer: the route's auto_accept decides whether it answers the question
// or goes to a person preselected.
func Suggest(option string, confidence float64, rationale string) Reply {
	return Reply{Answer: option, Suggested: true, Confidence: confidence, Reason: rationale}
}

// Handler answers questions. Handle may be called concurrently (see
// WithConcurrency); ctx ends when Serve stops and its shutdown timeout has
// passed. An error is retried with backoff; after the last attempt the
// question is declined.
type Handler interface {
	Handle(ctx context.Context, q lifecycle.Question) (Reply, error)
}

// HandlerFunc adapts a function to a Handler.
type HandlerFunc func(ctx context.Context, q lifecycle.Question) (Reply, error)

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, q lifecycle.Question) (Reply, error) {
	return f(ctx, q)
}

// Report says what became of one question handled by Serve.
type Report struct {
	Question lifecycle.Question
	Reply    Reply
	// Status is the router's reply status (accepted, already_answered,
	// invalid, not_found); Reason explains it.
	Status client.AnswerStatus
	Reason string
	// Err is the handler's last error when the question was declined
	// because the handler kept failing.
	Err error
}

// ErrBadRoute reports a route name that cannot be served.
var ErrBadRoute = errors.New("answerer: invalid route name")

var routeRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

type options struct {
	answeredBy   string
	concurrency  int
	maxAttempts  int
	backoffMin   time.Duration
	backoffMax   time.Duration
	ackWait      time.Duration
	pullExpiry   time.Duration
	callTimeout  time.Duration
	shutdown     time.Duration
	durable      string
	removeOnExit bool
	log          *slog.Logger
	report       func(Report)
}

// Option configures Serve.
type Option func(*options)

// WithAnsweredBy names the answerer in answers (default "answerer:<route>").
func WithAnsweredBy(name string) Option { return func(o *options) { o.answeredBy = name } }

// WithConcurrency sets how many questions are handled at once (default 1).
func WithConcurrency(n int) Option { return func(o *options) { o.concurrency = n } }

// WithMaxAttempts sets how many times a question is handed to the handler
// before it is declined (default 5).
func WithMaxAttempts(n int) Option { return func(o *options) { o.maxAttempts = n } }

// WithBackoff sets the delay before a failed question is handled again:
// min after the first failure, doubling up to max (default 1s to 1m).
func WithBackoff(min, max time.Duration) Option {
	return func(o *options) { o.backoffMin, o.backoffMax = min, max }
}

// WithAckWait sets the consumer's AckWait, how long a question handled by
// a process that died waits before another gets it (default 30s); while
// the handler runs, Serve extends it.
func WithAckWait(d time.Duration) Option { return func(o *options) { o.ackWait = d } }

// WithShutdownTimeout sets how long handlers may run on after ctx ends
// before their context is cancelled (default 30s).
func WithShutdownTimeout(d time.Duration) Option { return func(o *options) { o.shutdown = d } }

// WithDurable names the durable consumer (default answerer-<route>).
func WithDurable(name string) Option { return func(o *options) { o.durable = name } }

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// WithReport calls f after each question is settled: answered, declined,
// or refused by the router. f runs on the handling goroutine.
func WithReport(f func(Report)) Option { return func(o *options) { o.report = f } }

// QuestionFilter returns the subject filter of a route's asked events:
// agora.questions.<route>.*.asked.
func QuestionFilter(route string) string { return "agora.questions." + route + ".*.asked" }

// Serve answers the questions of route with h until ctx ends. It creates
// the route's durable consumer when missing (idempotent), then pulls one
// question per concurrency slot. When ctx ends it stops pulling, lets
// handlers finish for up to the shutdown timeout, then cancels their
// context; unsettled questions are redelivered later. Serve returns nil
// after a clean stop, or the error that kept it from starting. nc stays
// the caller's. At start it logs a warning with the number of questions
// already waiting on the route, which it is about to answer: serve a new
// answerer on a route of its own, not on one people answer (human).
//
// What it leaves behind: the durable consumer answerer-<route> (or the
// WithDurable name) on AGORA_QUESTIONS stays on the server after Serve
// returns, on purpose: it is shared by every process serving the route and
// keeps their place, so questions asked while no answerer runs are handled
// when one starts. Remove it when the route is retired with
// `nats consumer rm AGORA_QUESTIONS answerer-<route>`, or have Serve remove
// it on a clean exit with WithRemoveOnExit (for a one-off or test
// answerer; never while other processes serve the route). See
// docs/sdk.md.
func Serve(ctx context.Context, nc *nats.Conn, route string, h Handler, opts ...Option) error {
	if !routeRE.MatchString(route) {
		return fmt.Errorf("%w: %q: want 1-64 letters, digits, '-' or '_'", ErrBadRoute, route)
	}
	if h == nil {
		return errors.New("answerer: nil handler")
	}
	if nc == nil {
		return errors.New("answerer: nil NATS connection")
	}
	o := options{
		answeredBy: "answerer:" + route, concurrency: 1, maxAttempts: 5,
		backoffMin: time.Second, backoffMax: time.Minute, ackWait: 30 * time.Second,
		pullExpiry: 5 * time.Second, callTimeout: 10 * time.Second, shutdown: 30 * time.Second,
		durable: "answerer-" + route, log: slog.Default(),
	}
	for _, f := range opts {
		f(&o)
	}
	o.concurrency = max(o.concurrency, 1)
	o.maxAttempts = max(o.maxAttempts, 1)
	o.ackWait = max(o.ackWait, time.Second)
	o.backoffMin = max(o.backoffMin, 10*time.Millisecond)
	o.backoffMax = max(o.backoffMax, o.backoffMin)
	subject, err := lifecycle.APIAnswerRoute(route)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrBadRoute, err)
	}
	s := &server{nc: nc, route: route, subject: subject, h: h, o: o, log: o.log.With("route", route)}

	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("answerer: jetstream: %w", err)
	}
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	s.cons, err = js.CreateOrUpdateConsumer(sctx, lifecycle.StreamQuestions, jetstream.ConsumerConfig{
		Durable: o.durable, Description: "answerer for route " + route, FilterSubject: QuestionFilter(route),
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: o.ackWait, MaxDeliver: -1,
		MaxAckPending: max(4*o.concurrency, 64), DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return fmt.Errorf("answerer: consumer %s on %s: %w", o.durable, lifecycle.StreamQuestions, err)
	}
	if s.c, err = client.New(nc, client.WithTimeout(o.callTimeout)); err != nil {
		return fmt.Errorf("answerer: %w", err)
	}
	s.warnTakeover(sctx)

	s.log.Info("answerer serving", "durable", o.durable, "concurrency", o.concurrency)
	shutdown := o.shutdown
	if shutdown <= 0 {
		shutdown = -1 // consume.Options: cancel the handlers at once
	}
	// One question per slot; the handler's verdict settles it, and the
	// question is kept in progress while it is handled.
	if err := consume.Run(ctx, s.cons, s.decide, consume.Options{
		Slots: o.concurrency, PullExpiry: o.pullExpiry, KeepAlive: consume.KeepAliveEvery(o.ackWait),
		ShutdownTimeout: shutdown, Logger: s.log,
	}); err != nil {
		return fmt.Errorf("answerer: %w", err)
	}
	if o.removeOnExit {
		dctx, dcancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		err := js.DeleteConsumer(dctx, lifecycle.StreamQuestions, o.durable)
		dcancel()
		if err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			s.log.Warn("durable consumer not removed", "durable", o.durable, "err", err)
		} else {
			s.log.Info("durable consumer removed", "durable", o.durable)
		}
	}
	s.log.Info("answerer stopped")
	return nil
}

// ServeClient is Serve on the connection of an Agora client the caller
// already has; c stays the caller's.
func ServeClient(ctx context.Context, c *client.Client, route string, h Handler, opts ...Option) error {
	if c == nil {
		return errors.New("answerer: nil client")
	}
	return Serve(ctx, c.Conn(), route, h, opts...)
}

// WithRemoveOnExit makes Serve delete its durable consumer when it stops
// cleanly, leaving nothing behind on the server. Use it for an answerer
// that serves a route alone and briefly (a script, a test); a route served
// by several processes keeps its durable.
func WithRemoveOnExit() Option { return func(o *options) { o.removeOnExit = true } }

type server struct {
	nc      *nats.Conn
	route   string
	subject string // agora.api.answer.<route>
	h       Handler
	o       options
	log     *slog.Logger
	cons    jetstream.Consumer
	// c asks the router which questions wait on the route
	// (agora.api.questions.<route>): an answerer reads no question record.
	c *client.Client
	// askAfter is when waiting asks the router again after it could not
	// tell (Unix nanoseconds): a user not granted the endpoint, or no
	// router, costs one request timeout a minute, not one per question.
	askAfter atomic.Int64
}

func (s *server) backoff(attempt int) time.Duration {
	d := s.o.backoffMin
	for i := 1; i < attempt && d < s.o.backoffMax; i++ {
		d *= 2
	}
	return min(d, s.o.backoffMax)
}

// decide handles one asked event; its verdict settles the message.
func (s *server) decide(ctx context.Context, m jetstream.Msg) consume.Verdict {
	attempt := 1
	if md, err := m.Metadata(); err == nil {
		attempt = int(md.NumDelivered)
	}
	q, traceparent, err := DecodeQuestion(m)
	if err != nil {
		s.log.Error("undecodable question terminated", "subject", m.Subject(), "err", err)
		return consume.Term("")
	}
	if q.Event != lifecycle.QuestionAsked {
		return consume.DoubleAck()
	}
	ctx, span := handleSpan(ctx, traceparent, q, s.route, m.Subject(), attempt)
	defer span.End()
	log := s.log.With("question_id", q.QuestionID, "attempt", attempt)
	if !s.waiting(ctx, q.QuestionID) {
		log.Debug("question no longer waits on this route: skipped")
		return consume.DoubleAck()
	}

	reply, herr := s.call(ctx, *q)
	if herr != nil {
		if ctx.Err() != nil {
			return consume.Nak(s.o.backoffMin) // stopping: another process takes it
		}
		if attempt < s.o.maxAttempts {
			log.Warn("handler failed; will retry", "err", herr, "retry_in", s.backoff(attempt))
			return consume.Nak(s.backoff(attempt))
		}
		log.Warn("handler failed on its last attempt: declining", "err", herr)
		reply = Decline(fmt.Sprintf("answerer %s failed %d times: %v", s.route, attempt, herr))
	}
	rep, err := s.submit(ctx, *q, reply)
	if err == nil && rep.Status == client.AnswerInvalid && !reply.Declined {
		// The router refused the answer itself: let the fallback try.
		log.Warn("answer refused as invalid: declining", "reason", rep.Reason)
		reply = Decline("the answer was refused: " + rep.Reason)
		rep, err = s.submit(ctx, *q, reply)
	}
	if err != nil {
		log.Warn("submit failed; will retry", "err", err)
		return consume.Nak(s.backoff(attempt))
	}
	if rep.Status == client.AnswerRetry {
		return consume.Nak(s.backoff(attempt))
	}
	log.Info("question settled", "declined", reply.Declined, "status", rep.Status, "reason", rep.Reason)
	span.SetAttributes(attribute.String("agora.outcome", string(rep.Status)), attribute.Bool("agora.declined", reply.Declined))
	if s.o.report != nil {
		s.o.report(Report{Question: *q, Reply: reply, Status: rep.Status, Reason: rep.Reason, Err: herr})
	}
	return consume.DoubleAck()
}

// waiting reports whether the question still waits for an answer on this
// route, as the router says (agora.api.questions.<route>); true when it
// cannot tell (no router answering, or one without that endpoint).
func (s *server) waiting(ctx context.Context, qid string) bool {
	if time.Now().UnixNano() < s.askAfter.Load() {
		return true
	}
	page, err := s.c.WaitingOnRoute(ctx, s.route, client.WaitingRequest{QuestionID: qid})
	if err != nil {
		if ctx.Err() == nil {
			s.askAfter.Store(time.Now().Add(time.Minute).UnixNano())
			s.log.Warn("cannot ask the router whether questions still wait; answering them for a minute without asking",
				"subject", "agora.api.questions."+s.route, "err", err)
		}
		return true
	}
	return len(page.Questions) == 1
}

// warnTakeover logs a warning when questions are already waiting on the
// route: this answerer is about to answer them, which surprises whoever
// waits on them elsewhere (a toy answerer served on route human answers
// the questions people were waiting on in the inbox).
func (s *server) warnTakeover(ctx context.Context) {
	n, err := s.waitingCount(ctx)
	if err != nil {
		s.log.Debug("waiting questions not counted", "err", err)
		return
	}
	if n > 0 {
		s.log.Warn("questions already waiting on this route will be answered by this answerer",
			"waiting", n, "answered_by", s.o.answeredBy)
	}
}

// waitingCount counts the questions that wait on this route now, as the
// router's index says.
func (s *server) waitingCount(ctx context.Context) (int, error) {
	page, err := s.c.WaitingOnRoute(ctx, s.route, client.WaitingRequest{Limit: 1})
	if err != nil {
		return 0, err
	}
	return page.Count, nil
}

// call runs the handler, turning a panic into an error.
func (s *server) call(ctx context.Context, q lifecycle.Question) (r Reply, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("answerer: handler panicked: %v", p)
		}
	}()
	return s.h.Handle(ctx, q)
}

func (s *server) submit(ctx context.Context, q lifecycle.Question, r Reply) (client.AnswerReply, error) {
	body := client.Submission{QuestionID: q.QuestionID, Route: s.route, AnsweredBy: s.o.answeredBy}
	switch {
	case r.Declined:
		body.Decline, body.Reason = true, r.Reason
	case r.Suggested:
		conf := r.Confidence
		body.Answer, body.Decision, body.Comment = r.Answer, r.Decision, r.Comment
		body.Suggest, body.Confidence, body.Reason = true, &conf, r.Reason
		if q.KindIs(lifecycle.QuestionApproval) && body.Decision == "" && (r.Answer == "approve" || r.Answer == "reject") {
			body.Decision = r.Answer
		}
	default:
		body.Answer, body.Decision, body.Comment = r.Answer, r.Decision, r.Comment
	}
	data, err := json.Marshal(body)
	if err != nil {
		return client.AnswerReply{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.o.callTimeout)
	defer cancel()
	msg, err := s.nc.RequestMsgWithContext(ctx, &nats.Msg{Subject: s.subject, Data: data, Header: spanHeader(ctx)})
	if err != nil {
		return client.AnswerReply{}, fmt.Errorf("answerer: %s: %w", s.subject, err)
	}
	var rep client.AnswerReply
	if err := json.Unmarshal(msg.Data, &rep); err != nil || rep.Status == "" {
		return client.AnswerReply{}, fmt.Errorf("answerer: %s: unexpected reply %q", s.subject, lifecycle.Clip(string(msg.Data), 200))
	}
	return rep, nil
}
