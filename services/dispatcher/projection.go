package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/agora-dispatch/agora/internal/chain"
	"github.com/agora-dispatch/agora/internal/logging"
	"github.com/agora-dispatch/agora/internal/telemetry"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

const (
	// projectionShards is how many dispatches the projection updates at
	// once; the events of one dispatch stay in stream order on one shard.
	projectionShards = 16
)

// projection consumes the `projection` durable on AGORA_LIFECYCLE.
type projection struct {
	cc        jetstream.ConsumeContext
	shards    []chan jetstream.Msg
	wg        sync.WaitGroup
	closeOnce sync.Once
}

// maxProjectBatch bounds the messages a shard takes at once.
const maxProjectBatch = 32

func (s *Service) startProjection(ctx context.Context, b *bindings) (*projection, error) {
	p := &projection{shards: make([]chan jetstream.Msg, projectionShards)}
	for i := range p.shards {
		ch := make(chan jetstream.Msg, 16)
		p.shards[i] = ch
		p.wg.Go(func() {
			runShard(ch, func(batch []jetstream.Msg) { s.projectBatch(ctx, b, batch) })
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

// runShard applies the messages of ch a batch at a time until ch is
// closed. The batch's array is reused, and cleared after each batch: an
// idle shard holds none of the messages (and their data) it applied.
func runShard(ch <-chan jetstream.Msg, apply func([]jetstream.Msg)) {
	batch := make([]jetstream.Msg, 0, maxProjectBatch)
	for m := range ch {
		batch = takeWaiting(ch, append(batch, m))
		apply(batch)
		clear(batch)
		batch = batch[:0]
	}
}

// takeWaiting adds to batch the messages already waiting on ch, up to
// maxProjectBatch, without waiting for more.
func takeWaiting(ch <-chan jetstream.Msg, batch []jetstream.Msg) []jetstream.Msg {
	for len(batch) < maxProjectBatch {
		select {
		case m, ok := <-ch:
			if !ok {
				return batch
			}
			batch = append(batch, m)
		default:
			return batch
		}
	}
	return batch
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

// event is a lifecycle event and its parsed data.
type event = chain.Link

// projected is one lifecycle message of a batch, decoded.
type projected struct {
	event
	m    jetstream.Msg
	log  *slog.Logger
	ctx  context.Context // the event's span
	span trace.Span
	v    verdict
	// first: delivered for the first time, so the metrics count it (a
	// redelivery may have been counted before).
	first bool
}

// projectBatch applies a shard's waiting lifecycle messages to their
// dispatch records. The events of one dispatch that wait together — a
// run's `started` and its terminal event, when the projection is behind —
// are applied in stream order and written in one compare-and-set, so the
// record goes from what it was to what all of them make it with one write
// (docs/storage.md, "The dispatch record and the reconciler").
func (s *Service) projectBatch(ctx context.Context, b *bindings, msgs []jetstream.Msg) {
	items := make([]*projected, len(msgs))
	var order []string // dispatch ids, in the order their first event came
	groups := map[string][]*projected{}
	for i, m := range msgs {
		it := s.decodeProjected(ctx, m)
		items[i] = it
		if it.Data == nil {
			continue
		}
		id := it.Data.Base().DispatchID
		if _, ok := groups[id]; !ok {
			order = append(order, id)
		}
		groups[id] = append(groups[id], it)
	}
	for _, id := range order {
		s.projectDispatch(b, groups[id])
	}
	for _, it := range items {
		s.settle(it.m, it.v, it.log)
	}
}

// decodeProjected decodes one lifecycle message. Its l is nil when there
// is nothing to apply, its verdict set.
func (s *Service) decodeProjected(ctx context.Context, m jetstream.Msg) *projected {
	it := &projected{m: m, log: s.log.With("subject", m.Subject()), v: ack}
	if md, err := m.Metadata(); err == nil {
		it.first = md.NumDelivered == 1
	}
	e, err := lifecycle.DecodeMsg(m)
	if err != nil {
		it.log.Error("undecodable lifecycle message terminated", "err", err)
		it.v = term("undecodable")
		return it
	}
	it.log = it.log.With(logging.Trace(lifecycle.Traceparent(e))...)
	d, err := lifecycle.Parse(e)
	if errors.Is(err, lifecycle.ErrUnknownType) {
		it.log.Warn("unknown event type skipped", "type", e.Type(), "id", e.ID())
		return it
	}
	if err != nil {
		it.log.Error("lifecycle event with bad data terminated", "id", e.ID(), "err", err)
		it.v = term("bad data")
		return it
	}
	l, ok := d.(lifecycle.Lifecycle)
	if !ok {
		it.log.Warn("not a lifecycle event: skipped", "type", e.Type(), "id", e.ID())
		return it
	}
	c := l.Base()
	sctx, span := telemetry.Tracer().Start(telemetry.Remote(ctx, lifecycle.Traceparent(e)), "agora.dispatch.project",
		trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attribute.String("agora.kind", string(l.LifecycleKind()))),
		trace.WithAttributes(telemetry.Dispatch(c)...))
	if lifecycle.Validate(l) != nil || !idRE.MatchString(c.DispatchID) || !idRE.MatchString(c.ThreadID) {
		it.log.Warn("lifecycle event with ids that cannot be recorded: skipped", "id", e.ID(), "dispatch_id", c.DispatchID)
		span.End()
		return it
	}
	it.Event, it.Data, it.ctx, it.span = e, l, sctx, span
	return it
}

// projectDispatch applies the events of one dispatch, in stream order,
// and sets each one's verdict; each event's span ends with it. A record's
// status is not written: every door derives it from the chain (chain.go).
// What the projection writes is what the events do not carry: the record
// of a request the stream door refused (it has no other writer), the
// thread index entry of a dispatch whose record it made, and, when the
// thread ends, the expiry of everything the thread left.
func (s *Service) projectDispatch(b *bindings, its []*projected) {
	first := its[0]
	ctx, cancel := context.WithTimeout(first.ctx, opTimeout)
	defer cancel()
	c := first.Data.Base()
	evs := make([]event, len(its))
	for i, it := range its {
		evs[i] = it.event
	}
	rec, created, err := s.recordOf(ctx, b, evs...)
	// A record the projection creates (a refused request) is entered in
	// its thread's index here, before its thread's end below looks for it
	// there; so is one whose accepted event acceptance did not list (an
	// event published without the dispatcher). An acceptance that listed
	// its accepted event in the record entered it before publishing the
	// event. (A root is its thread's first entry without being written:
	// store.enter.)
	enter, ends := created, false
	for _, it := range its {
		k := it.Data.LifecycleKind()
		enter = enter || k == lifecycle.KindAccepted && !listedAtAcceptance(rec.Record, it.Event.ID())
		ends = ends || endsThread(k)
	}
	if err == nil && enter {
		err = b.store.enter(ctx, c.ThreadID, c.Round, c.DispatchID)
	}
	if err == nil && ends {
		err = s.expireThread(ctx, b, c.ThreadID, rec, first.log)
	}
	for _, it := range its {
		if err != nil {
			it.log.Warn("projection: temporary failure, redelivering", "id", it.Event.ID(), "err", err)
			it.v = retryLate
		} else if it.first {
			var reason lifecycle.Reason
			if f, ok := it.Data.(*lifecycle.Failed); ok {
				reason = f.Reason
			}
			s.metrics.applied(it.Data.LifecycleKind(), reason)
		}
		telemetry.End(it.span, err) // a temporary failure: the span records it
	}
}

// listedAtAcceptance reports whether rec was created listing the accepted
// event id (accept.go), which it then lists first.
func listedAtAcceptance(rec client.Record, id string) bool {
	return len(rec.Events) > 0 && rec.Events[0].ID == id && rec.Request != nil
}

// recordOf returns the record of the events' dispatch — this dispatcher's
// own copy when it has one, so the dispatches it accepted cost no read —
// and creates it, the events applied, when there is none (a request
// refused on the stream, or events published without the dispatcher).
// created reports that.
func (s *Service) recordOf(ctx context.Context, b *bindings, evs ...event) (record, bool, error) {
	c := evs[0].Data.Base()
	rec, _, err := b.store.cached(ctx, c.DispatchID)
	if !errors.Is(err, errNoRecord) {
		return rec, false, err
	}
	rec = record{Record: client.Record{DispatchID: c.DispatchID, ThreadID: c.ThreadID, ParentID: c.ParentID, Round: c.Round, Subagent: c.Subagent, CreatedAt: evs[0].Event.Time().UTC()}}
	chain.Apply(&rec.Record, evs...)
	rec.UpdatedAt = time.Now().UTC()
	if endsThread(rec.Status) {
		exp := rec.UpdatedAt.Add(s.cfg.Retention).Truncate(time.Second)
		rec.ExpiresAt = &exp
	}
	_, err = b.store.create(ctx, &rec)
	if errors.Is(err, errConflict) {
		// Another dispatcher made it, or acceptance did: read it.
		rec, _, err = b.store.get(ctx, c.DispatchID)
		return rec, false, err
	}
	if err != nil {
		return rec, false, err
	}
	s.metrics.projectionWrites.Inc()
	return rec, true, nil
}
