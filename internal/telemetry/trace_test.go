package telemetry_test

import (
	"context"
	"encoding/hex"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/agora-dispatch/agora/harness/systemtest"
	"github.com/agora-dispatch/agora/internal/telemetry"
	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/answerer"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// receiver is an OTLP trace receiver: it keeps every span exported to it,
// over gRPC or HTTP, with its resource's service name.
type receiver struct {
	collectortrace.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans []span
}

type span struct {
	service           string
	name              string
	trace, id, parent string
	kind              tracepb.Span_SpanKind
	attrs             map[string]string
	start, end        time.Time
}

func (r *receiver) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	r.add(req)
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

func (r *receiver) add(req *collectortrace.ExportTraceServiceRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		service := attrs(rs.GetResource().GetAttributes())["service.name"]
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				r.spans = append(r.spans, span{
					service: service, name: s.GetName(), kind: s.GetKind(),
					trace: hex.EncodeToString(s.GetTraceId()), id: hex.EncodeToString(s.GetSpanId()), parent: hex.EncodeToString(s.GetParentSpanId()),
					attrs: attrs(s.GetAttributes()),
					start: time.Unix(0, int64(s.GetStartTimeUnixNano())), end: time.Unix(0, int64(s.GetEndTimeUnixNano())),
				})
			}
		}
	}
}

func attrs(kvs []*commonpb.KeyValue) map[string]string {
	out := map[string]string{}
	for _, kv := range kvs {
		v := kv.GetValue()
		switch x := v.GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			out[kv.GetKey()] = x.StringValue
		case *commonpb.AnyValue_IntValue:
			out[kv.GetKey()] = strconv.FormatInt(x.IntValue, 10)
		case *commonpb.AnyValue_BoolValue:
			out[kv.GetKey()] = strconv.FormatBool(x.BoolValue)
		default:
			out[kv.GetKey()] = v.String()
		}
	}
	return out
}

func (r *receiver) all() []span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]span(nil), r.spans...)
}

// grpcReceiver serves OTLP over gRPC on a loopback port.
func grpcReceiver(t *testing.T) (*receiver, string) {
	t.Helper()
	rcv := &receiver{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(gs, rcv)
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	return rcv, "http://" + ln.Addr().String()
}

// setup turns tracing on for the test, exporting to endpoint.
func setup(t *testing.T, endpoint, protocol string) func() {
	t.Helper()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
	t.Setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
	t.Setenv("OTEL_SERVICE_NAME", "agora-test")
	// Export ended spans every 50ms, so a test can wait for them.
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
	shutdown, err := telemetry.Setup(t.Context(), "agora-dev")
	if err != nil {
		t.Fatal(err)
	}
	if !telemetry.Enabled() {
		t.Fatal("tracing is not on with an endpoint set")
	}
	var once sync.Once
	flush := func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := shutdown(ctx); err != nil {
				t.Errorf("flush traces: %v", err)
			}
		})
	}
	t.Cleanup(flush)
	return flush
}

// asker asks in round 0 and finishes with its input in round 1.
const asker = `if [ "$AGORA_ROUND" -lt 1 ]; then
  printf '{"question":"A or B?","options":["A","B"]}' > "$AGORA_NEEDS_INPUT_FILE"
else
  cp "$AGORA_INPUT_FILE" "$AGORA_OUTPUT_FILE"
fi`

// A two-round thread is one trace received over OTLP/gRPC, each span the
// child of what caused it: dispatch → run → ask → the answerer → the
// answer → the re-dispatch → the next round's dispatch → its run.
func TestTwoRoundThreadIsOneTrace(t *testing.T) {
	rcv, endpoint := grpcReceiver(t)
	flush := setup(t, endpoint, "grpc")
	sys := systemtest.Start(t, systemtest.Options{Routes: "routes:\n  - name: team\n    answerer: agent\n"})
	sys.Shell("tracer", asker)
	sys.Go("answerer", func(ctx context.Context) error {
		return answerer.ServeClient(ctx, sys.Client, "team", answerer.HandlerFunc(func(context.Context, lifecycle.Question) (answerer.Reply, error) {
			return answerer.Answer("B"), nil
		}), answerer.WithAnsweredBy("bot"))
	})
	d, err := sys.Client.Dispatch(t.Context(), lifecycle.Request{Subagent: "tracer"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	end, err := sys.Client.Follow(ctx, d.ThreadID, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := end.Data.(*lifecycle.Finished); !ok {
		t.Fatalf("thread ended %T", end.Data)
	}
	// The last spans end after the terminal event: round 1's run (its ack
	// and clean-up under it) and the projection of the finished event.
	testkit.Eventually(t, 30*time.Second, "round 1's run span and the finished event's projection span", func() bool {
		var run1, projected bool
		for _, s := range rcv.all() {
			run1 = run1 || s.name == "agora.run" && s.attrs["agora.round"] == "1"
			projected = projected || s.name == "agora.dispatch.project" && s.attrs["agora.kind"] == "finished"
		}
		return run1 && projected
	})
	flush()

	byName := map[string][]span{}
	byID := map[string]span{}
	traces := map[string]bool{}
	for _, s := range rcv.all() {
		byName[s.name] = append(byName[s.name], s)
		byID[s.id] = s
		traces[s.trace] = true
		if s.service != "agora-test" {
			t.Errorf("span %s from service %q, want agora-test (OTEL_SERVICE_NAME)", s.name, s.service)
		}
	}
	if len(traces) != 1 {
		t.Errorf("the thread is %d traces, want 1", len(traces))
	}
	round := func(name string, r int) span {
		t.Helper()
		for _, s := range byName[name] {
			if s.attrs["agora.round"] == strconv.Itoa(r) {
				return s
			}
		}
		t.Fatalf("no %s span of round %d; spans: %v", name, r, names(byName))
		return span{}
	}
	one := func(name string) span {
		t.Helper()
		if len(byName[name]) != 1 {
			t.Fatalf("%d %s spans, want 1; spans: %v", len(byName[name]), name, names(byName))
		}
		return byName[name][0]
	}
	dispatch0, dispatch1 := round("agora.dispatch", 0), round("agora.dispatch", 1)
	run0, run1 := round("agora.run", 0), round("agora.run", 1)
	queue0, queue1 := round("agora.queue", 0), round("agora.queue", 1)
	ask, handle, ans, redispatch := one("agora.question.ask"), one("agora.answerer.handle"), one("agora.question.answer"), one("agora.question.redispatch")
	for _, c := range []struct {
		child, parent span
	}{
		{run0, dispatch0}, {queue0, dispatch0}, {ask, run0}, {handle, ask}, {ans, handle},
		{redispatch, ans}, {dispatch1, redispatch}, {run1, dispatch1}, {queue1, dispatch1},
	} {
		if c.child.parent != c.parent.id {
			p := byID[c.child.parent]
			t.Errorf("%s (round %s) has parent %q (%s), want %s", c.child.name, c.child.attrs["agora.round"], c.child.parent, p.name, c.parent.name)
		}
	}
	if dispatch0.parent != "" {
		t.Errorf("the first dispatch has a parent %q; the caller had no trace", dispatch0.parent)
	}
	// The stages (agora bench --breakdown): each under its round's span.
	stages := []struct {
		name, parent string
		rounds       []int
	}{
		{"agora.dispatch.validate", "agora.dispatch", []int{0, 1}},
		{"agora.dispatch.record", "agora.dispatch", []int{0, 1}},
		{"agora.dispatch.parent", "agora.dispatch", []int{1}}, // a re-dispatch reads its parent's cancel mark
		{"agora.dispatch.publish", "agora.dispatch", []int{0, 1}},
		{"agora.run.lookup", "agora.run", []int{0, 1}},
		{"agora.run.workspace", "agora.run", []int{0, 1}},
		{"agora.run.claim", "agora.run", []int{0, 1}},
		{"agora.run.process", "agora.run", []int{0, 1}},
		{"agora.run.sentinel", "agora.run", []int{0, 1}},
		{"agora.run.publish", "agora.run", []int{0, 1}},
		{"agora.run.ack", "agora.run", []int{0, 1}},
		{"agora.run.cleanup", "agora.run", []int{0, 1}},
	}
	for _, st := range stages {
		if n := len(byName[st.name]); n != len(st.rounds) {
			t.Errorf("%d %s spans, want %d (rounds %v)", n, st.name, len(st.rounds), st.rounds)
			continue
		}
		for _, r := range st.rounds {
			want := round(st.parent, r)
			var found bool
			for _, s := range byName[st.name] {
				found = found || s.parent == want.id
			}
			if !found {
				t.Errorf("no %s span under round %d's %s", st.name, r, st.parent)
			}
		}
	}
	if ps := byName["agora.dispatch.publish"]; len(ps) > 0 && ps[0].kind != tracepb.Span_SPAN_KIND_PRODUCER {
		t.Errorf("agora.dispatch.publish is %v, want a producer span", ps[0].kind)
	}
	// The projection applies each lifecycle event under the span that
	// published it: accepted under the dispatch, the run's events under
	// the run.
	projected := map[string]span{}
	for _, s := range byName["agora.dispatch.project"] {
		projected[s.attrs["agora.kind"]+"/"+s.attrs["agora.round"]] = s
	}
	for _, w := range []struct {
		kind, parent string
		round        int
	}{
		{"accepted", "agora.dispatch", 0}, {"started", "agora.run", 0}, {"needs_input", "agora.run", 0},
		{"accepted", "agora.dispatch", 1}, {"started", "agora.run", 1}, {"finished", "agora.run", 1},
	} {
		s, ok := projected[w.kind+"/"+strconv.Itoa(w.round)]
		if !ok {
			t.Errorf("no agora.dispatch.project span of %s in round %d; got %v", w.kind, w.round, slices.Collect(maps.Keys(projected)))
			continue
		}
		if want := round(w.parent, w.round); s.parent != want.id {
			t.Errorf("agora.dispatch.project of %s (round %d) under %q, want round %d's %s", w.kind, w.round, byID[s.parent].name, w.round, w.parent)
		}
		if s.kind != tracepb.Span_SPAN_KIND_CONSUMER {
			t.Errorf("agora.dispatch.project is %v, want a consumer span", s.kind)
		}
	}
	want := map[string]map[string]string{
		"dispatch0":  {"agora.dispatch_id": d.DispatchID, "agora.thread_id": d.ThreadID, "agora.subagent": "tracer", "agora.door": "micro", "messaging.system": "nats", "messaging.destination.name": "agora.api.dispatch", "agora.outcome": "accepted"},
		"dispatch1":  {"agora.thread_id": d.ThreadID, "agora.door": "stream", "messaging.destination.name": "agora.requests.tracer"},
		"run0":       {"agora.dispatch_id": d.DispatchID, "messaging.system": "nats", "messaging.destination.name": "agora.dispatch.tracer", "agora.outcome": "needs_input"},
		"run1":       {"agora.outcome": "finished"},
		"ask":        {"agora.question_id": lifecycle.QuestionID(d.DispatchID), "agora.route": "team"},
		"handle":     {"agora.question_id": lifecycle.QuestionID(d.DispatchID), "agora.route": "team", "agora.outcome": "accepted"},
		"answer":     {"agora.question_id": lifecycle.QuestionID(d.DispatchID), "agora.outcome": "accepted", "agora.answered_by": "bot", "agora.route": "team"},
		"redispatch": {"agora.thread_id": d.ThreadID, "agora.round": "1", "messaging.destination.name": "agora.requests.tracer"},
	}
	got := map[string]span{"dispatch0": dispatch0, "dispatch1": dispatch1, "run0": run0, "run1": run1, "ask": ask, "handle": handle, "answer": ans, "redispatch": redispatch}
	for k, w := range want {
		for a, v := range w {
			if got[k].attrs[a] != v {
				t.Errorf("%s: %s = %q, want %q", k, a, got[k].attrs[a], v)
			}
		}
	}
	if !queue0.end.After(queue0.start) || queue0.end.After(run0.start.Add(time.Millisecond)) {
		t.Errorf("queue span %v–%v does not end where the run starts (%v)", queue0.start, queue0.end, run0.start)
	}
	if run0.kind != tracepb.Span_SPAN_KIND_CONSUMER || dispatch0.kind != tracepb.Span_SPAN_KIND_SERVER || dispatch1.kind != tracepb.Span_SPAN_KIND_CONSUMER {
		t.Errorf("kinds: run %v, dispatch %v / %v", run0.kind, dispatch0.kind, dispatch1.kind)
	}
}

// OTLP over HTTP (the default protocol) works too.
func TestExportOverHTTP(t *testing.T) {
	rcv := &receiver{}
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
			http.Error(w, "want POST /v1/traces application/x-protobuf", http.StatusBadRequest)
			return
		}
		b, _ := io.ReadAll(r.Body)
		var req collectortrace.ExportTraceServiceRequest
		if err := proto.Unmarshal(b, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		rcv.add(&req)
		w.Header().Set("Content-Type", "application/x-protobuf")
		out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
		_, _ = w.Write(out)
	}))
	t.Cleanup(web.Close)
	flush := setup(t, web.URL, "http/protobuf")
	sys := systemtest.Start(t, systemtest.Options{})
	sys.Shell("quick", `echo '{}' > "$AGORA_OUTPUT_FILE"`)
	d, err := sys.Client.Dispatch(t.Context(), lifecycle.Request{Subagent: "quick"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if _, err := sys.Client.Follow(ctx, d.ThreadID, nil); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	testkit.Eventually(t, 30*time.Second, "the dispatch's, run's and queue's spans over HTTP", func() bool {
		for _, s := range rcv.all() {
			if s.attrs["agora.dispatch_id"] == d.DispatchID {
				seen[s.name] = true
			}
		}
		return seen["agora.dispatch"] && seen["agora.run"] && seen["agora.queue"]
	})
	flush()
	for _, n := range []string{"agora.dispatch", "agora.run", "agora.queue"} {
		if !seen[n] {
			t.Errorf("no %s span for %s over HTTP; got %v", n, d.DispatchID, seen)
		}
	}
}

func TestConfig(t *testing.T) {
	for name, tc := range map[string]struct {
		c    telemetry.Config
		on   bool
		want string
	}{
		"nothing set":        {telemetry.Config{}, false, ""},
		"endpoint":           {telemetry.Config{Endpoint: true}, true, ""},
		"exporter otlp":      {telemetry.Config{Exporter: "otlp"}, true, ""},
		"exporter none wins": {telemetry.Config{Endpoint: true, Exporter: "none"}, false, ""},
		"sdk disabled":       {telemetry.Config{Endpoint: true, Disabled: true}, false, ""},
		"bad protocol":       {telemetry.Config{Endpoint: true, Protocol: "http/json"}, true, "OTEL_EXPORTER_OTLP_PROTOCOL"},
		"bad exporter":       {telemetry.Config{Exporter: "jaeger"}, false, "OTEL_TRACES_EXPORTER"},
		"bad sampler":        {telemetry.Config{Endpoint: true, Sampler: "sometimes"}, true, "OTEL_TRACES_SAMPLER"},
		"good sampler":       {telemetry.Config{Endpoint: true, Sampler: "parentbased_traceidratio"}, true, ""},
	} {
		if got := tc.c.On(); got != tc.on {
			t.Errorf("%s: On = %v, want %v", name, got, tc.on)
		}
		err := tc.c.Validate()
		if (err != nil) != (tc.want != "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: Validate = %v, want an error naming %q", name, err, tc.want)
		}
	}
}

func names(m map[string][]span) map[string]int {
	out := map[string]int{}
	for k, v := range m {
		out[k] = len(v)
	}
	return out
}
