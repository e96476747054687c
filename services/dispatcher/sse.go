package dispatcher

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/agora-dispatch/agora/internal/problem"
	"github.com/agora-dispatch/agora/internal/sse"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// sseWriteTimeout bounds one write to an event stream client.
const sseWriteTimeout = 30 * time.Second

// httpEvents serves GET /v1/events: lifecycle events as Server-Sent Events
// through an ordered consumer on AGORA_LIFECYCLE, and the progress reports
// of running sub-agents through one on AGORA_PROGRESS (docs/progress.md).
// Each frame's event field is the CloudEvent type and its data the
// structured-mode CloudEvent JSON. A lifecycle event's id is its stream
// sequence: a client that reconnects with Last-Event-ID resumes right
// after it, with no gap and no repeat. Progress frames carry no id (they
// are telemetry, and an id would break that resumption). type=lifecycle or
// type=progress keeps one of the two. A comment line is sent every
// SSEKeepalive.
func (s *Service) httpEvents(w http.ResponseWriter, r *http.Request) {
	cfg, err := sseFilter(r)
	if err != nil {
		problem.Write(w, r, s.problem(err))
		return
	}
	want, err := sseTypes(r)
	if err != nil {
		problem.Write(w, r, s.problem(err))
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	b, err := s.bind(ctx)
	if err != nil {
		problem.Write(w, r, s.problem(err))
		return
	}
	if err := s.allowEvents(ctx, b, r); err != nil {
		problem.Write(w, r, s.problem(err))
		return
	}
	sources, err := openSources(ctx, b, r, cfg, want)
	defer func() {
		for _, m := range sources {
			m.Stop()
		}
	}()
	if err != nil {
		problem.Write(w, r, s.problem(err))
		return
	}

	stream := sse.Start(w, "no-cache", sseWriteTimeout)
	if !stream.Comment("connected") {
		return
	}
	var wg sync.WaitGroup
	defer wg.Wait() // after cancel, below
	defer cancel()
	items := s.merge(ctx, cancel, &wg, sources)
	keepalive := time.NewTicker(s.cfg.SSEKeepalive)
	defer keepalive.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.stopping:
			return
		case <-keepalive.C:
			if !stream.Comment("keepalive") {
				return
			}
		case m := <-items:
			if !s.sendEvent(stream, m) {
				return
			}
		}
	}
}

// orderedInactive is how long the server keeps an ordered consumer of an
// events stream that ended (docs/storage.md, "Consuming a stream"):
// nats-server allows 1,000 consumers per stream by default, which
// nats.go's 5 minutes would let ended streams fill.
const orderedInactive = 30 * time.Second

// openSources opens the ordered consumers a stream reads: on
// AGORA_LIFECYCLE, on AGORA_PROGRESS, or both. From the moment one is
// open nothing published is missed. The sources opened are returned also
// with an error, for the caller to stop.
func openSources(ctx context.Context, b *bindings, r *http.Request, cfg jetstream.OrderedConsumerConfig, want sseKinds) ([]jetstream.MessagesContext, error) {
	var sources []jetstream.MessagesContext
	open := func(stream string, c jetstream.OrderedConsumerConfig) error {
		c.InactiveThreshold = orderedInactive
		cons, err := b.js.OrderedConsumer(ctx, stream, c)
		if err != nil {
			return fmt.Errorf("dispatcher: events: %w", err)
		}
		// Messages creates the consumer on the server: from here on
		// nothing published is missed.
		msgs, err := cons.Messages()
		if err != nil {
			return fmt.Errorf("dispatcher: events: %w", err)
		}
		sources = append(sources, msgs)
		return nil
	}
	if want.lifecycle {
		if err := open(lifecycle.StreamLifecycle, cfg); err != nil {
			return sources, err
		}
	}
	if want.progress {
		if err := open(lifecycle.StreamProgress, progressConfig(r, cfg)); err != nil {
			return sources, err
		}
	}
	return sources, nil
}

// merge reads every source on a goroutine of wg until ctx ends, into one
// channel; a source that fails ends the stream (cancel).
func (s *Service) merge(ctx context.Context, cancel context.CancelFunc, wg *sync.WaitGroup, sources []jetstream.MessagesContext) <-chan jetstream.Msg {
	items := make(chan jetstream.Msg)
	for _, msgs := range sources {
		wg.Go(func() {
			for {
				m, err := msgs.Next(jetstream.NextContext(ctx))
				if err != nil {
					if ctx.Err() == nil {
						s.log.Warn("event stream ended", "err", err)
						cancel()
					}
					return
				}
				select {
				case items <- m:
				case <-ctx.Done():
					return
				}
			}
		})
	}
	return items
}

// sendEvent writes m as a frame: a lifecycle event with its stream
// sequence as id, a progress report with none. An event that cannot be
// read is skipped; it reports false when the stream cannot be written.
func (s *Service) sendEvent(stream *sse.Stream, m jetstream.Msg) bool {
	md, err := m.Metadata()
	if err != nil {
		return true
	}
	e, err := lifecycle.DecodeMsg(m)
	if err != nil {
		s.log.Debug("event stream: undecodable event skipped", "seq", md.Sequence.Stream, "err", err)
		return true
	}
	data, err := json.Marshal(e)
	if err != nil {
		return true
	}
	if md.Stream == lifecycle.StreamProgress {
		return stream.Event("", e.Type(), data)
	}
	return stream.Event(strconv.FormatUint(md.Sequence.Stream, 10), e.Type(), data)
}

// sseKinds says which events a stream carries.
type sseKinds struct{ lifecycle, progress bool }

// sseTypes reads the type query: lifecycle, progress, or both (default).
// A kind filter asks for lifecycle events only.
func sseTypes(r *http.Request) (sseKinds, error) {
	k := sseKinds{lifecycle: true, progress: r.URL.Query().Get("kind") == ""}
	switch t := r.URL.Query().Get("type"); t {
	case "":
	case "lifecycle":
		k.progress = false
	case "progress", lifecycle.TypeProgress:
		k.lifecycle, k.progress = false, true
		if r.URL.Query().Get("kind") != "" {
			return k, problem.Invalid(client.FieldError{Field: "type", Message: "progress reports have no kind: leave out kind with type=progress"})
		}
	default:
		return k, problem.Invalid(client.FieldError{Field: "type", Message: fmt.Sprintf("%q: want lifecycle or progress (both when left out)", short(t))})
	}
	return k, nil
}

// progressConfig is the progress consumer matching a lifecycle filter:
// same thread and dispatch, from the start when the lifecycle events are
// replayed (the last reports kept per dispatch), else new ones only.
func progressConfig(r *http.Request, lc jetstream.OrderedConsumerConfig) jetstream.OrderedConsumerConfig {
	q := r.URL.Query()
	c := jetstream.OrderedConsumerConfig{FilterSubjects: []string{lifecycle.ProgressFilter(q.Get("thread"), q.Get("dispatch"))},
		DeliverPolicy: jetstream.DeliverNewPolicy}
	if lc.DeliverPolicy == jetstream.DeliverAllPolicy {
		c.DeliverPolicy = jetstream.DeliverAllPolicy
	}
	return c
}

// allowEvents lets a principal that sees only its own threads follow one
// of them (thread= or dispatch= of a thread it dispatched), never the
// feed of every thread (owner.go).
func (s *Service) allowEvents(ctx context.Context, b *bindings, r *http.Request) error {
	p := caller(r)
	if p.Admin || p.SeeAll {
		return nil
	}
	thread, dispatch := r.URL.Query().Get("thread"), r.URL.Query().Get("dispatch")
	if thread == "" && dispatch == "" {
		return &client.Problem{Type: client.ProblemForbidden, Title: "Forbidden", Status: http.StatusForbidden,
			Detail: fmt.Sprintf("principal %s sees only the threads it dispatched: name one with thread= or dispatch= (every thread's events need see: all in AGORA_PRINCIPALS_FILE)", p.Name)}
	}
	if thread != "" {
		if err := s.allowThread(ctx, b, p, "thread", thread, thread, false); err != nil {
			return err
		}
	}
	if dispatch != "" {
		threadID, owner, found, err := s.dispatchOwner(ctx, b, dispatch)
		switch {
		case err != nil:
			return err
		case !found:
			return s.gone("dispatch", dispatch) // a dispatch it cannot own yet
		}
		return s.allowOwner(p, "dispatch", dispatch, threadID, owner, false)
	}
	return nil
}
