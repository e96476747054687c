package egress

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Logging is bounded per proxy, that is per run (docs/sandbox.md, "Egress
// proxy"): a run can open thousands of refused connections a second, and
// a line each wrote megabytes of worker log in seconds. The first
// logBurst lines are written; after that at most one a second, carrying
// "dropped_lines", the lines left out since the last one written; when
// Serve returns, a last line counts every line left out. The proxy's
// counters (Stats) count every connection whatever was logged.
const logBurst = 100

// limitHandler passes records to h within the bound above.
type limitHandler struct {
	h     slog.Handler
	state *limitState
}

type limitState struct {
	mu       sync.Mutex
	written  int
	next     time.Time // when the next record past the burst may be written
	dropped  int       // since the last record written
	total    int       // every record left out
	interval time.Duration
}

func newLimitHandler(h slog.Handler) *limitHandler {
	return &limitHandler{h: h, state: &limitState{interval: time.Second}}
}

func (l *limitHandler) Enabled(ctx context.Context, level slog.Level) bool {
	return l.h.Enabled(ctx, level)
}

func (l *limitHandler) Handle(ctx context.Context, r slog.Record) error {
	s := l.state
	s.mu.Lock()
	now := time.Now()
	if s.written >= logBurst && now.Before(s.next) {
		s.dropped++
		s.total++
		s.mu.Unlock()
		return nil
	}
	s.written++
	if s.written >= logBurst {
		s.next = now.Add(s.interval)
	}
	dropped := s.dropped
	s.dropped = 0
	s.mu.Unlock()
	if dropped > 0 {
		r = r.Clone()
		r.AddAttrs(slog.Int("dropped_lines", dropped))
	}
	return l.h.Handle(ctx, r)
}

func (l *limitHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &limitHandler{h: l.h.WithAttrs(attrs), state: l.state}
}

func (l *limitHandler) WithGroup(name string) slog.Handler {
	return &limitHandler{h: l.h.WithGroup(name), state: l.state}
}

// droppedTotal returns how many records were left out in all.
func (l *limitHandler) droppedTotal() int {
	l.state.mu.Lock()
	defer l.state.mu.Unlock()
	return l.state.total
}
