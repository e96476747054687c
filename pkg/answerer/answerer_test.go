package answerer_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/pkg/answerer"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/services/router"
)

func quietLogger() *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// routes: questions of "bot" go to route bot, with fallback people.
const routes = `routes:
  - name: bot
    match: {subagent: bot-*}
    fallback: people
  - name: keeper
    match: {subagent: keeper-*}
  - name: tidy
    match: {subagent: tidy-*}
  - name: people
`

type env struct {
	t   *testing.T
	srv *natstest.Server
	nc  *nats.Conn
	js  jetstream.JetStream
	c   *client.Client
}

func newEnv(t *testing.T) *env {
	t.Helper()
	srv := natstest.StartProvisioned(t, provision.Config{})
	file := filepath.Join(t.TempDir(), "routes.yaml")
	if err := os.WriteFile(file, []byte(routes), 0o600); err != nil {
		t.Fatal(err)
	}
	nc, rconn := srv.Conn(t), srv.Conn(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := router.New(router.Config{RoutesFile: file, Tick: 100 * time.Millisecond, RecordWait: time.Millisecond}, router.Deps{Conn: rconn, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = rt.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	<-rt.Ready()
	return &env{t: t, srv: srv, nc: nc, js: js, c: c}
}

// ask publishes a needs_input as a worker would and returns the question id.
func (e *env) ask(subagent, question string, options ...string) string {
	e.t.Helper()
	id := lifecycle.NewID()
	ni := &lifecycle.NeedsInput{Common: lifecycle.Common{DispatchID: id, ThreadID: id, Subagent: subagent},
		QuestionID: lifecycle.QuestionID(id), Question: question, Options: options}
	_, m, err := lifecycle.Message(lifecycle.Source("test", "worker"), ni)
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.js.PublishMsg(e.t.Context(), m); err != nil {
		e.t.Fatal(err)
	}
	return ni.QuestionID
}

// serve runs Serve until the test ends and returns its reports.
func (e *env) serve(route string, h answerer.Handler, opts ...answerer.Option) <-chan answerer.Report {
	e.t.Helper()
	nc := e.srv.Conn(e.t)
	reports := make(chan answerer.Report, 16)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	opts = append([]answerer.Option{answerer.WithLogger(quietLogger()), answerer.WithReport(func(r answerer.Report) { reports <- r })}, opts...)
	go func() { done <- answerer.Serve(ctx, nc, route, h, opts...) }()
	e.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			e.t.Errorf("Serve: %v", err)
		}
	})
	return reports
}

func (e *env) waitQuestion(qid string, ok func(lifecycle.Question) bool) lifecycle.Question {
	e.t.Helper()
	kv, err := e.js.KeyValue(e.t.Context(), lifecycle.BucketQuestions)
	if err != nil {
		e.t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	var q lifecycle.Question
	for time.Now().Before(deadline) {
		if en, err := kv.Get(e.t.Context(), qid); err == nil {
			q = lifecycle.Question{}
			if json.Unmarshal(en.Value(), &q) == nil && ok(q) {
				return q
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	e.t.Fatalf("question %s never reached the expected state; last %+v", qid, q)
	return q
}

func next(t *testing.T, reports <-chan answerer.Report) answerer.Report {
	t.Helper()
	select {
	case r := <-reports:
		return r
	case <-time.After(time.Minute):
		t.Fatal("no report")
	}
	return answerer.Report{}
}

// TestRetryThenDecline: a handler error is retried with backoff; after the
// last attempt the question is declined and goes to the fallback route.
func TestRetryThenDecline(t *testing.T) {
	e := newEnv(t)
	var calls atomic.Int32
	reports := e.serve("bot", answerer.HandlerFunc(func(context.Context, lifecycle.Question) (answerer.Reply, error) {
		calls.Add(1)
		return answerer.Reply{}, errors.New("database down")
	}), answerer.WithMaxAttempts(3), answerer.WithBackoff(20*time.Millisecond, 50*time.Millisecond))
	qid := e.ask("bot-1", "Which?")
	r := next(t, reports)
	if !r.Reply.Declined || !strings.Contains(r.Reply.Reason, "failed 3 times: database down") || r.Status != client.AnswerAccepted || r.Err == nil {
		t.Fatalf("report = %+v", r)
	}
	if n := calls.Load(); n != 3 {
		t.Errorf("handler called %d times, want 3", n)
	}
	q := e.waitQuestion(qid, func(q lifecycle.Question) bool { return q.Route == "people" })
	if !strings.Contains(q.Detail, "declined on route bot by answerer:bot") {
		t.Errorf("detail = %q", q.Detail)
	}
}

// TestPanicIsRetried: a panicking handler is an error like any other.
func TestPanicIsRetried(t *testing.T) {
	e := newEnv(t)
	var calls atomic.Int32
	reports := e.serve("bot", answerer.HandlerFunc(func(context.Context, lifecycle.Question) (answerer.Reply, error) {
		if calls.Add(1) == 1 {
			panic("boom")
		}
		return answerer.Answer("fine"), nil
	}), answerer.WithBackoff(20*time.Millisecond, 20*time.Millisecond))
	qid := e.ask("bot-1", "Which?")
	if r := next(t, reports); r.Status != client.AnswerAccepted || r.Reply.Answer != "fine" {
		t.Fatalf("report = %+v", r)
	}
	e.waitQuestion(qid, func(q lifecycle.Question) bool { return q.Status == "answered" && q.Answer == "fine" })
}

// TestRefusedAnswerDeclines: an answer the router refuses as invalid
// (not one of the options) is turned into a decline, so the fallback gets
// the question.
func TestRefusedAnswerDeclines(t *testing.T) {
	e := newEnv(t)
	reports := e.serve("bot", answerer.HandlerFunc(func(context.Context, lifecycle.Question) (answerer.Reply, error) {
		return answerer.Answer("Z"), nil
	}))
	qid := e.ask("bot-1", "Which?", "A", "B")
	r := next(t, reports)
	if !r.Reply.Declined || !strings.Contains(r.Reply.Reason, "not one of the options") {
		t.Fatalf("report = %+v", r)
	}
	e.waitQuestion(qid, func(q lifecycle.Question) bool { return q.Route == "people" && q.Status == "asked" })
}

// TestSettledQuestionsAreSkipped: a question answered before the answerer
// starts never reaches the handler; Serve may start again on the same
// durable consumer.
func TestSettledQuestionsAreSkipped(t *testing.T) {
	e := newEnv(t)
	qid := e.ask("bot-1", "Which?")
	e.waitQuestion(qid, func(q lifecycle.Question) bool { return q.Status == "asked" })
	if _, err := e.c.Answer(t.Context(), qid, lifecycle.Answer{Answer: "by hand", AnsweredBy: "alice"}); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	h := answerer.HandlerFunc(func(_ context.Context, q lifecycle.Question) (answerer.Reply, error) {
		calls.Add(1)
		return answerer.Answer("auto"), nil
	})
	// Start, stop, start again: the durable consumer is reused.
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() { errc <- answerer.Serve(ctx, e.srv.Conn(t), "bot", h, answerer.WithLogger(quietLogger())) }()
	time.Sleep(200 * time.Millisecond)
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	reports := e.serve("bot", h)
	second := e.ask("bot-2", "Next?")
	if r := next(t, reports); r.Question.QuestionID != second || r.Status != client.AnswerAccepted {
		t.Fatalf("report = %+v", r)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("handler called %d times, want once (for the second question only)", n)
	}
}

// TestGracefulStop: a question being handled when Serve's context ends is
// finished and submitted before Serve returns.
func TestGracefulStop(t *testing.T) {
	e := newEnv(t)
	started := make(chan struct{})
	release := make(chan struct{})
	h := answerer.HandlerFunc(func(ctx context.Context, q lifecycle.Question) (answerer.Reply, error) {
		close(started)
		<-release
		return answerer.Answer("late but done"), ctx.Err()
	})
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	var serveErr error
	wg.Go(func() {
		serveErr = answerer.Serve(ctx, e.srv.Conn(t), "bot", h, answerer.WithLogger(quietLogger()), answerer.WithShutdownTimeout(time.Minute))
	})
	qid := e.ask("bot-1", "Slow?")
	<-started
	cancel()
	time.Sleep(100 * time.Millisecond)
	close(release)
	wg.Wait()
	if serveErr != nil {
		t.Fatal(serveErr)
	}
	if q := e.waitQuestion(qid, func(q lifecycle.Question) bool { return q.Status == "answered" }); q.Answer != "late but done" {
		t.Errorf("answer = %q", q.Answer)
	}
}

func TestBadRoute(t *testing.T) {
	err := answerer.Serve(t.Context(), nil, "a.b", answerer.HandlerFunc(nil))
	if !errors.Is(err, answerer.ErrBadRoute) {
		t.Fatalf("Serve = %v, want ErrBadRoute", err)
	}
}

// TestAnswersThroughRouteDoor: Serve answers through its route's endpoint,
// agora.api.answer.<route>, and the router records that door.
func TestAnswersThroughRouteDoor(t *testing.T) {
	e := newEnv(t)
	reports := e.serve("bot", answerer.HandlerFunc(func(context.Context, lifecycle.Question) (answerer.Reply, error) {
		return answerer.Answer("fine"), nil
	}))
	qid := e.ask("bot-1", "Which?")
	if r := next(t, reports); r.Status != client.AnswerAccepted {
		t.Fatalf("report = %+v", r)
	}
	e.waitQuestion(qid, func(q lifecycle.Question) bool { return q.Status == "answered" })
	kv, err := e.js.KeyValue(t.Context(), lifecycle.BucketQuestions)
	if err != nil {
		t.Fatal(err)
	}
	en, err := kv.Get(t.Context(), qid)
	if err != nil {
		t.Fatal(err)
	}
	var rec struct {
		History []struct{ Via, Door, Route, Result string } `json:"history"`
	}
	if err := json.Unmarshal(en.Value(), &rec); err != nil {
		t.Fatal(err)
	}
	if len(rec.History) != 1 || rec.History[0].Door != "agora.api.answer.bot" || rec.History[0].Via != "api-route" ||
		rec.History[0].Route != "bot" || rec.History[0].Result != "accepted" {
		t.Errorf("history = %+v", rec.History)
	}
}

// ServeClient answers through a client the caller has; by default the
// route's durable stays on the server after Serve returns, and with
// WithRemoveOnExit it is gone.
func TestServeClientAndTheDurableLeftBehind(t *testing.T) {
	e := newEnv(t)
	c, err := client.New(e.srv.Conn(t))
	if err != nil {
		t.Fatal(err)
	}
	js := e.srv.JetStream(t)
	durableExists := func(name string) bool {
		_, err := js.Consumer(t.Context(), lifecycle.StreamQuestions, name)
		return err == nil
	}
	for _, c2 := range []struct {
		route  string
		opts   []answerer.Option
		remain bool
	}{
		{"keeper", nil, true},
		{"tidy", []answerer.Option{answerer.WithRemoveOnExit()}, false},
	} {
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() {
			done <- answerer.ServeClient(ctx, c, c2.route, answerer.HandlerFunc(func(context.Context, lifecycle.Question) (answerer.Reply, error) {
				return answerer.Answer("yes"), nil
			}), append(c2.opts, answerer.WithLogger(quietLogger()))...)
		}()
		qid := e.ask(c2.route+"-agent", "Go?")
		if q := e.waitQuestion(qid, func(q lifecycle.Question) bool { return q.Status == "answered" }); q.Answer != "yes" {
			t.Errorf("%s: answer = %q", c2.route, q.Answer)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if got := durableExists("answerer-" + c2.route); got != c2.remain {
			t.Errorf("%s: durable exists = %v after Serve, want %v", c2.route, got, c2.remain)
		}
	}
	if err := answerer.ServeClient(t.Context(), nil, "x", nil); err == nil {
		t.Error("a nil client was accepted")
	}
}
