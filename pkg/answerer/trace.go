package answerer

import (
	"context"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// Tracing (docs/tracing.md) uses only the OpenTelemetry API: a program
// that installs a tracer provider gets a span per handled question,
// agora.answerer.handle, a child of the router's agora.question.ask, and
// its answer carries that span to the router; without one, nothing is
// recorded.

const tracerName = "github.com/agora-dispatch/agora/pkg/answerer"

func handleSpan(ctx context.Context, traceparent string, q *lifecycle.Question, route, subject string, attempt int) (context.Context, trace.Span) {
	if lifecycle.ValidTraceparent(traceparent) {
		ctx = propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{"traceparent": traceparent})
	}
	ctx, span := otel.Tracer(tracerName).Start(ctx, "agora.answerer.handle", trace.WithSpanKind(trace.SpanKindConsumer))
	if span.IsRecording() {
		span.SetAttributes(
			attribute.String("messaging.system", "nats"), attribute.String("messaging.destination.name", subject),
			attribute.String("agora.question_id", q.QuestionID), attribute.String("agora.route", route),
			attribute.String("agora.dispatch_id", q.DispatchID), attribute.String("agora.thread_id", q.ThreadID),
			attribute.Int("agora.round", q.Round), attribute.String("agora.subagent", q.Subagent),
			attribute.Int("agora.attempt", attempt),
		)
	}
	return ctx, span
}

// spanHeader carries ctx's span to the router, or is nil.
func spanHeader(ctx context.Context) nats.Header {
	c := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, c)
	if c["traceparent"] == "" {
		return nil
	}
	return nats.Header{lifecycle.TraceparentExtension: []string{c["traceparent"]}}
}
