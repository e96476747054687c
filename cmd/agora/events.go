package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/agora-dispatch/agora/internal/clip"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

type eventsOptions struct {
	thread   string
	dispatch string
	kind     string
	follow   bool
	json     bool
}

// historyIdle ends a history read that has seen no event for this long:
// a guard for a last event Watch skips (undecodable or of an unknown type).
const historyIdle = 3 * time.Second

func newEventsCmd(g *globals) *cobra.Command {
	var o eventsOptions
	cmd := &cobra.Command{
		Use:   "events [--thread ID] [--dispatch ID] [--kind K] [--follow] [--json]",
		Short: "List lifecycle events, and optionally keep streaming new ones",
		Long: `events prints the retained lifecycle events (AGORA_LIFECYCLE) that match the
filters, oldest first, and exits; with --follow it then keeps printing new ones
until interrupted. Kinds: accepted, started, finished, needs_input, failed,
cancelled.

With --json stdout carries one structured-mode CloudEvent per line and nothing
else.`,
		Example: `  agora events --thread 01JZ8W3K2Q…
  agora events --kind failed --json | jq -r .data.detail
  agora events --follow`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runEvents(cmd, g, o) },
	}
	f := cmd.Flags()
	f.StringVar(&o.thread, "thread", "", "only this thread's events")
	f.StringVar(&o.dispatch, "dispatch", "", "only this dispatch's events")
	f.StringVar(&o.kind, "kind", "", "only events of this kind")
	f.BoolVarP(&o.follow, "follow", "f", false, "keep streaming new events until interrupted")
	f.BoolVar(&o.json, "json", false, "print JSON only: one CloudEvent per line")
	return cmd
}

func runEvents(cmd *cobra.Command, g *globals, o eventsOptions) error {
	filter := client.Filter{Kind: lifecycle.Kind(o.kind), ThreadID: o.thread, DispatchID: o.dispatch, FromStart: true}
	if o.kind != "" && !filter.Kind.Valid() {
		kinds := make([]string, 0, 6)
		for _, k := range lifecycle.Kinds() {
			kinds = append(kinds, string(k))
		}
		return fmt.Errorf("--kind %q: want one of %s", o.kind, strings.Join(kinds, ", "))
	}
	for flag, id := range map[string]string{"thread": o.thread, "dispatch": o.dispatch} {
		if id != "" && lifecycle.ValidToken(id) != nil {
			return fmt.Errorf("--%s %q is not an id: no dots, spaces or wildcards", flag, id)
		}
	}
	c, err := g.connect(safeErr(cmd))
	if err != nil {
		return err
	}
	defer c.Close()
	ctx := cmd.Context()

	// Without --follow, read up to the last matching event there is now.
	var last uint64
	if !o.follow {
		last, err = lastSeq(ctx, g, c, filter.Subject())
		if err != nil {
			return g.explain(err, "")
		}
		if last == 0 {
			fmt.Fprintln(safeErr(cmd), "no events match")
			return nil
		}
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	idle := time.AfterFunc(historyIdle, cancel)
	if o.follow {
		idle.Stop()
	}
	defer idle.Stop()

	out := safeOut(cmd)
	jl := newJSONLines(out)
	var mu sync.Mutex // the progress goroutine writes too
	if o.follow && o.kind == "" {
		// Progress reports of running sub-agents, as they come.
		done := make(chan struct{})
		pf := filter
		pf.FromStart = false
		go func() {
			defer close(done)
			for it, err := range c.WatchProgress(wctx, pf) {
				if err != nil {
					return
				}
				mu.Lock()
				if o.json {
					_ = jl.write(it.Event)
				} else {
					r := it.Progress
					fmt.Fprintf(out, "%s  %-11s  %s#%d  dispatch %s  thread %s  %s\n", it.Event.Time().Local().Format("2006-01-02 15:04:05.000"),
						"progress", r.Subagent, r.Round, r.DispatchID, r.ThreadID, client.ProgressLine(r))
				}
				mu.Unlock()
			}
		}()
		defer func() { cancel(); <-done }()
	}
	for it, err := range c.Watch(wctx, filter) {
		if err != nil {
			if ctx.Err() != nil {
				return exitWith(exitInterrupt)
			}
			if wctx.Err() != nil { // idle: the rest was skipped
				return nil
			}
			return g.explain(err, "")
		}
		if !o.follow {
			idle.Reset(historyIdle)
		}
		mu.Lock()
		if o.json {
			err = jl.write(it.Event)
		} else {
			_, err = fmt.Fprintln(out, eventLine(it))
		}
		mu.Unlock()
		if err != nil {
			return err
		}
		if !o.follow && it.Seq >= last {
			return nil
		}
	}
	return nil
}

// lastSeq is the stream sequence of the last lifecycle event on subject,
// or 0 when there is none.
func lastSeq(ctx context.Context, g *globals, c *client.Client, subject string) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	js, err := jetstream.New(c.Conn())
	if err != nil {
		return 0, err
	}
	s, err := js.Stream(ctx, lifecycle.StreamLifecycle)
	if err != nil {
		return 0, fmt.Errorf("stream %s: %w", lifecycle.StreamLifecycle, err)
	}
	m, err := s.GetLastMsgForSubject(ctx, subject)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return 0, nil
	case err != nil:
		return 0, err
	}
	return m.Sequence, nil
}

// eventLine is one event for people: time, kind, sub-agent and round,
// dispatch and thread, then what the event says.
func eventLine(it client.Item) string {
	c := it.Data.Base()
	var b strings.Builder
	fmt.Fprintf(&b, "%s  %-11s  %s#%d  dispatch %s  thread %s", it.Event.Time().Local().Format("2006-01-02 15:04:05.000"),
		it.Kind(), c.Subagent, c.Round, c.DispatchID, c.ThreadID)
	if d := eventDetail(it.Data); d != "" {
		b.WriteString("  " + d)
	}
	return b.String()
}

func eventDetail(d lifecycle.Lifecycle) string {
	switch v := d.(type) {
	case *lifecycle.Accepted:
		return fmt.Sprintf("revision %d%s", v.SubagentRevision, labelText(v.Labels))
	case *lifecycle.Started:
		return fmt.Sprintf("worker %s attempt %d", v.WorkerID, v.Attempt)
	case *lifecycle.NeedsInput:
		s := fmt.Sprintf("%s %q", v.QuestionID, clip.Line(v.Question, 80))
		if len(v.Options) > 0 {
			s += " [" + strings.Join(v.Options, "|") + "]"
		}
		return s
	case *lifecycle.Finished:
		s := fmt.Sprintf("exit %d in %s", v.ExitCode, ms(v.DurationMS))
		if len(v.Output) > 0 && string(v.Output) != "null" {
			s += "  output " + clip.Line(compactJSON(v.Output), 100)
		}
		return s
	case *lifecycle.Failed:
		s := string(v.Reason)
		if v.Detail != "" {
			s += ": " + clip.Line(v.Detail, 120)
		}
		return s
	case *lifecycle.Cancelled:
		s := "by " + v.By
		if v.Reason != "" {
			s += ": " + clip.Line(v.Reason, 80)
		}
		return s
	}
	return ""
}

func labelText(m map[string]string) string {
	if len(m) == 0 {
		return ""
	}
	b, _ := json.Marshal(m)
	return " labels " + string(b)
}

func compactJSON(raw json.RawMessage) string {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return string(raw)
	}
	return b.String()
}
