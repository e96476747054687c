package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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

// maxProjectBatch bounds the messages a shard takes at once.
const maxProjectBatch = 32

func (s *Service) startProjection(ctx context.Context, b *bindings) (*projection, error) {
	p := &projection{shards: make([]chan jetstream.Msg, projectionShards)}
	for i := range p.shards {
		ch := make(chan jetstream.Msg, 16)
		p.shards[i] = ch
		p.wg.Go(func() {
			batch := make([]jetstream.Msg, 0, maxProjectBatch)
			for m := range ch {
				batch = append(batch[:0], m)
				batch = takeWaiting(ch, batch)
				s.projectBatch(ctx, b, batch)
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
type event struct {
	e lifecycle.Event
	l lifecycle.Lifecycle
}

// projected is one lifecycle message of a batch, decoded.
type projected struct {
	event
	m    jetstream.Msg
	log  *slog.Logger
	ctx  context.Context // the event's span
	span trace.Span
	v    verdict
}

// projectBatch applies a shard's waiting lifecycle messages to their
// dispatch records. The events of one dispatch that wait together — a
// run's `started` and its terminal event, when the projection is behind —
// are applied in stream order and written in one compare-and-set, so the
// record goes from what it was to what all of them make it with one write
// (docs/design.md §2, "The dispatch record and the reconciler").
func (s *Service) projectBatch(ctx context.Context, b *bindings, msgs []jetstream.Msg) {
	items := make([]*projected, len(msgs))
	var order []string // dispatch ids, in the order their first event came
	groups := map[string][]*projected{}
	for i, m := range msgs {
		it := s.decodeProjected(ctx, m)
		items[i] = it
		if it.l == nil {
			continue
		}
		id := it.l.Base().DispatchID
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
	it.e, it.l, it.ctx, it.span = e, l, sctx, span
	return it
}

// projectDispatch applies the events of one dispatch, in stream order,
// and sets each one's verdict; each event's span ends with it.
func (s *Service) projectDispatch(b *bindings, its []*projected) {
	first := its[0]
	ctx, cancel := context.WithTimeout(first.ctx, opTimeout)
	defer cancel()
	c := first.l.Base()
	evs := make([]event, len(its))
	for i, it := range its {
		evs[i] = it.event
	}
	rec, created, err := s.applyAll(ctx, b, evs...)
	// A record the projection creates (a refused request) is entered in
	// its thread's index here, before its thread's end below looks for it
	// there; so is one whose accepted event it applies. An acceptance that
	// listed its accepted event in the record entered it before publishing
	// the event. (A root is its thread's first entry without being
	// written: store.enter.)
	enter, ends := created, false
	for _, it := range its {
		k := it.l.LifecycleKind()
		enter = enter || k == lifecycle.KindAccepted && !listedAtAcceptance(rec.Record, it.e.ID())
		ends = ends || endsThread(k)
	}
	if err == nil && enter {
		err = b.store.enter(ctx, c.ThreadID, c.Round, c.DispatchID)
	}
	if err == nil && ends {
		err = s.expireThread(ctx, b, c.ThreadID, c.DispatchID, first.log)
	}
	for _, it := range its {
		if err != nil {
			it.log.Warn("projection: temporary failure, redelivering", "id", it.e.ID(), "err", err)
			it.v = retryLate
		}
		telemetry.End(it.span, err) // a temporary failure: the span records it
	}
}

// listedAtAcceptance reports whether rec was created listing the accepted
// event id (accept.go), which it then lists first.
func listedAtAcceptance(rec client.Record, id string) bool {
	return len(rec.Events) > 0 && rec.Events[0].ID == id && rec.Request != nil
}

// apply applies one lifecycle event to its dispatch record: applyAll of
// that event alone.
func (s *Service) apply(ctx context.Context, b *bindings, e lifecycle.Event, l lifecycle.Lifecycle) (record, bool, error) {
	return s.applyAll(ctx, b, event{e, l})
}

// applyAll applies lifecycle events of one dispatch, in order, to its
// record with one compare-and-set, each once: an event whose id the record
// lists is a redelivery and changes nothing, and when every one is,
// nothing is written. A dispatch without a record (a request refused on
// the stream) gets one. created reports that.
func (s *Service) applyAll(ctx context.Context, b *bindings, evs ...event) (rec record, created bool, err error) {
	c := evs[0].l.Base()
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
			rec = record{Record: client.Record{DispatchID: c.DispatchID, ThreadID: c.ThreadID, ParentID: c.ParentID, Round: c.Round, Subagent: c.Subagent, CreatedAt: evs[0].e.Time().UTC()}}
		case err != nil:
			return rec, false, err
		}
		var fresh []event
		ends := false
		for _, it := range evs {
			ref := client.EventRef{ID: it.e.ID(), Kind: it.l.LifecycleKind(), Time: it.e.Time().UTC()}
			if slices.ContainsFunc(rec.Events, func(r client.EventRef) bool { return r.ID == ref.ID }) {
				continue
			}
			applyEvent(&rec.Record, ref, it.l)
			fresh = append(fresh, it)
			ends = ends || endsThread(ref.Kind)
		}
		if len(fresh) == 0 {
			return rec, false, nil
		}
		rec.UpdatedAt = time.Now().UTC()
		if ends && rec.ExpiresAt == nil {
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
			s.metrics.projectionWrites.Inc()
			for _, it := range fresh {
				var reason lifecycle.Reason
				if f, ok := it.l.(*lifecycle.Failed); ok {
					reason = f.Reason
				}
				s.metrics.applied(it.l.LifecycleKind(), reason)
			}
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
