package dispatcher

import (
	"context"

	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/agora-dispatch/agora/internal/telemetry"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// intakeSpan starts the span of one request at a door: a child of the
// request's traceparent (the caller's span, or the router's re-dispatch
// for a later round), a server span for HTTP and micro requests, a
// consumer span for the stream (docs/tracing.md).
func intakeSpan(ctx context.Context, traceparent, door string, req lifecycle.Request) (context.Context, trace.Span) {
	kind := trace.SpanKindServer
	if door == doorStream {
		kind = trace.SpanKindConsumer
	}
	ctx, span := telemetry.Tracer().Start(telemetry.Remote(ctx, traceparent), "agora.dispatch", trace.WithSpanKind(kind))
	if span.IsRecording() {
		span.SetAttributes(telemetry.KeyDoor.String(door))
		switch door {
		case doorStream:
			span.SetAttributes(telemetry.Messaging("agora.requests." + req.Subagent)...)
		case doorMicro:
			span.SetAttributes(telemetry.Messaging("agora.api.dispatch")...)
		case doorHTTP:
			span.SetAttributes(semconv.HTTPRoute("/v1/dispatches"), semconv.HTTPRequestMethodPost)
		}
		span.SetAttributes(telemetry.Dispatch(lifecycle.Common{DispatchID: req.DispatchID, ThreadID: req.ThreadID, Round: req.Round, Subagent: req.Subagent})...)
	}
	return ctx, span
}
