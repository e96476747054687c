package mcpserver

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agora-dispatch/agora/internal/clip"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// EventsArgs are agora_events' arguments.
type EventsArgs struct {
	ThreadID string `json:"thread_id" jsonschema:"the thread"`
	Since    string `json:"since,omitempty" jsonschema:"only events after the event with this id (from an earlier call)"`
}

// EventList is agora_events' result.
type EventList struct {
	Events []EventItem `json:"events"`
}

// EventItem is one lifecycle event.
type EventItem struct {
	ID         string `json:"id"`
	Kind       string `json:"kind"`
	Time       string `json:"time"`
	DispatchID string `json:"dispatch_id"`
	Round      int    `json:"round"`
	Summary    string `json:"summary,omitempty"`
}

func (t *tools) events(ctx context.Context, _ *mcp.CallToolRequest, in EventsArgs) (*mcp.CallToolResult, *EventList, error) {
	if err := lifecycle.ValidToken(in.ThreadID); err != nil || in.ThreadID == "" {
		return nil, nil, fmt.Errorf("thread_id %q is not a thread id", in.ThreadID)
	}
	th, err := t.s.c.Thread(ctx, in.ThreadID)
	if err != nil {
		return nil, nil, t.explainTarget(err, "thread", in.ThreadID)
	}
	if err := t.seeRead(th); err != nil {
		return nil, nil, err
	}
	var all []EventItem
	for _, rd := range th.Rounds {
		for _, e := range rd.Events {
			d, err := lifecycle.Parse(e)
			if err != nil {
				continue
			}
			l, ok := d.(lifecycle.Lifecycle)
			if !ok {
				continue
			}
			all = append(all, EventItem{ID: e.ID(), Kind: string(l.LifecycleKind()), Time: e.Time().UTC().Format(time.RFC3339Nano),
				DispatchID: rd.DispatchID, Round: rd.Round, Summary: summary(d)})
		}
	}
	if in.Since != "" {
		i := slices.IndexFunc(all, func(e EventItem) bool { return e.ID == in.Since })
		if i < 0 {
			return nil, nil, fmt.Errorf("since %q is not an event of thread %s", in.Since, in.ThreadID)
		}
		all = all[i+1:]
	}
	if all == nil {
		all = []EventItem{}
	}
	return nil, &EventList{Events: all}, nil
}

// summary is a one-line account of an event.
func summary(d lifecycle.Data) string {
	switch v := d.(type) {
	case *lifecycle.Started:
		return fmt.Sprintf("attempt %d on %s", v.Attempt, v.WorkerID)
	case *lifecycle.NeedsInput:
		return "asked " + clip.String(v.Question, 200)
	case *lifecycle.Finished:
		return fmt.Sprintf("exit %d in %dms", v.ExitCode, v.DurationMS)
	case *lifecycle.Failed:
		return string(v.Reason) + ": " + clip.String(v.Detail, 200)
	case *lifecycle.Cancelled:
		return strings.TrimSpace("by " + v.By + " " + v.Reason)
	}
	return ""
}
