package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace/noop"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/agora-dispatch/agora/internal/telemetry"
)

// Stage is one kind of span of the traced row: how long that stage of the
// path took (docs/tracing.md names the spans).
type Stage struct {
	Span  string  `json:"span"`
	Count int     `json:"count"`
	P50MS float64 `json:"p50_ms"`
	P99MS float64 `json:"p99_ms"`
}

// otlpSink is an OTLP/HTTP trace receiver in this process: it decodes
// every export, as a collector would, and keeps each span's duration by
// name.
type otlpSink struct {
	mu    sync.Mutex
	spans []span
}

type span struct {
	name       string
	id, parent string
	start      time.Time
	dur        time.Duration
}

func (s *otlpSink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/traces" {
		http.Error(w, "want POST /v1/traces", http.StatusNotFound)
		return
	}
	b, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var req collectortrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(b, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				start, end := sp.GetStartTimeUnixNano(), sp.GetEndTimeUnixNano()
				s.spans = append(s.spans, span{name: sp.GetName(), id: string(sp.GetSpanId()), parent: string(sp.GetParentSpanId()),
					start: time.Unix(0, int64(start)), dur: time.Duration(end - min(start, end))})
			}
		}
	}
	s.mu.Unlock()
	out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// under gives each span kind's timings over the spans of the trees rooted
// at the spans named root that started within [from, to): each root and
// everything it caused, and nothing that ran beside it (a warm-up
// dispatch's ack or projection that ends inside the window). With the
// serial round trips' window, one dispatch at a time, a stage's time is
// its own and not time spent queueing behind others.
func (s *otlpSink) under(root string, from, to time.Time) []Stage {
	s.mu.Lock()
	defer s.mu.Unlock()
	children := map[string][]span{}
	var queue []span
	for _, sp := range s.spans {
		children[sp.parent] = append(children[sp.parent], sp)
		if sp.name == root && !sp.start.Before(from) && sp.start.Before(to) {
			queue = append(queue, sp)
		}
	}
	byName := map[string][]time.Duration{}
	for len(queue) > 0 {
		sp := queue[0]
		queue = queue[1:]
		byName[sp.name] = append(byName[sp.name], sp.dur)
		queue = append(queue, children[sp.id]...)
	}
	return summarize(byName)
}

// summarize gives each span kind's count, p50 and p99, in path order.
func summarize(byName map[string][]time.Duration) []Stage {
	var out []Stage
	for name, ds := range byName {
		slices.Sort(ds)
		out = append(out, Stage{Span: name, Count: len(ds), P50MS: percentileMS(ds, 0.5), P99MS: percentileMS(ds, 0.99)})
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := stagePos(out[i].Span), stagePos(out[j].Span)
		if a != b {
			return a < b
		}
		return out[i].Span < out[j].Span
	})
	return out
}

// pathOrder lists the spans in the order a dispatch meets them
// (docs/tracing.md), each stage after the span it belongs to.
var pathOrder = []string{
	"agora.question.answer", "agora.question.redispatch", "agora.dispatch", "agora.dispatch.validate", "agora.dispatch.record", "agora.dispatch.parent",
	"agora.dispatch.publish", "agora.queue",
	"agora.run", "agora.run.lookup", "agora.run.workspace", "agora.run.claim", "agora.run.process",
	"agora.run.sentinel", "agora.run.publish", "agora.run.ack", "agora.run.cleanup", "agora.dispatch.project",
}

// stagePos is a span's place in pathOrder; any other span comes after.
func stagePos(name string) int {
	if i := slices.Index(pathOrder, name); i >= 0 {
		return i
	}
	return len(pathOrder)
}

// traced measures the end-to-end no-op path with tracing on as a
// deployment turns it on (OTEL_EXPORTER_OTLP_ENDPOINT; the SDK's batch
// processor and OTLP/HTTP exporter), every span exported to an
// in-process receiver. It returns the row, the spans received and the
// per-stage breakdown they give.
func traced(ctx context.Context, url string, js jetstream.JetStream, dir string, cfg Config) (Row, int, []Stage, error) {
	var (
		row                  Row
		serialFrom, serialTo time.Time
	)
	sink, err := withTracing(ctx, func() error {
		sc, stop, err := workerPath(ctx, url, js, dir, cfg.Concurrency, "noop", doorStream)
		if err != nil {
			return err
		}
		defer stop()
		sc.name = "agora end to end (request → dispatcher → worker), no-op runtime, tracing on (OTLP/HTTP to an in-process receiver)"
		sc.phase = window(&serialFrom, &serialTo)
		row, err = measure(ctx, sc, cfg)
		return err
	})
	if err != nil {
		return Row{}, 0, nil, err
	}
	sink.mu.Lock()
	n := len(sink.spans)
	sink.mu.Unlock()
	return row, n, sink.under("agora.dispatch", serialFrom, serialTo), nil
}

// tracedResume measures resume latency as resume does, with tracing on,
// and returns the stages of each answer's trace: the router's answer and
// re-dispatch, the next round's acceptance and its run.
func tracedResume(ctx context.Context, url string, js jetstream.JetStream, dir string, samples int) ([]Stage, error) {
	var from, to time.Time
	sink, err := withTracing(ctx, func() error {
		_, err := resume(ctx, url, js, dir, samples, window(&from, &to), false)
		return err
	})
	if err != nil {
		return nil, err
	}
	return sink.under("agora.question.answer", from, to), nil
}

// window returns the phase function that notes when the serial phase
// starts and ends.
func window(from, to *time.Time) func(string) {
	return func(name string) {
		switch name {
		case phaseSerial:
			*from = time.Now()
		case phaseThroughput:
			*to = time.Now()
		}
	}
}

// withTracing runs fn with tracing on as a deployment turns it on
// (OTEL_EXPORTER_OTLP_ENDPOINT; the SDK's batch processor and OTLP/HTTP
// exporter), every span exported to an in-process receiver, and returns
// the receiver once every span is flushed. Tracing is off again after.
func withTracing(ctx context.Context, fn func() error) (*otlpSink, error) {
	sink := &otlpSink{}
	web := httptest.NewServer(sink)
	defer web.Close()
	restore := setenv(map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT": web.URL, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "", "OTEL_TRACES_SAMPLER": "",
	})
	defer restore()
	shutdown, err := telemetry.Setup(ctx, "agora-bench")
	if err != nil {
		return nil, err
	}
	defer otel.SetTracerProvider(noop.NewTracerProvider()) // the later rows run untraced
	err = fn()
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if serr := shutdown(sctx); err == nil && serr != nil {
		err = fmt.Errorf("tracing: flush: %w", serr)
	}
	return sink, err
}

// setenv sets the variables (an empty value unsets one) and returns the
// function that puts the old values back.
func setenv(vars map[string]string) (restore func()) {
	old := map[string]*string{}
	for k, v := range vars {
		if was, ok := os.LookupEnv(k); ok {
			old[k] = &was
		} else {
			old[k] = nil
		}
		if v == "" {
			os.Unsetenv(k)
		} else {
			os.Setenv(k, v)
		}
	}
	return func() {
		for k, v := range old {
			if v == nil {
				os.Unsetenv(k)
			} else {
				os.Setenv(k, *v)
			}
		}
	}
}
