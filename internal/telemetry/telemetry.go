// Package telemetry sets up OpenTelemetry tracing from the standard OTEL_*
// variables and carries trace context through Agora's events
// (docs/tracing.md).
//
// Tracing is off unless an OTLP endpoint is configured
// (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, or
// OTEL_TRACES_EXPORTER=otlp): the global tracer provider then stays
// OpenTelemetry's no-op, every Start returns a non-recording span, and the
// services keep today's W3C traceparent on every event. When it is on,
// each event carries the traceparent of the span that caused it, so a
// thread — dispatch, run, question, answer, re-dispatch, the next round —
// is one trace whose spans are parented along what caused what.
package telemetry

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// Instrumentation is the name of Agora's tracer.
const Instrumentation = "github.com/agora-dispatch/agora"

// enabled is set by Setup when an exporter was installed.
var enabled atomic.Bool

// Enabled reports whether spans are exported: callers skip work done only
// for tracing (attributes, extra reads) when it is off.
func Enabled() bool { return enabled.Load() }

// Tracer returns Agora's tracer from the global provider.
func Tracer() trace.Tracer { return otel.Tracer(Instrumentation) }

// Config is what Setup reads from the environment; the exporters read the
// rest of the OTEL_EXPORTER_OTLP_* variables (endpoint, headers, timeout,
// TLS, compression) themselves.
type Config struct {
	// Protocol is OTEL_EXPORTER_OTLP_TRACES_PROTOCOL or
	// OTEL_EXPORTER_OTLP_PROTOCOL: grpc or http/protobuf (the default).
	Protocol string
	// Exporter is OTEL_TRACES_EXPORTER: otlp (the default when an
	// endpoint is set) or none.
	Exporter string
	// Endpoint reports whether an OTLP endpoint is configured.
	Endpoint bool
	// Disabled is OTEL_SDK_DISABLED=true.
	Disabled bool
	// Sampler is OTEL_TRACES_SAMPLER, checked here so a typo fails at
	// start instead of falling back silently.
	Sampler string
}

// FromEnv reads Config from the process environment.
func FromEnv() Config {
	get := os.Getenv
	return Config{
		Protocol: strings.TrimSpace(firstOf(get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"), get("OTEL_EXPORTER_OTLP_PROTOCOL"))),
		Exporter: strings.TrimSpace(strings.ToLower(get("OTEL_TRACES_EXPORTER"))),
		Endpoint: get("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "",
		Disabled: strings.EqualFold(strings.TrimSpace(get("OTEL_SDK_DISABLED")), "true"),
		Sampler:  strings.TrimSpace(get("OTEL_TRACES_SAMPLER")),
	}
}

func firstOf(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// On reports whether c turns tracing on.
func (c Config) On() bool {
	if c.Disabled || c.Exporter == "none" {
		return false
	}
	return c.Endpoint || c.Exporter == "otlp"
}

var samplers = map[string]bool{
	"always_on": true, "always_off": true, "traceidratio": true,
	"parentbased_always_on": true, "parentbased_always_off": true, "parentbased_traceidratio": true,
}

// Validate names every setting it cannot use.
func (c Config) Validate() error {
	var errs []error
	switch c.Protocol {
	case "", "grpc", "http/protobuf":
	default:
		errs = append(errs, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL=%q: want grpc or http/protobuf", c.Protocol))
	}
	switch c.Exporter {
	case "", "otlp", "none":
	default:
		errs = append(errs, fmt.Errorf("OTEL_TRACES_EXPORTER=%q: want otlp or none", c.Exporter))
	}
	if c.Sampler != "" && !samplers[c.Sampler] {
		errs = append(errs, fmt.Errorf("OTEL_TRACES_SAMPLER=%q: want always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off or parentbased_traceidratio", c.Sampler))
	}
	return errors.Join(errs...)
}

// Setup installs the global tracer provider and the W3C propagator when
// the environment turns tracing on (see Config.On) and returns the
// function that flushes and stops it; with tracing off it installs
// nothing and returns a no-op. service names the process
// (OTEL_SERVICE_NAME, when set, wins).
func Setup(ctx context.Context, service string) (shutdown func(context.Context) error, err error) {
	c := FromEnv()
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	if !c.On() {
		return func(context.Context) error { return nil }, nil
	}
	var exp *otlptrace.Exporter
	if c.Protocol == "grpc" {
		exp, err = otlptracegrpc.New(ctx)
	} else {
		exp, err = otlptracehttp.New(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("telemetry: OTLP exporter: %w", err)
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(semconv.ServiceName(service)))
	if err == nil {
		// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win over the
		// default name.
		res, err = resource.Merge(res, envResource(ctx))
	}
	if err != nil {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	enabled.Store(true)
	return func(ctx context.Context) error {
		enabled.Store(false)
		return tp.Shutdown(ctx)
	}, nil
}

func envResource(ctx context.Context) *resource.Resource {
	r, err := resource.New(ctx, resource.WithFromEnv())
	if err != nil {
		return resource.Empty()
	}
	return r
}

// Remote returns ctx carrying the span of a W3C traceparent as its remote
// parent; ctx unchanged for an empty or invalid one.
func Remote(ctx context.Context, traceparent string) context.Context {
	if !lifecycle.ValidTraceparent(traceparent) {
		return ctx
	}
	return propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{"traceparent": traceparent})
}

// Traceparent returns the W3C traceparent of ctx's span, or "" when it
// has no valid span context.
func Traceparent(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return ""
	}
	c := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(trace.ContextWithSpanContext(context.Background(), sc), c)
	return c["traceparent"]
}

// Event returns the lifecycle option that puts trace context on an event
// caused by ctx's work: the traceparent of ctx's recording span itself,
// so the receiver's span is its child; without one, a child of fallback
// (the dispatch's or question's traceparent), as Agora does untraced.
func Event(ctx context.Context, fallback string) lifecycle.Option {
	if sp := trace.SpanFromContext(ctx); sp.IsRecording() {
		if tp := Traceparent(ctx); tp != "" {
			return lifecycle.WithParentSpan(tp)
		}
	}
	return lifecycle.WithTraceparent(fallback)
}

// Or returns ctx's recording span's traceparent, or fallback: what a
// record keeps as the trace of what it starts.
func Or(ctx context.Context, fallback string) string {
	if sp := trace.SpanFromContext(ctx); sp.IsRecording() {
		if tp := Traceparent(ctx); tp != "" {
			return tp
		}
	}
	return fallback
}

// Attribute keys Agora puts on its spans (docs/tracing.md).
const (
	KeyDispatchID = attribute.Key("agora.dispatch_id")
	KeyThreadID   = attribute.Key("agora.thread_id")
	KeyRound      = attribute.Key("agora.round")
	KeySubagent   = attribute.Key("agora.subagent")
	KeyQuestionID = attribute.Key("agora.question_id")
	KeyRoute      = attribute.Key("agora.route")
	KeyOutcome    = attribute.Key("agora.outcome")
	KeyDoor       = attribute.Key("agora.door")
	KeyAnsweredBy = attribute.Key("agora.answered_by")
)

// Dispatch returns the attributes naming a dispatch.
func Dispatch(c lifecycle.Common) []attribute.KeyValue {
	return []attribute.KeyValue{
		KeyDispatchID.String(c.DispatchID), KeyThreadID.String(c.ThreadID),
		KeyRound.Int(c.Round), KeySubagent.String(c.Subagent),
	}
}

// Messaging returns the messaging attributes of work that sends to or
// receives from a NATS subject.
func Messaging(subject string) []attribute.KeyValue {
	return []attribute.KeyValue{semconv.MessagingSystemKey.String("nats"), semconv.MessagingDestinationName(subject)}
}

// End ends sp, recording err (when not nil) as its status.
func End(sp trace.Span, err error) {
	if err != nil {
		sp.RecordError(err)
		sp.SetStatus(codes.Error, err.Error())
	}
	sp.End()
}

// Start is Setup for a command: it logs whether traces are exported and
// returns the function that flushes them (within 5 s) at exit.
func Start(ctx context.Context, service string, log *slog.Logger) (stop func(), err error) {
	shutdown, err := Setup(ctx, service)
	if err != nil {
		return nil, err
	}
	if Enabled() {
		c := FromEnv()
		log.Info("tracing on: exporting spans over OTLP", "protocol", cmp.Or(c.Protocol, "http/protobuf"), "service", service)
	}
	return func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := shutdown(sctx); err != nil {
			log.Warn("traces not all exported at exit", "err", err)
		}
	}, nil
}
