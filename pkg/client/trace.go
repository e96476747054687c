package client

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/trace"

	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// withSpan adds the W3C traceparent of ctx's OpenTelemetry span to a
// request that carries none, so a traced caller's dispatch, answer or
// cancel continues its trace (docs/tracing.md). Without a span (tracing
// off, or none started) hdr is returned unchanged.
func withSpan(ctx context.Context, hdr nats.Header) nats.Header {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() || hdr.Get(lifecycle.TraceparentExtension) != "" {
		return hdr
	}
	if hdr == nil {
		hdr = nats.Header{}
	}
	hdr.Set(lifecycle.TraceparentExtension, fmt.Sprintf("00-%s-%s-%s", sc.TraceID(), sc.SpanID(), sc.TraceFlags()))
	return hdr
}
