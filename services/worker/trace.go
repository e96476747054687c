package worker

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/agora-dispatch/agora/internal/telemetry"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// runSpan starts the span of one delivery's run, a child of the span that
// queued it (the dispatcher's), and records the time the work waited in
// the queue as the span agora.queue, from the dispatch message's time to
// now (docs/tracing.md). With tracing on, the job's events then carry the
// run span's own traceparent.
func (s *Service) runSpan(ctx context.Context, j *job, queued time.Time, subject string) (context.Context, trace.Span) {
	ctx = telemetry.Remote(ctx, j.trace)
	attrs := append(telemetry.Dispatch(j.common), telemetry.Messaging(subject)...)
	if telemetry.Enabled() && !queued.IsZero() && queued.Before(j.start) {
		_, q := telemetry.Tracer().Start(ctx, "agora.queue", trace.WithTimestamp(queued), trace.WithAttributes(attrs...),
			trace.WithAttributes(attribute.Int("agora.attempt", j.attempt)))
		q.End(trace.WithTimestamp(j.start))
	}
	ctx, span := telemetry.Tracer().Start(ctx, "agora.run", trace.WithSpanKind(trace.SpanKindConsumer), trace.WithTimestamp(j.start))
	j.span = span
	if span.IsRecording() {
		span.SetAttributes(attrs...)
		span.SetAttributes(attribute.Int("agora.attempt", j.attempt), attribute.String("agora.worker_id", s.cfg.ID))
		if tp := telemetry.Traceparent(ctx); tp != "" {
			j.trace, j.traceExact = tp, true
		}
	}
	return ctx, span
}

// endRun ends the run span with what became of the delivery.
func endRun(span trace.Span, o Outcome) {
	if span.IsRecording() {
		span.SetAttributes(telemetry.KeyOutcome.String(string(o.Kind)), attribute.Int("process.exit.code", o.ExitCode))
	}
	span.End()
}

// traceOption is the trace context of the job's events.
func (j *job) traceOption() lifecycle.Option {
	if j.traceExact {
		return lifecycle.WithParentSpan(j.trace)
	}
	return lifecycle.WithTraceparent(j.trace)
}
