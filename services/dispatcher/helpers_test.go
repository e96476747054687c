package dispatcher_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/services/dispatcher"
)

const waitFor = 10 * time.Second

// harness is a provisioned JetStream server with a running dispatcher and
// its HTTP API on a test server.
type harness struct {
	t    *testing.T
	srv  *natstest.Server
	nc   *nats.Conn
	js   jetstream.JetStream
	cl   *client.Client
	svc  *dispatcher.Service
	http *httptest.Server
	stop func()
	// logger, when set, is the logger start gives the next dispatcher.
	logger *slog.Logger
}

func testLogger() *slog.Logger {
	if os.Getenv("AGORA_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// newHarness starts a server with the sub-agent "planner" (max_rounds 3)
// and a dispatcher configured by cfg.
func newHarness(t *testing.T, cfg dispatcher.Config) *harness {
	t.Helper()
	return newHarnessOn(t, natstest.StartProvisioned(t, provision.Config{}), cfg)
}

// newHarnessOn is newHarness on a provisioned server of the test's.
func newHarnessOn(t *testing.T, srv *natstest.Server, cfg dispatcher.Config) *harness {
	t.Helper()
	h := &harness{t: t, srv: srv, nc: srv.Conn(t)}
	var err error
	if h.js, err = jetstream.New(h.nc); err != nil {
		t.Fatal(err)
	}
	if h.cl, err = client.New(h.nc); err != nil {
		t.Fatal(err)
	}
	h.putSubagent(subagent.Definition{Name: "planner", Runtime: subagent.RuntimeExec, Command: []string{"true"}, Timeout: "5m", MaxRounds: 3, EnvAllow: []string{"FOO"}})
	h.start(cfg)
	return h
}

func (h *harness) putSubagent(d subagent.Definition) uint64 {
	h.t.Helper()
	kv := natstest.KeyValue(h.t, h.js, lifecycle.BucketSubagents)
	data, _ := json.Marshal(d)
	rev, err := kv.Put(h.t.Context(), d.Name, data)
	if err != nil {
		h.t.Fatal(err)
	}
	return rev
}

// start runs a dispatcher on its own connection until stop or the end of
// the test.
func (h *harness) start(cfg dispatcher.Config) {
	h.t.Helper()
	if cfg.ShutdownTimeout == 0 {
		cfg.ShutdownTimeout = 5 * time.Second
	}
	log := h.logger
	if log == nil {
		log = testLogger()
	}
	svc, err := dispatcher.New(cfg, dispatcher.Deps{Conn: h.srv.Conn(h.t), Logger: log})
	if err != nil {
		h.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	select {
	case <-svc.Ready():
	case err := <-done:
		cancel()
		h.t.Fatalf("dispatcher stopped at start: %v", err)
	case <-time.After(waitFor):
		cancel()
		h.t.Fatal("dispatcher not ready")
	}
	web := httptest.NewServer(svc.Handler())
	var once sync.Once
	h.svc, h.http = svc, web
	h.stop = func() {
		once.Do(func() {
			web.CloseClientConnections()
			cancel()
			select {
			case err := <-done:
				if err != nil {
					h.t.Errorf("Run: %v", err)
				}
			case <-time.After(2 * waitFor):
				h.t.Error("dispatcher did not stop")
			}
			web.Close()
		})
	}
	h.t.Cleanup(h.stop)
}

// microCall sends a raw request to a micro endpoint.
func (h *harness) microCall(subject string, body []byte, hdr nats.Header) *nats.Msg {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(h.t.Context(), waitFor)
	defer cancel()
	m, err := h.nc.RequestMsgWithContext(ctx, &nats.Msg{Subject: subject, Data: body, Header: hdr})
	if err != nil {
		h.t.Fatalf("%s: %v", subject, err)
	}
	return m
}

// do sends an HTTP request to the API with an optional bearer token.
func (h *harness) do(method, path, body, token string, hdr ...string) (*http.Response, []byte) {
	h.t.Helper()
	req, err := http.NewRequestWithContext(h.t.Context(), method, h.http.URL+path, bytes.NewBufferString(body))
	if err != nil {
		h.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	// Every exchange is checked against the OpenAPI document.
	checkExchange(h.t, req, []byte(body), resp, data)
	return resp, data
}

// publishRequest publishes a dispatch request CloudEvent on the stream door.
// A later round is first made the resume of an answered question, as the
// router makes one (natstest.Answered).
func (h *harness) publishRequest(req lifecycle.Request, opts ...lifecycle.Option) lifecycle.Event {
	h.t.Helper()
	if req.Round > 0 {
		req = natstest.Answered(h.t, h.js, req)
	}
	e, msg, err := lifecycle.Message(lifecycle.Source("test", "client"), &req, opts...)
	if err != nil {
		h.t.Fatal(err)
	}
	if _, err := h.js.PublishMsg(h.t.Context(), msg); err != nil {
		h.t.Fatal(err)
	}
	return e
}

// publishRawRequest publishes a request event whose data is raw JSON, so
// a test can send what lifecycle.New would refuse to build.
func (h *harness) publishRawRequest(subagentToken string, data string) {
	h.t.Helper()
	e, err := lifecycle.New(lifecycle.Source("test", "client"), &lifecycle.Request{Subagent: subagentToken})
	if err != nil {
		h.t.Fatal(err)
	}
	if err := e.SetData(lifecycle.ContentTypeJSON, []byte(data)); err != nil {
		h.t.Fatal(err)
	}
	subj, _ := lifecycle.RequestSubject(subagentToken)
	msg, err := lifecycle.Encode(subj, e)
	if err != nil {
		h.t.Fatal(err)
	}
	if _, err := h.js.PublishMsg(h.t.Context(), msg); err != nil {
		h.t.Fatal(err)
	}
}

// publishAsWorker publishes a lifecycle event the way a worker does: the
// projection's input.
func (h *harness) publishAsWorker(d lifecycle.Data, opts ...lifecycle.Option) lifecycle.Event {
	h.t.Helper()
	e, msg, err := lifecycle.Message(lifecycle.Source("worker", "test"), d, opts...)
	if err != nil {
		h.t.Fatal(err)
	}
	if _, err := h.js.PublishMsg(h.t.Context(), msg); err != nil {
		h.t.Fatal(err)
	}
	return e
}

// waitEvent returns the first lifecycle event on subject filter.
func (h *harness) waitEvent(filter string) (lifecycle.Event, lifecycle.Data) {
	h.t.Helper()
	evs := h.events(filter, 1)
	d, err := lifecycle.Parse(evs[0])
	if err != nil {
		h.t.Fatal(err)
	}
	return evs[0], d
}

// events waits for n lifecycle events on subject filter and returns them.
func (h *harness) events(filter string, n int) []lifecycle.Event {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(h.t.Context(), waitFor)
	defer cancel()
	cons, err := h.js.OrderedConsumer(ctx, lifecycle.StreamLifecycle, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	if err != nil {
		h.t.Fatal(err)
	}
	it, err := cons.Messages()
	if err != nil {
		h.t.Fatal(err)
	}
	defer it.Stop()
	var out []lifecycle.Event
	for len(out) < n {
		m, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			h.t.Fatalf("waiting for %d events on %s, got %d: %v", n, filter, len(out), err)
		}
		e, err := lifecycle.DecodeMsg(m)
		if err != nil {
			h.t.Fatal(err)
		}
		out = append(out, e)
	}
	return out
}

// count returns how many messages stream holds on subject.
func (h *harness) count(stream, subject string) uint64 {
	h.t.Helper()
	return natstest.StreamInfo(h.t, h.js, stream, jetstream.WithSubjectFilter(subject)).State.Subjects[subject]
}

// queued returns the requests on AGORA_DISPATCH with the dispatch id.
func (h *harness) queued(id string) []lifecycle.Request {
	h.t.Helper()
	var out []lifecycle.Request
	for _, raw := range workMessages(h.t, h) {
		_, d := natstest.Lifecycle(h.t, raw.Header, raw.Data)
		if r := d.(*lifecycle.Request); r.DispatchID == id {
			if got := raw.Header.Get(jetstream.MsgIDHeader); got != id {
				h.t.Errorf("Nats-Msg-Id = %q, want %q", got, id)
			}
			out = append(out, *r)
		}
	}
	return out
}

// stored is a dispatch record as the dispatcher keeps it in
// agora_dispatches, and whether its work is queued.
type stored struct {
	client.Record
	// Queued is not stored (docs/storage.md, "The dispatch record and the
	// reconciler"): record sets it when the dispatch's work message is on
	// AGORA_DISPATCH.
	Queued bool `json:"-"`
}

// record reads a dispatch record as the status door answers it (its
// status derived from its chain), whether its work message is on
// AGORA_DISPATCH, and its KV revision.
func (h *harness) record(id string) (stored, uint64) {
	h.t.Helper()
	rec, rev := h.storedRecord(id)
	view, err := h.cl.Status(h.t.Context(), id)
	if err != nil {
		h.t.Fatalf("status of %s: %v", id, err)
	}
	rec.Record = *view
	rec.Queued = len(h.queued(id)) > 0
	return rec, rev
}

// storedRecord reads a dispatch record as stored in agora_dispatches, and
// its KV revision: the status there is the one it was created with.
func (h *harness) storedRecord(id string) (stored, uint64) {
	h.t.Helper()
	kv := natstest.KeyValue(h.t, h.js, lifecycle.BucketDispatches)
	e, err := kv.Get(h.t.Context(), id)
	if err != nil {
		h.t.Fatalf("record %s: %v", id, err)
	}
	var rec stored
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		h.t.Fatal(err)
	}
	return rec, e.Revision()
}

// hasRecord reports whether the dispatch has a record.
func (h *harness) hasRecord(id string) bool {
	_, err := natstest.KeyValue(h.t, h.js, lifecycle.BucketDispatches).Get(h.t.Context(), id)
	return err == nil
}

// eventually polls cond until it holds or the wait ends.
func (h *harness) eventually(what string, cond func() bool) {
	h.t.Helper()
	testkit.Eventually(h.t, waitFor, what, cond)
}

// projected waits until the record a door answers lists the event.
func (h *harness) projected(id, eventID string) stored {
	h.t.Helper()
	var rec stored
	h.eventually("record "+id+" to apply "+eventID, func() bool {
		if !h.hasRecord(id) {
			return false
		}
		rec, _ = h.record(id)
		for _, r := range rec.Events {
			if r.ID == eventID {
				return true
			}
		}
		return false
	})
	return rec
}

// projectionIdle waits until the projection consumer has nothing pending.
func (h *harness) projectionIdle() {
	h.t.Helper()
	h.eventually("projection to catch up", func() bool {
		c, err := h.js.Consumer(h.t.Context(), lifecycle.StreamLifecycle, provision.ConsumerProjection)
		if err != nil {
			return false
		}
		info, err := c.Info(h.t.Context())
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	})
}

// dispatchMicro dispatches through agora.api.dispatch with the client; a
// later round as publishRequest makes it.
func (h *harness) dispatchMicro(req lifecycle.Request) *client.Dispatch {
	h.t.Helper()
	if req.Round > 0 {
		req = natstest.Answered(h.t, h.js, req)
	}
	d, err := h.cl.Dispatch(h.t.Context(), req)
	if err != nil {
		h.t.Fatalf("dispatch: %v", err)
	}
	return d
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// workMessages reads every message on the work stream by sequence (a work
// queue takes no second consumer over the workers' subjects).
func workMessages(t *testing.T, h *harness) []*jetstream.RawStreamMsg {
	t.Helper()
	s, err := h.js.Stream(t.Context(), lifecycle.StreamDispatch)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && seq > 0; seq++ {
		raw, err := s.GetMsg(t.Context(), seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, raw)
	}
	return out
}
