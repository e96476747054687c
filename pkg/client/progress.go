package client

import (
	"context"
	"fmt"
	"iter"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// ProgressItem is one progress report read from AGORA_PROGRESS.
type ProgressItem struct {
	// Seq is the report's stream sequence.
	Seq      uint64
	Event    lifecycle.Event
	Progress *lifecycle.Progress
}

// WatchProgress iterates over the progress reports of running sub-agents
// (docs/progress.md) that match f's ThreadID and DispatchID (its Kind is
// ignored), in stream order, through an ordered consumer on AGORA_PROGRESS.
// FromStart replays the reports still kept (the latest few per dispatch);
// otherwise it starts with new ones. It ends as Watch does.
func (c *Client) WatchProgress(ctx context.Context, f Filter) iter.Seq2[ProgressItem, error] {
	return func(yield func(ProgressItem, error) bool) {
		f.Kind = ""
		if err := f.validate(); err != nil {
			yield(ProgressItem{}, err)
			return
		}
		subject := lifecycle.ProgressFilter(f.ThreadID, f.DispatchID)
		err := c.follow(ctx, lifecycle.StreamProgress, f.consumer(subject), "watch "+subject, func(m jetstream.Msg) bool {
			it, ok := progressItem(m)
			return !ok || yield(it, nil)
		})
		if err != nil {
			yield(ProgressItem{}, err)
		}
	}
}

// progressItem decodes a progress message; ok is false for anything to skip.
func progressItem(m jetstream.Msg) (ProgressItem, bool) {
	seq, e, d, ok := decode(m)
	if !ok {
		return ProgressItem{}, false
	}
	p, ok := d.(*lifecycle.Progress)
	if !ok {
		return ProgressItem{}, false
	}
	return ProgressItem{Seq: seq, Event: e, Progress: p}, true
}

// ProgressLine is a one-line account of a progress report for people:
// "40% running the tests (2/5 done)".
func ProgressLine(p *lifecycle.Progress) string {
	s := ""
	if p.Percent != nil {
		s = fmt.Sprintf("%.0f%%", *p.Percent)
	}
	if p.Message != "" {
		if s != "" {
			s += " "
		}
		s += p.Message
	}
	if n := len(p.Todo); n > 0 {
		done := 0
		for _, t := range p.Todo {
			if t.Done {
				done++
			}
		}
		if s != "" {
			s += " "
		}
		s += fmt.Sprintf("(%d/%d done)", done, n)
	}
	return s
}
