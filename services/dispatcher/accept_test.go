package dispatcher_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/agora-dispatch/agora/internal/buildinfo"
	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/services/dispatcher"
)

const testTrace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

// dispatchVia sends body through one door and returns the record the door
// answers (the stream door answers nothing: its record is read back once
// it is queued).
func (h *harness) dispatchVia(door string, id string, body string) client.Record {
	h.t.Helper()
	switch door {
	case "stream":
		h.publishRawRequest("planner", body)
		var rec client.Record
		h.eventually("stream request "+id+" to be queued", func() bool {
			if !h.hasRecord(id) {
				return false
			}
			st, _ := h.record(id)
			rec = st.Record
			return st.Queued
		})
		return rec
	case "micro":
		m := h.microCall(lifecycle.APIDispatch, []byte(body), nats.Header{"traceparent": []string{testTrace}})
		if code := m.Header.Get(micro.ErrorCodeHeader); code != "" {
			h.t.Fatalf("micro dispatch: %s %s", code, m.Data)
		}
		return h.answeredRecord(m.Data)
	case "http":
		resp, data := h.do(http.MethodPost, "/v1/dispatches", body, "", "traceparent", testTrace)
		if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
			h.t.Fatalf("http dispatch: %d %s", resp.StatusCode, data)
		}
		return h.answeredRecord(data)
	}
	h.t.Fatalf("no door %q", door)
	return client.Record{}
}

// answeredRecord decodes the record a door answered, which carries no
// "queued": that flag is the stored record's, not the API's.
func (h *harness) answeredRecord(data []byte) client.Record {
	h.t.Helper()
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(data, &keys); err != nil {
		h.t.Fatal(err)
	}
	if _, ok := keys["queued"]; ok {
		h.t.Errorf("the answered record has a \"queued\" key: %s", data)
	}
	var rec client.Record
	if err := json.Unmarshal(data, &rec); err != nil {
		h.t.Fatal(err)
	}
	return rec
}

var doors = []string{"stream", "micro", "http"}

func TestAcceptThroughEachDoor(t *testing.T) {
	h := newHarness(t, dispatcher.Config{})
	for _, door := range doors {
		t.Run(door, func(t *testing.T) {
			id := "door-" + door
			body := fmt.Sprintf(`{"dispatch_id":%q,"subagent":"planner","input":{"task":"plan"},"env":{"FOO":"bar"},"labels":{"team":"a"},"target":"repo"}`, id)
			if door == "stream" {
				// The stream door takes the trace from the event itself.
				h.publishRequest(lifecycle.Request{DispatchID: id, Subagent: "planner", Input: json.RawMessage(`{"task":"plan"}`),
					Env: map[string]string{"FOO": "bar"}, Labels: map[string]string{"team": "a"}, Target: "repo"}, lifecycle.WithTraceparent(testTrace))
				h.eventually("queued", func() bool { return h.hasRecord(id) && func() bool { r, _ := h.record(id); return r.Queued }() })
			} else {
				rec := h.dispatchVia(door, id, body)
				// The door answers once the record is queued.
				if st, _ := h.record(id); !st.Queued || rec.Status != lifecycle.KindAccepted {
					t.Fatalf("answered record: status %q, stored queued %v", rec.Status, st.Queued)
				}
			}
			rec, _ := h.record(id)
			if rec.ThreadID != id || rec.Round != 0 || rec.Subagent != "planner" || rec.SubagentRevision == 0 {
				t.Errorf("record ids: %+v", rec)
			}
			if lifecycle.TraceID(rec.Traceparent) != lifecycle.TraceID(testTrace) {
				t.Errorf("record traceparent %q does not continue %q", rec.Traceparent, testTrace)
			}
			q := h.queued(id)
			if len(q) != 1 {
				t.Fatalf("%d queued messages, want 1", len(q))
			}
			r := q[0]
			if r.ThreadID != id || r.SubagentRevision != rec.SubagentRevision || r.Timeout != "5m" || r.MaxRounds != 3 ||
				string(r.Input) != `{"task":"plan"}` || r.Env["FOO"] != "bar" || r.Labels["team"] != "a" {
				t.Errorf("queued request not completed: %+v", r)
			}
			e, d := h.waitEvent(lifecycle.LifecycleFilter(lifecycle.KindAccepted, id, id))
			acc := d.(*lifecycle.Accepted)
			if acc.SubagentRevision != rec.SubagentRevision || acc.Target != "repo" || acc.Labels["team"] != "a" {
				t.Errorf("accepted data: %+v", acc)
			}
			if lifecycle.TraceID(lifecycle.Traceparent(e)) != lifecycle.TraceID(testTrace) {
				t.Errorf("accepted event traceparent %q does not continue %q", lifecycle.Traceparent(e), testTrace)
			}
		})
	}
}

func TestAcceptAssignsIDsAndTrace(t *testing.T) {
	h := newHarness(t, dispatcher.Config{})
	d := h.dispatchMicro(lifecycle.Request{Subagent: "planner"})
	if len(d.DispatchID) != 26 || d.ThreadID != d.DispatchID {
		t.Fatalf("id %q thread %q: want a ULID that is also the thread id", d.DispatchID, d.ThreadID)
	}
	if !lifecycle.ValidTraceparent(d.Record.Traceparent) {
		t.Errorf("a root without a trace gets one: %q", d.Record.Traceparent)
	}
	if string(d.Record.Request.Input) != `{}` || d.Record.Request.Timeout != "5m" || d.Record.Request.MaxRounds != 3 {
		t.Errorf("defaults not filled: %+v", d.Record.Request)
	}
}

func TestIdempotentAcrossDoors(t *testing.T) {
	h := newHarness(t, dispatcher.Config{})
	check := func(t *testing.T, id string, answers []client.Record) {
		t.Helper()
		h.eventually("requests stream drained", func() bool { return h.count(lifecycle.StreamRequests, "agora.requests.planner") == 0 })
		rec, _ := h.record(id)
		for _, a := range answers {
			if a.DispatchID != id || !a.CreatedAt.Equal(rec.CreatedAt) {
				t.Errorf("an answer is not the first record: %+v", a)
			}
		}
		if n := h.count(lifecycle.StreamLifecycle, "agora.lifecycle.accepted."+id+"."+id); n != 1 {
			t.Errorf("%d accepted events, want 1", n)
		}
		if q := h.queued(id); len(q) != 1 {
			t.Errorf("%d queued messages, want 1", len(q))
		}
	}
	orders := [][]string{
		{"stream", "micro", "http"},
		{"micro", "stream", "http", "micro"},
		{"http", "http", "stream", "micro", "stream"},
	}
	for i, order := range orders {
		t.Run(strings.Join(order, "-"), func(t *testing.T) {
			id := fmt.Sprintf("same-%d", i)
			body := fmt.Sprintf(`{"dispatch_id":%q,"subagent":"planner","input":{"n":%d}}`, id, i)
			var answers []client.Record
			for _, door := range order {
				answers = append(answers, h.dispatchVia(door, id, body))
			}
			check(t, id, answers)
		})
	}
	t.Run("concurrent", func(t *testing.T) {
		id := "same-concurrent"
		body := fmt.Sprintf(`{"dispatch_id":%q,"subagent":"planner"}`, id)
		var mu sync.Mutex
		var answers []client.Record
		var wg sync.WaitGroup
		for i := range 12 {
			door := doors[i%3]
			wg.Go(func() {
				if door == "stream" {
					h.publishRawRequest("planner", body)
					return
				}
				rec := h.dispatchVia(door, id, body)
				mu.Lock()
				answers = append(answers, rec)
				mu.Unlock()
			})
		}
		wg.Wait()
		check(t, id, answers)
	})
	t.Run("http status", func(t *testing.T) {
		body := `{"dispatch_id":"same-http","subagent":"planner"}`
		first, _ := h.do(http.MethodPost, "/v1/dispatches", body, "")
		again, _ := h.do(http.MethodPost, "/v1/dispatches", body, "")
		if first.StatusCode != http.StatusCreated || again.StatusCode != http.StatusOK {
			t.Errorf("statuses %d then %d, want 201 then 200", first.StatusCode, again.StatusCode)
		}
		if loc := first.Header.Get("Location"); loc != "/v1/dispatches/same-http" {
			t.Errorf("Location %q", loc)
		}
	})
}

// lastSeq returns the lifecycle stream's last sequence.
func (h *harness) lastSeq() uint64 {
	h.t.Helper()
	return natstest.StreamInfo(h.t, h.js, lifecycle.StreamLifecycle).State.LastSeq
}

// nextFailed returns the first failed event after sequence after.
func (h *harness) nextFailed(after uint64) *lifecycle.Failed {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(h.t.Context(), waitFor)
	defer cancel()
	cons, err := h.js.OrderedConsumer(ctx, lifecycle.StreamLifecycle, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{lifecycle.LifecycleFilter(lifecycle.KindFailed, "", "")},
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy, OptStartSeq: after + 1,
	})
	if err != nil {
		h.t.Fatal(err)
	}
	m, err := cons.Next(jetstream.FetchMaxWait(waitFor))
	if err != nil {
		h.t.Fatalf("no failed event: %v", err)
	}
	_, d := natstest.Lifecycle(h.t, m.Headers(), m.Data())
	return d.(*lifecycle.Failed)
}

// TestValidationErrorsThroughEachDoor refuses each bad request on every
// door, with tracing off and on: a recording span must not turn a refusal
// into an accepted empty record.
func TestValidationErrorsThroughEachDoor(t *testing.T) {
	t.Run("tracing off", validationErrorsThroughEachDoor)
	t.Run("tracing on", func(t *testing.T) {
		prev := otel.GetTracerProvider()
		tp := sdktrace.NewTracerProvider()
		otel.SetTracerProvider(tp)
		t.Cleanup(func() { otel.SetTracerProvider(prev); _ = tp.Shutdown(context.Background()) })
		validationErrorsThroughEachDoor(t)
	})
}

func validationErrorsThroughEachDoor(t *testing.T) {
	h := newHarness(t, dispatcher.Config{})
	big := `{"subagent":"planner","input":{"blob":"` + strings.Repeat("x", 600<<10) + `"}}`
	cases := []struct {
		name, body, field string
		syncOnly          bool // the stream subject names the sub-agent, so it cannot be missing or malformed there
		subject           string
	}{
		{name: "missing subagent", body: `{"input":{}}`, field: "subagent", syncOnly: true},
		{name: "malformed subagent", body: `{"subagent":"no way"}`, field: "subagent", syncOnly: true},
		{name: "unknown subagent", body: `{"subagent":"ghost"}`, field: "subagent", subject: "ghost"},
		{name: "input not an object", body: `{"subagent":"planner","input":[1,2]}`, field: "input"},
		{name: "input a string", body: `{"subagent":"planner","input":"do it"}`, field: "input"},
		{name: "input too large", body: big, field: "input"},
		{name: "timeout unparsable", body: `{"subagent":"planner","timeout":"soon"}`, field: "timeout"},
		{name: "timeout negative", body: `{"subagent":"planner","timeout":"-5m"}`, field: "timeout"},
		{name: "env bad name", body: `{"subagent":"planner","env":{"1X":"a"}}`, field: "env"},
		{name: "env reserved AGORA", body: `{"subagent":"planner","env":{"AGORA_API_TOKENS":"a"}}`, field: "env"},
		{name: "env reserved NATS", body: `{"subagent":"planner","env":{"nats_url":"a"}}`, field: "env"},
		{name: "env not strings", body: `{"subagent":"planner","env":{"A":1}}`, field: "env"},
		{name: "env not in env_allow", body: `{"subagent":"planner","env":{"OTHER":"a"}}`, field: "env"},
		{name: "env loader hook", body: `{"subagent":"planner","env":{"LD_PRELOAD":"/tmp/evil.so"}}`, field: "env"},
		{name: "env PATH", body: `{"subagent":"planner","env":{"PATH":"/tmp/evil"}}`, field: "env"},
		{name: "unknown field", body: `{"subagent":"planner","inptu":{}}`, field: "inptu"},
		{name: "max_rounds negative", body: `{"subagent":"planner","max_rounds":-1}`, field: "max_rounds"},
		{name: "round negative", body: `{"subagent":"planner","round":-1}`, field: "round"},
		{name: "round wrong type", body: `{"subagent":"planner","round":"two"}`, field: "round"},
		{name: "re-dispatch without thread", body: `{"subagent":"planner","round":1,"parent_id":"p1"}`, field: "thread_id"},
		{name: "root with parent", body: `{"subagent":"planner","parent_id":"p1"}`, field: "parent_id"},
		{name: "bad dispatch id", body: `{"subagent":"planner","dispatch_id":"a.b"}`, field: "dispatch_id"},
		{name: "not JSON", body: `{"subagent":`, field: "request"},
		{name: "not an object", body: `[1]`, field: "request"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Run("http", func(t *testing.T) {
				resp, data := h.do(http.MethodPost, "/v1/dispatches", tc.body, "")
				if resp.StatusCode != http.StatusUnprocessableEntity {
					t.Fatalf("status %d, want 422: %s", resp.StatusCode, data)
				}
				if ct := resp.Header.Get("Content-Type"); ct != "application/problem+json" {
					t.Errorf("content type %q", ct)
				}
				var p client.Problem
				if err := json.Unmarshal(data, &p); err != nil {
					t.Fatal(err)
				}
				if p.Status != 422 || p.Type != client.ProblemInvalidRequest || p.Title == "" || p.Field(tc.field) == "" {
					t.Errorf("problem does not name %s: %s", tc.field, data)
				}
			})
			t.Run("micro", func(t *testing.T) {
				m := h.microCall(lifecycle.APIDispatch, []byte(tc.body), nil)
				if code := m.Header.Get(micro.ErrorCodeHeader); code != "422" {
					t.Fatalf("error code %q, want 422: %s", code, m.Data)
				}
				if desc := m.Header.Get(micro.ErrorHeader); !strings.Contains(desc, tc.field) {
					t.Errorf("error description %q does not name %s", desc, tc.field)
				}
				var p client.Problem
				if err := json.Unmarshal(m.Data, &p); err != nil || p.Field(tc.field) == "" {
					t.Errorf("problem body does not name %s: %s", tc.field, m.Data)
				}
			})
			if tc.syncOnly {
				return
			}
			t.Run("stream", func(t *testing.T) {
				subject := tc.subject
				if subject == "" {
					subject = "planner"
				}
				after := h.lastSeq()
				h.publishRawRequest(subject, tc.body)
				f := h.nextFailed(after)
				if f.Reason != lifecycle.ReasonRejected || !strings.Contains(f.Detail, tc.field+": ") {
					t.Errorf("failed %s %q does not name %s", f.Reason, f.Detail, tc.field)
				}
				if f.Subagent != subject || f.ThreadID != f.DispatchID {
					t.Errorf("failed event ids: %+v", f.Common)
				}
			})
		})
	}
	t.Run("stream only", func(t *testing.T) {
		t.Run("subagent does not match the subject", func(t *testing.T) {
			after := h.lastSeq()
			h.publishRawRequest("planner", `{"subagent":"other","dispatch_id":"mismatch-1"}`)
			f := h.nextFailed(after)
			if f.DispatchID != "mismatch-1" || !strings.Contains(f.Detail, "subagent: ") {
				t.Errorf("failed: %+v", f)
			}
		})
		t.Run("not a CloudEvent", func(t *testing.T) {
			after := h.lastSeq()
			if _, err := h.js.Publish(t.Context(), "agora.requests.planner", []byte(`{"subagent":"planner"}`)); err != nil {
				t.Fatal(err)
			}
			f := h.nextFailed(after)
			if f.Subagent != "planner" || !strings.Contains(f.Detail, "not a CloudEvent") {
				t.Errorf("failed: %+v", f)
			}
		})
		t.Run("the router's re-dispatch is refused on its thread", func(t *testing.T) {
			// The paused round's settings no longer validate: the resume
			// the router made from them is refused where its thread
			// waits for it.
			natstest.Answered(t, h.js, lifecycle.Request{DispatchID: "r2", Subagent: "planner", ThreadID: "t1", ParentID: "r1", Round: 2, Timeout: "never"})
			after := h.lastSeq()
			h.publishRawRequest("planner", `{"subagent":"planner","dispatch_id":"r2","thread_id":"t1","parent_id":"r1","round":2,"timeout":"never","input":{"answer":"","answered_by":""}}`)
			f := h.nextFailed(after)
			if f.DispatchID != "r2" || f.ThreadID != "t1" || f.ParentID != "r1" || f.Round != 2 || !strings.Contains(f.Detail, "timeout") {
				t.Errorf("failed: %+v", f)
			}
		})
		t.Run("a refusal never lands on another dispatch's id", func(t *testing.T) {
			// A dispatch with events and no record (a thread's last
			// event, ended by the router): a request naming its id that
			// cannot be decoded is reported under its own derived id.
			h.publishAsWorker(&lifecycle.Cancelled{Common: lifecycle.Common{DispatchID: "ended-1", ThreadID: "ended", Round: 1, Subagent: "planner"}, By: "agora:router"})
			after := h.lastSeq()
			h.publishRawRequest("planner", `{"subagent":"planner","dispatch_id":"ended-1","inptu":{}}`)
			f := h.nextFailed(after)
			if f.DispatchID == "ended-1" || f.ThreadID != f.DispatchID || !strings.Contains(f.Detail, "dispatch_id ended-1 is another dispatch's") {
				t.Errorf("failed: %+v, want it under its own id, naming ended-1", f)
			}
			for _, thread := range []string{"ended", "ended-1"} {
				if n := h.count(lifecycle.StreamLifecycle, "agora.lifecycle.failed."+thread+".ended-1"); n != 0 {
					t.Errorf("ended-1 has %d failed events in thread %s, want none", n, thread)
				}
			}
		})
		t.Run("a later round that is no resume is refused in a thread of its own", func(t *testing.T) {
			after := h.lastSeq()
			h.publishRawRequest("planner", `{"subagent":"planner","dispatch_id":"r3","thread_id":"t1","parent_id":"r1","round":2,"input":{"answer":"forged"}}`)
			f := h.nextFailed(after)
			if f.DispatchID != "r3" || f.ThreadID != "r3" || f.ParentID != "" || f.Round != 0 || !strings.Contains(f.Detail, "made only by the router") {
				t.Errorf("failed: %+v, want r3 in its own thread, refused as no resume", f)
			}
		})
	})
	h.eventually("requests stream drained", func() bool {
		s, _ := h.js.Stream(t.Context(), lifecycle.StreamRequests)
		info, err := s.Info(t.Context())
		return err == nil && info.State.Msgs == 0
	})
	s, _ := h.js.Stream(t.Context(), lifecycle.StreamDispatch)
	if info, _ := s.Info(t.Context()); info.State.Msgs != 0 {
		t.Errorf("%d invalid requests reached AGORA_DISPATCH", info.State.Msgs)
	}
}

func TestRequestTooLargeForHTTP(t *testing.T) {
	h := newHarness(t, dispatcher.Config{})
	body := `{"subagent":"planner","target":"` + strings.Repeat("x", 2<<20) + `"}`
	resp, data := h.do(http.MethodPost, "/v1/dispatches", body, "")
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("status %d: %s", resp.StatusCode, data)
	}
	var p client.Problem
	if err := json.Unmarshal(data, &p); err != nil || p.Field("request") == "" {
		t.Errorf("problem: %s", data)
	}
	body = `{"subagent":"planner","target":"` + strings.Repeat("x", 950<<10) + `"}`
	resp, data = h.do(http.MethodPost, "/v1/dispatches", body, "")
	if resp.StatusCode != http.StatusUnprocessableEntity || !strings.Contains(string(data), `"request"`) {
		t.Errorf("a request over MaxRequestBytes: %d %s", resp.StatusCode, data)
	}
}

func TestMaxRounds(t *testing.T) {
	h := newHarness(t, dispatcher.Config{})
	redispatch := func(id string, round, maxRounds int) lifecycle.Request {
		return lifecycle.Request{DispatchID: id, Subagent: "planner", ThreadID: "t-rounds", ParentID: "root", Round: round, MaxRounds: maxRounds, QuestionID: "q-root"}
	}
	t.Run("past the definition's limit", func(t *testing.T) {
		d := h.dispatchMicro(redispatch("mr-4", 4, 0)) // planner allows 3
		if d.Record.Status != lifecycle.KindFailed || d.Record.Result == nil || d.Record.Result.Reason != lifecycle.ReasonMaxRounds {
			t.Fatalf("record: %+v", d.Record)
		}
		_, data := h.waitEvent(lifecycle.LifecycleFilter(lifecycle.KindFailed, "t-rounds", "mr-4"))
		if f := data.(*lifecycle.Failed); f.Reason != lifecycle.ReasonMaxRounds || f.Round != 4 || f.ParentID != "root" {
			t.Errorf("failed: %+v", f)
		}
		if q := h.queued("mr-4"); len(q) != 0 {
			t.Errorf("queued %d messages for a dispatch past its round limit", len(q))
		}
		if n := h.count(lifecycle.StreamLifecycle, "agora.lifecycle.accepted.t-rounds.mr-4"); n != 0 {
			t.Errorf("%d accepted events", n)
		}
		again := h.dispatchMicro(redispatch("mr-4", 4, 0))
		if again.Record.Status != lifecycle.KindFailed {
			t.Errorf("a retry: %+v", again.Record)
		}
		if n := h.count(lifecycle.StreamLifecycle, "agora.lifecycle.failed.t-rounds.mr-4"); n != 1 {
			t.Errorf("%d failed events, want 1", n)
		}
	})
	t.Run("at the limit", func(t *testing.T) {
		d := h.dispatchMicro(redispatch("mr-3", 3, 0))
		if st, _ := h.record("mr-3"); d.Record.Status != lifecycle.KindAccepted || !st.Queued {
			t.Errorf("record: %+v, stored queued %v", d.Record, st.Queued)
		}
	})
	t.Run("the request's own limit", func(t *testing.T) {
		d := h.dispatchMicro(redispatch("mr-5", 5, 6))
		if d.Record.Status != lifecycle.KindAccepted || d.Record.Request.MaxRounds != 6 {
			t.Errorf("record: %+v", d.Record)
		}
	})
	t.Run("http answers 201 with the failed record", func(t *testing.T) {
		resp, data := h.do(http.MethodPost, "/v1/dispatches", mustJSON(t, natstest.Answered(t, h.js, redispatch("mr-9", 9, 0))), "")
		if resp.StatusCode != http.StatusCreated || !strings.Contains(string(data), `"max-rounds"`) {
			t.Errorf("%d %s", resp.StatusCode, data)
		}
	})
	t.Run("the stream door", func(t *testing.T) {
		h.publishRequest(redispatch("mr-7", 7, 0))
		_, data := h.waitEvent(lifecycle.LifecycleFilter(lifecycle.KindFailed, "t-rounds", "mr-7"))
		if f := data.(*lifecycle.Failed); f.Reason != lifecycle.ReasonMaxRounds {
			t.Errorf("failed: %+v", f)
		}
	})
}

// interruptedRecord writes the record an acceptance leaves when the
// dispatcher dies right after kv.Create: nothing published.
func (h *harness) interruptedRecord(id string) { h.interruptedRecordAt(id, time.Now()) }

// interruptedRecordAt is interruptedRecord of an acceptance made at t.
func (h *harness) interruptedRecordAt(id string, t time.Time) {
	h.t.Helper()
	kv := natstest.KeyValue(h.t, h.js, lifecycle.BucketSubagents)
	def, err := kv.Get(h.t.Context(), "planner")
	if err != nil {
		h.t.Fatal(err)
	}
	now := t.UTC()
	req := lifecycle.Request{DispatchID: id, ThreadID: id, Subagent: "planner", Input: json.RawMessage(`{"from":"first"}`),
		SubagentRevision: def.Revision(), Timeout: "5m", MaxRounds: 3}
	rec := stored{Record: client.Record{DispatchID: id, ThreadID: id, Subagent: "planner", SubagentRevision: def.Revision(), Status: lifecycle.KindAccepted,
		Traceparent: testTrace, Request: &req, CreatedAt: now, AcceptedAt: &now, UpdatedAt: now}}
	data, _ := json.Marshal(rec)
	dk := natstest.KeyValue(h.t, h.js, lifecycle.BucketDispatches)
	if _, err := dk.Create(h.t.Context(), id, data); err != nil {
		h.t.Fatal(err)
	}
}

func TestCrashSafeAcceptance(t *testing.T) {
	h := newHarness(t, dispatcher.Config{})
	verify := func(t *testing.T, id string) {
		t.Helper()
		h.eventually("record queued", func() bool { r, _ := h.record(id); return r.Queued })
		rec, _ := h.record(id)
		if string(rec.Request.Input) != `{"from":"first"}` {
			t.Errorf("the retry replaced the first request: %s", rec.Request.Input)
		}
		q := h.queued(id)
		if len(q) != 1 || string(q[0].Input) != `{"from":"first"}` {
			t.Fatalf("queued: %+v", q)
		}
		if n := h.count(lifecycle.StreamLifecycle, "agora.lifecycle.accepted."+id+"."+id); n != 1 {
			t.Errorf("%d accepted events, want 1", n)
		}
		e, _ := h.waitEvent(lifecycle.LifecycleFilter(lifecycle.KindAccepted, id, id))
		if lifecycle.TraceID(lifecycle.Traceparent(e)) != lifecycle.TraceID(testTrace) {
			t.Errorf("the finished acceptance lost the stored trace")
		}
		if _, err := h.cl.Thread(t.Context(), id); err != nil {
			t.Errorf("thread index: %v", err)
		}
	}
	t.Run("micro retry", func(t *testing.T) {
		h.interruptedRecord("crash-micro")
		h.dispatchMicro(lifecycle.Request{DispatchID: "crash-micro", Subagent: "planner", Input: json.RawMessage(`{"from":"first"}`)})
		if st, _ := h.record("crash-micro"); !st.Queued {
			t.Errorf("the retry answered before the record was queued")
		}
		verify(t, "crash-micro")
	})
	t.Run("stream redelivery", func(t *testing.T) {
		h.interruptedRecord("crash-stream")
		h.publishRequest(lifecycle.Request{DispatchID: "crash-stream", Subagent: "planner", Input: json.RawMessage(`{"from": "first"}`)})
		verify(t, "crash-stream")
	})
	t.Run("http retry", func(t *testing.T) {
		h.interruptedRecord("crash-http")
		h.dispatchVia("http", "crash-http", `{"dispatch_id":"crash-http","subagent":"planner","input":{"from":"first"},"timeout":"300s"}`)
		if st, _ := h.record("crash-http"); !st.Queued {
			t.Errorf("the retry answered before the record was queued")
		}
		verify(t, "crash-http")
	})
	t.Run("a different request neither completes nor replaces it", func(t *testing.T) {
		id := "crash-other"
		h.interruptedRecord(id)
		m := h.microCall(lifecycle.APIDispatch, []byte(`{"dispatch_id":"crash-other","subagent":"planner","input":{"from":"second"}}`), nil)
		if code := m.Header.Get(micro.ErrorCodeHeader); code != "409" {
			t.Fatalf("micro: %q %s", code, m.Data)
		}
		if rec, _ := h.record(id); rec.Queued || string(rec.Request.Input) != `{"from":"first"}` {
			t.Errorf("the conflicting request touched the record: %+v", rec)
		}
		if n := h.count(lifecycle.StreamLifecycle, "agora.lifecycle.accepted."+id+"."+id); n != 0 {
			t.Errorf("%d accepted events, want none yet", n)
		}
		h.dispatchMicro(lifecycle.Request{DispatchID: id, Subagent: "planner", Input: json.RawMessage(`{"from":"first"}`)})
		verify(t, id)
	})
	t.Run("died after queueing", func(t *testing.T) {
		id := "crash-late"
		h.interruptedRecord(id)
		// What the dead dispatcher had published already.
		rec, _ := h.record(id)
		h.publishAsWorker(&lifecycle.Accepted{Common: rec.Common(), SubagentRevision: rec.SubagentRevision}, lifecycle.WithTraceparent(testTrace))
		e, err := lifecycle.New(lifecycle.Source("dispatcher", "dead"), rec.Request)
		if err != nil {
			t.Fatal(err)
		}
		msg, _ := lifecycle.Encode("agora.dispatch.planner", e)
		if _, err := h.js.PublishMsg(t.Context(), msg); err != nil {
			t.Fatal(err)
		}
		h.dispatchMicro(lifecycle.Request{DispatchID: id, Subagent: "planner", Input: json.RawMessage(`{"from":"first"}`)})
		verify(t, id)
	})
}

// A dispatch_id reused for a different request is refused with 409 (HTTP)
// or a micro error 409, naming the fields that differ; on the stream door
// it is dropped without a second terminal event. The same request again is
// still the idempotent replay, however its JSON is formatted.
func TestReusedIDWithADifferentRequest(t *testing.T) {
	h := newHarness(t, dispatcher.Config{})
	h.dispatchVia("http", "taken-1", `{"dispatch_id":"taken-1","subagent":"planner","input":{"a":1,"b":[1,2]},"labels":{"team":"x"}}`)

	// The same request, formatted otherwise: the same dispatch.
	same := h.dispatchVia("micro", "taken-1", `{"labels":{"team":"x"}, "input":{"b":[1, 2],"a":1}, "subagent":"planner","dispatch_id":"taken-1"}`)
	if same.DispatchID != "taken-1" {
		t.Fatalf("replay = %+v", same)
	}

	different := `{"dispatch_id":"taken-1","subagent":"planner","input":{"a":2},"labels":{"team":"y"}}`
	resp, data := h.do(http.MethodPost, "/v1/dispatches", different, "")
	var p client.Problem
	if err := json.Unmarshal(data, &p); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusConflict || p.Type != dispatcher.ProblemConflict || p.DispatchID != "taken-1" ||
		p.Field("input") == "" || p.Field("labels") == "" || p.Field("subagent") != "" || !strings.Contains(p.Detail, "input, labels") {
		t.Errorf("HTTP: %d %s", resp.StatusCode, data)
	}
	// The Go client returns the micro door's problem as it is.
	_, err := h.cl.Dispatch(t.Context(), lifecycle.Request{DispatchID: "taken-1", Subagent: "planner", Input: json.RawMessage(`{"a":1,"b":[1,2]}`)})
	var cp *client.Problem
	if !errors.As(err, &cp) || cp.Status != http.StatusConflict || cp.Type != dispatcher.ProblemConflict || cp.Field("labels") == "" ||
		!strings.Contains(err.Error(), "(labels differ)") || errors.Is(err, client.ErrUnavailable) {
		t.Errorf("client.Dispatch: %v", err)
	}
	m := h.microCall(lifecycle.APIDispatch, []byte(different), nil)
	if code := m.Header.Get(micro.ErrorCodeHeader); code != "409" || !strings.Contains(string(m.Data), "input, labels") {
		t.Errorf("micro: %s %s", code, m.Data)
	}
	before := h.lastSeq()
	h.publishRawRequest("planner", different)
	h.eventually("the conflicting stream request to be dropped", func() bool { return h.count(lifecycle.StreamRequests, "agora.requests.planner") == 0 })
	if n := h.count(lifecycle.StreamLifecycle, "agora.lifecycle.failed.taken-1.taken-1"); n != 0 {
		t.Errorf("the stream door published %d failed events for the taken id", n)
	}
	if h.lastSeq() != before {
		t.Errorf("the stream door published lifecycle events for a conflicting request")
	}
	rec, _ := h.record("taken-1")
	if string(rec.Request.Input) != `{"a":1,"b":[1,2]}` || rec.Request.Labels["team"] != "x" {
		t.Errorf("the record changed: %+v", rec.Request)
	}
	if q := h.queued("taken-1"); len(q) != 1 {
		t.Errorf("%d queued, want 1", len(q))
	}
	for _, want := range []string{
		`agora_dispatcher_requests_total{door="stream",result="conflict"} 1`,
		`agora_dispatcher_requests_total{door="http",result="conflict"} 1`,
		`agora_dispatcher_requests_total{door="micro",result="conflict"} 2`,
		`agora_dispatcher_requests_total{door="micro",result="duplicate"} 1`,
	} {
		_, data := h.do(http.MethodGet, "/metrics", "", "")
		if !strings.Contains(string(data), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// A later round that reuses the dispatch id of another thread's dispatch
// is a conflict, and its thread's index never lists that dispatch (the
// thread view would show it and a thread cancel would cancel it).
func TestReusedIDOfAnotherThread(t *testing.T) {
	h := newHarness(t, dispatcher.Config{})
	h.dispatchVia("http", "owned-1", `{"dispatch_id":"owned-1","subagent":"planner"}`)
	body := `{"dispatch_id":"owned-1","subagent":"planner","thread_id":"other-thread","parent_id":"p-1","round":1}`
	for _, door := range []string{"http", "micro"} {
		var status string
		if door == "http" {
			resp, data := h.do(http.MethodPost, "/v1/dispatches", body, "")
			status = fmt.Sprint(resp.StatusCode, " ", string(data))
		} else {
			m := h.microCall(lifecycle.APIDispatch, []byte(body), nil)
			status = m.Header.Get(micro.ErrorCodeHeader) + " " + string(m.Data)
		}
		if !strings.HasPrefix(status, "409 ") {
			t.Errorf("%s: %s, want 409", door, status)
		}
	}
	resp, data := h.do(http.MethodGet, "/v1/threads/other-thread", "", "")
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("thread other-thread: %d %s, want 404 (no index)", resp.StatusCode, data)
	}
}

// Which differences make a reused dispatch_id a conflict: every field a
// client or the router sets, compared by value; what the dispatcher fills
// in (timeout, max_rounds, a root's thread_id, subagent_revision) counts
// only when the retry sets it otherwise.
func TestReusedIDFieldByField(t *testing.T) {
	h := newHarness(t, dispatcher.Config{})
	const root = `"subagent":"planner","input":{"n":1,"list":[1.5,"x"],"o":{"k":true}},"target":"repo@main","env":{"FOO":"fast"},"labels":{"team":"x"}`
	const resume = `"subagent":"planner","input":{"answer":"A","answered_by":"human:ann"},"thread_id":"fbf-thread","parent_id":"fbf-parent","round":1,"question_id":"q-fbf-parent","partial_state_ref":"fbf-parent"`
	for _, c := range []struct {
		name        string
		first, then string // the members after dispatch_id
		want        string // the fields named, "" for the same dispatch
	}{
		{"same request", root, root, ""},
		{"input reformatted", root, `"subagent":"planner","input":{ "o":{"k":true}, "list":[15e-1, "x"], "n":1.0 },"target":"repo@main","env":{"FOO":"fast"},"labels":{"team":"x"}`, ""},
		{"defaults spelt out", root, root + `,"timeout":"300s","max_rounds":3,"round":0,"subagent_revision":99`, ""},
		{"a root's own thread_id", root, root + `,"thread_id":"$ID"`, ""},
		{"no input against {}", `"subagent":"planner"`, `"subagent":"planner","input":{}`, ""},
		{"input", root, `"subagent":"planner","input":{"n":2,"list":[1.5,"x"],"o":{"k":true}},"target":"repo@main","env":{"FOO":"fast"},"labels":{"team":"x"}`, "input"},
		{"input left out", root, `"subagent":"planner","target":"repo@main","env":{"FOO":"fast"},"labels":{"team":"x"}`, "input"},
		{"array order", `"subagent":"planner","input":{"l":[1,2]}`, `"subagent":"planner","input":{"l":[2,1]}`, "input"},
		{"subagent", `"subagent":"planner"`, `"subagent":"reviewer"`, "subagent"},
		{"target env labels", root, `"subagent":"planner","input":{"n":1,"list":[1.5,"x"],"o":{"k":true}},"target":"repo@dev","env":{},"labels":{"team":"x","extra":"1"}`, "target, env, labels"},
		{"timeout", `"subagent":"planner","timeout":"5m"`, `"subagent":"planner","timeout":"6m"`, "timeout"},
		{"timeout against the default", `"subagent":"planner"`, `"subagent":"planner","timeout":"1m"`, "timeout"},
		{"max_rounds", `"subagent":"planner","max_rounds":5`, `"subagent":"planner","max_rounds":4`, "max_rounds"},
		{"a resume's same request", resume, resume, ""},
		{"partial_state_ref", resume, `"subagent":"planner","input":{"answer":"A","answered_by":"human:ann"},"thread_id":"fbf-thread","parent_id":"fbf-parent","round":1,"question_id":"q-fbf-parent","partial_state_ref":"other"`, "partial_state_ref"},
		{"round and parent", resume, `"subagent":"planner","input":{"answer":"A","answered_by":"human:ann"},"thread_id":"fbf-thread","parent_id":"fbf-other","round":2,"question_id":"q-fbf-parent","partial_state_ref":"fbf-parent"`, "parent_id, round"},
		{"a root against a resume", resume, `"subagent":"planner"`, "input, thread_id, parent_id, round, question_id, partial_state_ref"},
	} {
		t.Run(c.name, func(t *testing.T) {
			id := "fbf-" + strings.NewReplacer(" ", "-", "'", "", "{}", "o").Replace(c.name)
			body := func(members string) []byte {
				return []byte(`{"dispatch_id":"` + id + `",` + strings.ReplaceAll(members, "$ID", id) + `}`)
			}
			if c.first == resume {
				// The router answered fbf-parent's question into this
				// dispatch: the first request is its resume.
				natstest.Answered(t, h.js, lifecycle.Request{DispatchID: id, Subagent: "planner", ThreadID: "fbf-thread", ParentID: "fbf-parent", Round: 1,
					PartialStateRef: "fbf-parent", Input: json.RawMessage(`{"answer":"A","answered_by":"human:ann"}`)})
			}
			if m := h.microCall(lifecycle.APIDispatch, body(c.first), nil); m.Header.Get(micro.ErrorCodeHeader) != "" {
				t.Fatalf("first: %s", m.Data)
			}
			m := h.microCall(lifecycle.APIDispatch, body(c.then), nil)
			code := m.Header.Get(micro.ErrorCodeHeader)
			if c.want == "" {
				var rec client.Record
				if code != "" || json.Unmarshal(m.Data, &rec) != nil || rec.DispatchID != id {
					t.Fatalf("want the same dispatch, got %q %s", code, m.Data)
				}
				return
			}
			var p client.Problem
			if err := json.Unmarshal(m.Data, &p); err != nil {
				t.Fatal(err)
			}
			if code != "409" || p.Status != http.StatusConflict || p.Type != dispatcher.ProblemConflict ||
				!strings.Contains(p.Detail, "("+c.want+" differ)") || len(p.Errors) != len(strings.Split(c.want, ", ")) ||
				!strings.Contains(m.Header.Get(micro.ErrorHeader), c.want) {
				t.Errorf("got %q %q %s, want a conflict naming %s", code, m.Header.Get(micro.ErrorHeader), m.Data, c.want)
			}
		})
	}
}

// TestOneVersion: the micro service and the served OpenAPI document report
// the build's version (internal/buildinfo), the one every part reports.
func TestOneVersion(t *testing.T) {
	h := newHarness(t, dispatcher.Config{})
	subj, err := micro.ControlSubject(micro.InfoVerb, "agora", "")
	if err != nil {
		t.Fatal(err)
	}
	m, err := h.nc.Request(subj, nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var info micro.Info
	if err := json.Unmarshal(m.Data, &info); err != nil {
		t.Fatal(err)
	}
	if info.Version != buildinfo.Version() {
		t.Errorf("micro info version %q, want %q", info.Version, buildinfo.Version())
	}
	_, data := h.do(http.MethodGet, "/v1/openapi.json", "", "")
	var doc struct {
		Info struct {
			Version string `json:"version"`
		} `json:"info"`
	}
	if err := json.Unmarshal(data, &doc); err != nil || doc.Info.Version != buildinfo.Version() {
		t.Errorf("served OpenAPI info.version %q (%v), want %q", doc.Info.Version, err, buildinfo.Version())
	}
}
