package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// sseWriteTimeout bounds one write to an event stream client.
const sseWriteTimeout = 30 * time.Second

// httpEvents serves GET /v1/events: lifecycle events as Server-Sent Events
// through an ordered consumer on AGORA_LIFECYCLE. Each event's id is its
// stream sequence and its data the structured-mode CloudEvent JSON; a
// client that reconnects with Last-Event-ID resumes right after it, with
// no gap and no repeat. A comment line is sent every SSEKeepalive.
func (s *Service) httpEvents(w http.ResponseWriter, r *http.Request) {
	cfg, err := sseFilter(r)
	if err != nil {
		writeProblem(w, r, s.problem(err))
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	b, err := s.bind(ctx)
	if err != nil {
		writeProblem(w, r, s.problem(err))
		return
	}
	cons, err := b.js.OrderedConsumer(ctx, lifecycle.StreamLifecycle, cfg)
	if err != nil {
		writeProblem(w, r, s.problem(fmt.Errorf("dispatcher: events: %w", err)))
		return
	}
	// Messages creates the consumer on the server: from here on nothing
	// published is missed, so the client is told it is connected.
	msgs, err := cons.Messages()
	if err != nil {
		writeProblem(w, r, s.problem(fmt.Errorf("dispatcher: events: %w", err)))
		return
	}
	defer msgs.Stop()

	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	write := func(format string, a ...any) bool {
		if err := rc.SetWriteDeadline(time.Now().Add(sseWriteTimeout)); err != nil && !errors.Is(err, http.ErrNotSupported) {
			return false
		}
		if _, err := fmt.Fprintf(w, format, a...); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	if !write(": connected\n\n") {
		return
	}

	var wg sync.WaitGroup
	defer wg.Wait() // after cancel, below
	defer cancel()
	items := make(chan jetstream.Msg)
	wg.Go(func() {
		defer close(items)
		for {
			m, err := msgs.Next(jetstream.NextContext(ctx))
			if err != nil {
				if ctx.Err() == nil {
					s.log.Warn("event stream ended", "err", err)
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
	keepalive := time.NewTicker(s.cfg.SSEKeepalive)
	defer keepalive.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.stopping:
			return
		case <-keepalive.C:
			if !write(": keepalive\n\n") {
				return
			}
		case m, ok := <-items:
			if !ok {
				return
			}
			md, err := m.Metadata()
			if err != nil {
				continue
			}
			e, err := lifecycle.DecodeMsg(m)
			if err != nil {
				s.log.Debug("event stream: undecodable event skipped", "seq", md.Sequence.Stream, "err", err)
				continue
			}
			data, err := json.Marshal(e)
			if err != nil {
				continue
			}
			if !write("id: %d\ndata: %s\n\n", md.Sequence.Stream, data) {
				return
			}
		}
	}
}
