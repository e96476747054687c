package router

import (
	"context"

	"github.com/cloudevents/sdk-go/v2/event"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/agora-dispatch/agora/internal/clip"
	"github.com/agora-dispatch/agora/internal/telemetry"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// The router's spans (docs/tracing.md): agora.question.ask for a
// needs_input event turned into a question, agora.question.answer for
// each answer or decline with its outcome, and agora.question.redispatch
// for the re-dispatch an answer causes. The question's events carry the
// span that queued them, so an answerer's span is a child of the ask, the
// answer's of the answerer's, and the next round's of the re-dispatch: a
// thread is one trace.

// askSpan starts the span of one needs_input event, a child of the run
// that asked.
func askSpan(ctx context.Context, e event.Event, ni *lifecycle.NeedsInput, subject string) (context.Context, trace.Span) {
	ctx, span := telemetry.Tracer().Start(telemetry.Remote(ctx, lifecycle.Traceparent(e)), "agora.question.ask", trace.WithSpanKind(trace.SpanKindConsumer))
	if span.IsRecording() {
		span.SetAttributes(telemetry.Dispatch(ni.Common)...)
		span.SetAttributes(telemetry.Messaging(subject)...)
		span.SetAttributes(telemetry.KeyQuestionID.String(ni.QuestionID))
	}
	return ctx, span
}

// answerSpan starts the span of one answer: a child of the answerer's span
// when the answer carried one, else of the question's own trace (read from
// its record, only when tracing is on).
func (s *Service) answerSpan(ctx context.Context, sub Submission, d door) (context.Context, trace.Span) {
	if !telemetry.Enabled() {
		return ctx, trace.SpanFromContext(context.Background()) // non-recording
	}
	if !trace.SpanContextFromContext(ctx).IsValid() && lifecycle.ValidToken(sub.QuestionID) == nil {
		if r, _, err := s.store.get(ctx, sub.QuestionID); err == nil {
			ctx = telemetry.Remote(ctx, r.Traceparent)
		}
	}
	kind := trace.SpanKindServer
	if d.via == viaStream {
		kind = trace.SpanKindConsumer
	}
	ctx, span := telemetry.Tracer().Start(ctx, "agora.question.answer", trace.WithSpanKind(kind))
	span.SetAttributes(telemetry.Messaging(d.subject)...)
	span.SetAttributes(telemetry.KeyQuestionID.String(sub.QuestionID), telemetry.KeyDoor.String(d.via),
		telemetry.KeyAnsweredBy.String(sub.AnsweredBy))
	if d.route != "" {
		span.SetAttributes(telemetry.KeyRoute.String(d.route))
	}
	return ctx, span
}

// endAnswer ends an answer's span with the router's reply.
func endAnswer(span trace.Span, rep client.AnswerReply) {
	if span.IsRecording() {
		span.SetAttributes(telemetry.KeyOutcome.String(string(rep.Status)))
		if rep.Reason != "" {
			span.SetAttributes(attribute.String("agora.reason", clip.String(rep.Reason, 256)))
		}
	}
	span.End()
}

// traced wraps a record change so the events it queues carry tp, the
// span that caused them.
func traced(tp string, f func(*record) (bool, error)) func(*record) (bool, error) {
	return func(r *record) (bool, error) {
		changed, err := f(r)
		if changed && err == nil {
			r.traceNew(tp)
		}
		return changed, err
	}
}

// traceNew gives the pending events that have no trace yet tp.
func (r *record) traceNew(tp string) {
	if tp == "" {
		return
	}
	for i := range r.Pending {
		if r.Pending[i].Trace == "" {
			r.Pending[i].Trace = tp
		}
	}
}

// publishSpan returns the span and the trace option of one pending event:
// a re-dispatch gets its own producer span, agora.question.redispatch, the
// parent of the next round; the others carry the span that queued them;
// an event queued untraced, the question's trace as Agora does untraced.
func (s *Service) publishSpan(ctx context.Context, r *record, p pending) (context.Context, trace.Span, lifecycle.Option) {
	if !lifecycle.ValidTraceparent(p.Trace) {
		return ctx, trace.SpanFromContext(context.Background()), lifecycle.WithTraceparent(r.Traceparent)
	}
	if !p.Resume || !telemetry.Enabled() {
		return ctx, trace.SpanFromContext(context.Background()), lifecycle.WithParentSpan(p.Trace)
	}
	ctx, span := telemetry.Tracer().Start(telemetry.Remote(ctx, p.Trace), "agora.question.redispatch", trace.WithSpanKind(trace.SpanKindProducer))
	span.SetAttributes(telemetry.Messaging(p.Subject)...)
	span.SetAttributes(telemetry.KeyQuestionID.String(r.QuestionID), telemetry.KeyThreadID.String(r.ThreadID),
		telemetry.KeyDispatchID.String(r.NextDispatchID), telemetry.KeyRound.Int(r.Round+1))
	return ctx, span, telemetry.Event(ctx, r.Traceparent)
}
