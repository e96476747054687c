package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/agora-dispatch/agora/internal/logging"
	"github.com/agora-dispatch/agora/internal/telemetry"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

const (
	// projectionShards is how many dispatches the projection updates at
	// once; the events of one dispatch stay in stream order on one shard.
	projectionShards = 16
	// maxEventRefs bounds the event ids kept in a record.
	maxEventRefs = 256
)

// projection consumes the `projection` durable on AGORA_LIFECYCLE.
type projection struct {
	cc        jetstream.ConsumeContext
	shards    []chan jetstream.Msg
	wg        sync.WaitGroup
	closeOnce sync.Once
}

func (s *Service) startProjection(ctx context.Context, b *bindings) (*projection, error) {
	p := &projection{shards: make([]chan jetstream.Msg, projectionShards)}
	for i := range p.shards {
		ch := make(chan jetstream.Msg, 16)
		p.shards[i] = ch
		p.wg.Go(func() {
			for m := range ch {
				s.settle(m, s.project(ctx, b, m), s.log)
			}
		})
	}
	cc, err := b.projection.Consume(func(m jetstream.Msg) {
		p.shards[shard(m.Subject(), len(p.shards))] <- m
	}, jetstream.PullMaxMessages(256), jetstream.PullExpiry(5*time.Second), jetstream.ConsumeErrHandler(s.consumeErr("projection")))
	if err != nil {
		p.closeShards()
		p.wg.Wait()
		return nil, fmt.Errorf("dispatcher: consume %s: %w", lifecycle.StreamLifecycle, err)
	}
	p.cc = cc
	return p, nil
}

func (p *projection) drain() { p.cc.Drain() }
func (p *projection) stop()  { p.cc.Stop() }

// wait returns once the consumer is closed and every shard is idle.
func (p *projection) wait() {
	<-p.cc.Closed()
	p.closeShards()
	p.wg.Wait()
}

func (p *projection) closeShards() {
	p.closeOnce.Do(func() {
		for _, ch := range p.shards {
			close(ch)
		}
	})
}

// project applies one lifecycle message to its dispatch record.
func (s *Service) project(ctx context.Context, b *bindings, m jetstream.Msg) verdict {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	log := s.log.With("subject", m.Subject())
	e, err := lifecycle.DecodeMsg(m)
	if err != nil {
		log.Error("undecodable lifecycle message terminated", "err", err)
		return term("undecodable")
	}
	log = log.With(logging.Trace(lifecycle.Traceparent(e))...)
	d, err := lifecycle.Parse(e)
	if errors.Is(err, lifecycle.ErrUnknownType) {
		log.Warn("unknown event type skipped", "type", e.Type(), "id", e.ID())
		return ack
	}
	if err != nil {
		log.Error("lifecycle event with bad data terminated", "id", e.ID(), "err", err)
		return term("bad data")
	}
	l, ok := d.(lifecycle.Lifecycle)
	if !ok {
		log.Warn("not a lifecycle event: skipped", "type", e.Type(), "id", e.ID())
		return ack
	}
	c := l.Base()
	ctx, span := telemetry.Tracer().Start(telemetry.Remote(ctx, lifecycle.Traceparent(e)), "agora.dispatch.project",
		trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attribute.String("agora.kind", string(l.LifecycleKind()))),
		trace.WithAttributes(telemetry.Dispatch(c)...))
	var failure error // a temporary failure: the span records it
	defer func() { telemetry.End(span, failure) }()
	if lifecycle.Validate(l) != nil || !idRE.MatchString(c.DispatchID) || !idRE.MatchString(c.ThreadID) {
		log.Warn("lifecycle event with ids that cannot be recorded: skipped", "id", e.ID(), "dispatch_id", c.DispatchID)
		return ack
	}
	rec, created, err := s.apply(ctx, b, e, l)
	// A record the projection creates (a refused request) is entered in
	// its thread's index here, before its thread's end below looks for it
	// there; so is one whose accepted event it applies. An acceptance that
	// listed its accepted event in the record entered it before publishing
	// the event. (A root is its thread's first entry without being
	// written: store.enter.)
	if err == nil && (created || l.LifecycleKind() == lifecycle.KindAccepted && !listedAtAcceptance(rec.Record, e.ID())) {
		err = b.store.enter(ctx, c.ThreadID, c.Round, c.DispatchID)
	}
	if err == nil && endsThread(l.LifecycleKind()) {
		err = s.expireThread(ctx, b, c.ThreadID, c.DispatchID, log)
	}
	if err != nil {
		failure = err
		log.Warn("projection: temporary failure, redelivering", "id", e.ID(), "err", err)
		return retryLate
	}
	return ack
}

// listedAtAcceptance reports whether rec was created listing the accepted
// event id (accept.go), which it then lists first.
func listedAtAcceptance(rec client.Record, id string) bool {
	return len(rec.Events) > 0 && rec.Events[0].ID == id && rec.Request != nil
}

// apply applies a lifecycle event to its dispatch record with
// compare-and-set, once: an event whose id the record lists is a
// redelivery and changes nothing. A dispatch without a record (a request
// refused on the stream) gets one. created reports that.
func (s *Service) apply(ctx context.Context, b *bindings, e lifecycle.Event, l lifecycle.Lifecycle) (rec record, created bool, err error) {
	c := l.Base()
	ref := client.EventRef{ID: e.ID(), Kind: l.LifecycleKind(), Time: e.Time().UTC()}
	for i := range maxCAS {
		var rev uint64
		if i == 0 {
			rec, rev, err = b.store.cached(ctx, c.DispatchID) // as last written here: no read
		} else {
			rec, rev, err = b.store.get(ctx, c.DispatchID)
		}
		created = errors.Is(err, errNoRecord)
		switch {
		case created:
			rec = record{Record: client.Record{DispatchID: c.DispatchID, ThreadID: c.ThreadID, ParentID: c.ParentID, Round: c.Round, Subagent: c.Subagent, CreatedAt: ref.Time}}
		case err != nil:
			return rec, false, err
		}
		if slices.ContainsFunc(rec.Events, func(r client.EventRef) bool { return r.ID == ref.ID }) {
			return rec, false, nil
		}
		applyEvent(&rec.Record, ref, l)
		rec.UpdatedAt = time.Now().UTC()
		if endsThread(l.LifecycleKind()) && rec.ExpiresAt == nil {
			// The thread ends: this write already carries the record's TTL
			// (retention.go does the rest of the thread).
			exp := rec.UpdatedAt.Add(s.cfg.Retention).Truncate(time.Second)
			rec.ExpiresAt = &exp
		}
		if created {
			_, err = b.store.create(ctx, &rec)
		} else {
			_, err = b.store.put(ctx, &rec, rev)
		}
		if err == nil {
			var reason lifecycle.Reason
			if f, ok := l.(*lifecycle.Failed); ok {
				reason = f.Reason
			}
			s.metrics.applied(l.LifecycleKind(), reason)
			return rec, created, nil
		}
		if !errors.Is(err, errConflict) {
			return rec, false, err
		}
		// Someone else wrote it: the copy is stale (put forgot it), read
		// again.
	}
	return rec, false, fmt.Errorf("dispatcher: write record %s: %d conflicting writers", c.DispatchID, maxCAS)
}

// rank orders the kinds so the status never goes back, whatever order
// events of one dispatch are applied in.
func rank(k lifecycle.Kind) int {
	switch {
	case k == lifecycle.KindAccepted:
		return 1
	case k == lifecycle.KindStarted:
		return 2
	case k.Terminal():
		return 3
	}
	return 0
}

// applyEvent changes rec for one new event: status, the kind's timestamp,
// attempt (the highest seen) and worker, and the terminal summary (the
// first terminal event wins; there is only one per dispatch).
func applyEvent(rec *client.Record, ref client.EventRef, l lifecycle.Lifecycle) {
	rec.Events = append(rec.Events, ref)
	if n := len(rec.Events); n > maxEventRefs {
		rec.Events = rec.Events[n-maxEventRefs:]
	}
	t := ref.Time
	switch v := l.(type) {
	case *lifecycle.Accepted:
		if rec.AcceptedAt == nil {
			rec.AcceptedAt = &t
		}
		if rec.SubagentRevision == 0 {
			rec.SubagentRevision = v.SubagentRevision
		}
	case *lifecycle.Started:
		if v.Attempt >= rec.Attempt {
			rec.Attempt, rec.WorkerID, rec.StartedAt = v.Attempt, v.WorkerID, &t
		}
	default:
		if rec.Result == nil {
			rec.Result, rec.EndedAt = result(l), &t
		}
	}
	if k := l.LifecycleKind(); rank(k) > rank(rec.Status) {
		rec.Status = k
	}
}

// result summarises a terminal event.
func result(l lifecycle.Lifecycle) *client.Result {
	r := &client.Result{Kind: l.LifecycleKind()}
	switch v := l.(type) {
	case *lifecycle.Finished:
		code := v.ExitCode
		r.ExitCode, r.DurationMS, r.Output = &code, v.DurationMS, v.Output
	case *lifecycle.NeedsInput:
		code := v.ExitCode
		r.ExitCode, r.DurationMS, r.QuestionID, r.Question = &code, v.DurationMS, v.QuestionID, v.Question
	case *lifecycle.Failed:
		r.Reason, r.Detail, r.ExitCode, r.DurationMS = v.Reason, v.Detail, v.ExitCode, v.DurationMS
	case *lifecycle.Cancelled:
		r.By, r.Detail = v.By, v.Reason
	}
	return r
}
