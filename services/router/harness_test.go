package router_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/schema"
	"github.com/agora-dispatch/agora/services/router"
)

// waitFor bounds every wait: generous, the machine is shared.
const waitFor = 60 * time.Second

type env struct {
	t      *testing.T
	srv    *natstest.Server
	nc     *nats.Conn
	js     jetstream.JetStream
	routes string // routing file path, "" for the built-in routes
}

func newEnv(t *testing.T, routesYAML string) *env {
	t.Helper()
	srv := natstest.StartProvisioned(t, provision.Config{})
	nc := srv.Conn(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, srv: srv, nc: nc, js: js}
	if routesYAML != "" {
		e.routes = filepath.Join(t.TempDir(), "routes.yaml")
		if err := os.WriteFile(e.routes, []byte(routesYAML), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

func quietLogger() *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func (e *env) config() router.Config {
	return router.Config{RoutesFile: e.routes, Tick: 100 * time.Millisecond, RecordWait: 200 * time.Millisecond, ShutdownTimeout: 10 * time.Second}
}

// running is a router started by a test; stop ends it (also at cleanup).
type running struct {
	*router.Service
	reg  *prometheus.Registry
	stop func()
}

func (e *env) startRouter(cfg router.Config) *running {
	e.t.Helper()
	return e.startRouterOn(cfg, e.srv.Conn(e.t))
}

// startRouterOn is startRouter on a given connection, which a test may
// close to cut the router off as a crash would.
func (e *env) startRouterOn(cfg router.Config, nc *nats.Conn) *running {
	e.t.Helper()
	reg := prometheus.NewRegistry()
	svc, err := router.New(cfg, router.Deps{Conn: nc, Logger: quietLogger(), Registerer: reg})
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := svc.Run(ctx); err != nil && !nc.IsClosed() {
			e.t.Errorf("router.Run: %v", err)
		}
	})
	select {
	case <-svc.Ready():
	case <-time.After(waitFor):
		e.t.Fatal("router not ready")
	}
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); wg.Wait() }) }
	e.t.Cleanup(stop)
	return &running{Service: svc, reg: reg, stop: stop}
}

// seedDispatch stores the dispatch record the dispatcher keeps for an
// accepted request, so the router can copy its settings.
func (e *env) seedDispatch(req lifecycle.Request, status lifecycle.Kind) {
	e.t.Helper()
	if req.ThreadID == "" {
		req.ThreadID = req.DispatchID
	}
	// As stored: the public record and the dispatcher's own queued flag.
	rec := struct {
		client.Record
		Queued bool `json:"queued"`
	}{Record: client.Record{
		DispatchID: req.DispatchID, ThreadID: req.ThreadID, ParentID: req.ParentID, Round: req.Round,
		Subagent: req.Subagent, Status: status, Request: &req, CreatedAt: time.Now().UTC(), UpdatedAt: time.Now().UTC(),
	}, Queued: true}
	e.putDispatch(rec)
}

func (e *env) putDispatch(rec any) {
	e.t.Helper()
	kv, err := e.js.KeyValue(e.t.Context(), lifecycle.BucketDispatches)
	if err != nil {
		e.t.Fatal(err)
	}
	b, err := json.Marshal(rec)
	if err != nil {
		e.t.Fatal(err)
	}
	var id struct {
		DispatchID string `json:"dispatch_id"`
	}
	_ = json.Unmarshal(b, &id)
	if _, err := kv.Put(e.t.Context(), id.DispatchID, b); err != nil {
		e.t.Fatal(err)
	}
}

// askPaused asks the question "?" of a dispatch of subagent (ask) and waits
// until it has been asked; it returns the question id and its record.
func (e *env) askPaused(subagent string) (string, questionRecord) {
	e.t.Helper()
	qid := e.ask(lifecycle.NeedsInput{Common: lifecycle.Common{Subagent: subagent}, Question: "?"}, lifecycle.Request{}, "")
	e.waitQuestionEvents(qid, 1)
	rec, _ := e.record(qid)
	return qid, rec
}

// ask publishes a needs_input event as a worker would, after storing the
// dispatch record of its request; it returns the question id.
func (e *env) ask(ni lifecycle.NeedsInput, req lifecycle.Request, traceparent string) string {
	e.t.Helper()
	if ni.DispatchID == "" {
		ni.DispatchID = lifecycle.NewID()
	}
	if ni.ThreadID == "" {
		ni.ThreadID = ni.DispatchID
	}
	ni.QuestionID = lifecycle.QuestionID(ni.DispatchID)
	req.DispatchID, req.ThreadID, req.ParentID, req.Round, req.Subagent = ni.DispatchID, ni.ThreadID, ni.ParentID, ni.Round, ni.Subagent
	e.seedDispatch(req, lifecycle.KindNeedsInput)
	e.publish(&ni, traceparent)
	return ni.QuestionID
}

func (e *env) publish(d lifecycle.Data, traceparent string) {
	e.t.Helper()
	_, m, err := lifecycle.Message(lifecycle.Source("test", "harness"), d, lifecycle.WithTraceparent(traceparent))
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.js.PublishMsg(e.t.Context(), m); err != nil {
		e.t.Fatal(err)
	}
}

// answer calls agora.api.answer and returns the reply.
func (e *env) answer(sub router.Submission) client.AnswerReply {
	e.t.Helper()
	return e.request(lifecycle.APIAnswer, sub)
}

// answerVia calls agora.api.answer.<route> and returns the reply.
func (e *env) answerVia(route string, sub router.Submission) client.AnswerReply {
	e.t.Helper()
	subject, err := lifecycle.APIAnswerRoute(route)
	if err != nil {
		e.t.Fatal(err)
	}
	return e.request(subject, sub)
}

func (e *env) request(subject string, sub router.Submission) client.AnswerReply {
	e.t.Helper()
	b, _ := json.Marshal(sub)
	m, err := e.nc.Request(subject, b, 30*time.Second)
	if err != nil {
		e.t.Fatalf("answer %s: %v", sub.QuestionID, err)
	}
	var rep client.AnswerReply
	if err := json.Unmarshal(m.Data, &rep); err != nil {
		e.t.Fatalf("answer reply %q: %v", m.Data, err)
	}
	return rep
}

// questionRecord is the stored record, as the router's JSON documents it.
type questionRecord struct {
	lifecycle.Question
	Traceparent     string             `json:"traceparent"`
	Origin          string             `json:"origin"`
	PartialState    json.RawMessage    `json:"partial_state"`
	PartialStateRef string             `json:"partial_state_ref"`
	Request         *lifecycle.Request `json:"request"`
	MaxRounds       int                `json:"max_rounds"`
	NextDispatchID  string             `json:"next_dispatch_id"`
	Outcome         string             `json:"outcome"`
	Declined        []string           `json:"declined"`
	History         []struct {
		Via         string `json:"via"`
		Door        string `json:"door"`
		NamedDoor   string `json:"named_door"`
		Route       string `json:"route"`
		AnsweredBy  string `json:"answered_by"`
		Answer      string `json:"answer"`
		Result      string `json:"result"`
		Status      string `json:"status"`
		Reason      string `json:"reason"`
		ShownDigest string `json:"shown_digest"`
	} `json:"history"`
	BoundDigest string            `json:"bound_digest"`
	Pending     []json.RawMessage `json:"pending"`
	// Ask once (docs/router.md, "Ask once").
	Left    bool     `json:"thread_left"`
	Fanout  []string `json:"fanout"`
	Release bool     `json:"release"`
}

func (e *env) record(qid string) (questionRecord, bool) {
	e.t.Helper()
	kv, err := e.js.KeyValue(e.t.Context(), lifecycle.BucketQuestions)
	if err != nil {
		e.t.Fatal(err)
	}
	en, err := kv.Get(e.t.Context(), qid)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return questionRecord{}, false
	}
	if err != nil {
		e.t.Fatal(err)
	}
	var r questionRecord
	if err := json.Unmarshal(en.Value(), &r); err != nil {
		e.t.Fatal(err)
	}
	return r, true
}

// waitRecord waits until the question's record satisfies ok.
func (e *env) waitRecord(qid string, what string, ok func(questionRecord) bool) questionRecord {
	e.t.Helper()
	deadline := time.Now().Add(waitFor)
	var last questionRecord
	for time.Now().Before(deadline) {
		r, found := e.record(qid)
		if found && ok(r) {
			return r
		}
		last = r
		time.Sleep(25 * time.Millisecond)
	}
	e.t.Fatalf("question %s: %s not reached within %s; last record: %+v", qid, what, waitFor, last)
	return questionRecord{}
}

func (e *env) waitStatus(qid, status string) questionRecord {
	e.t.Helper()
	return e.waitRecord(qid, "status "+status+" with nothing left to publish", func(r questionRecord) bool {
		return r.Status == status && len(r.Pending) == 0
	})
}

type event struct {
	Subject string
	Event   lifecycle.Event
	Data    lifecycle.Data
	MsgID   string
}

// streamEvents returns every event stored on a stream under filter.
func (e *env) streamEvents(stream, filter string) []event {
	e.t.Helper()
	var out []event
	for _, m := range natstest.Stored(e.t, e.js, stream, filter) {
		ev, d := natstest.Lifecycle(e.t, m.Headers(), m.Data())
		out = append(out, event{Subject: m.Subject(), Event: ev, Data: d, MsgID: m.Headers().Get(jetstream.MsgIDHeader)})
	}
	return out
}

// questionEvents returns the question events of qid, oldest first.
func (e *env) questionEvents(qid string) []event {
	return e.streamEvents(lifecycle.StreamQuestions, "agora.questions.*."+qid+".*")
}

// waitQuestionEvents waits until qid has at least n question events.
func (e *env) waitQuestionEvents(qid string, n int) []event {
	e.t.Helper()
	deadline := time.Now().Add(waitFor)
	for time.Now().Before(deadline) {
		if evs := e.questionEvents(qid); len(evs) >= n {
			return evs
		}
		time.Sleep(25 * time.Millisecond)
	}
	e.t.Fatalf("question %s: fewer than %d events within %s: %v", qid, n, waitFor, subjects(e.questionEvents(qid)))
	return nil
}

func subjects(evs []event) []string {
	var out []string
	for _, ev := range evs {
		out = append(out, ev.Subject)
	}
	return out
}

// requests returns the requests published on agora.requests.<subagent>
// (the dispatcher is not running in these tests, so they stay queued).
func (e *env) requests(subagent string) []event {
	e.t.Helper()
	s, err := e.js.Stream(e.t.Context(), lifecycle.StreamRequests)
	if err != nil {
		e.t.Fatal(err)
	}
	subj := "agora.requests." + subagent
	info, err := s.Info(e.t.Context(), jetstream.WithSubjectFilter(subj))
	if err != nil {
		e.t.Fatal(err)
	}
	var out []event
	var seq uint64
	for range info.State.Subjects[subj] {
		raw, err := s.GetMsg(e.t.Context(), seq+1, jetstream.WithGetMsgSubject(subj))
		if err != nil {
			e.t.Fatal(err)
		}
		seq = raw.Sequence
		ev, d := natstest.Lifecycle(e.t, raw.Header, raw.Data)
		out = append(out, event{Subject: raw.Subject, Event: ev, Data: d, MsgID: raw.Header.Get(jetstream.MsgIDHeader)})
	}
	return out
}

// lifecycleEvents returns the lifecycle events of a dispatch.
func (e *env) lifecycleEvents(dispatchID string) []event {
	return e.streamEvents(lifecycle.StreamLifecycle, lifecycle.LifecycleFilter("", "", dispatchID))
}

func (e *env) waitLifecycle(dispatchID string) []event {
	e.t.Helper()
	var evs []event
	testkit.Eventually(e.t, waitFor, "a lifecycle event for "+dispatchID, func() bool {
		evs = e.lifecycleEvents(dispatchID)
		return len(evs) > 0
	})
	return evs
}

// counter sums a counter of a router's registry over the matching labels.
func counter(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for k, v := range labels {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == k && lp.GetValue() == v {
						found = true
					}
				}
				if !found {
					continue metric
				}
			}
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

func inputOf(t *testing.T, req *lifecycle.Request) map[string]json.RawMessage {
	t.Helper()
	var in map[string]json.RawMessage
	if err := json.Unmarshal(req.Input, &in); err != nil {
		t.Fatalf("input %s: %v", req.Input, err)
	}
	return in
}

func jsonString(t *testing.T, raw json.RawMessage) string {
	t.Helper()
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatalf("%s is not a JSON string: %v", raw, err)
	}
	return s
}

var (
	schemaOnce sync.Once
	schemas    *schema.Set
	schemaErr  error
)

// conform fails unless every event's data matches its JSON Schema.
func conform(t *testing.T, evs ...event) {
	t.Helper()
	schemaOnce.Do(func() { schemas, schemaErr = schema.Compile() })
	if schemaErr != nil {
		t.Fatal(schemaErr)
	}
	for _, ev := range evs {
		if err := schemas.ValidateEvent(ev.Event.Type(), ev.Event.Data()); err != nil {
			t.Errorf("%s %s does not match its schema: %v\n%s", ev.Event.Type(), ev.Event.ID(), err, ev.Event.Data())
		}
	}
}
