package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

type cancelOptions struct {
	thread bool
	reason string
	as     string
	json   bool
}

func newCancelCmd(g *globals) *cobra.Command {
	var o cancelOptions
	cmd := &cobra.Command{
		Use:   "cancel ID [--thread] [--reason R]",
		Short: "Cancel a dispatch, or with --thread every round of a thread",
		Long: `cancel cancels a dispatch: a queued one never runs, a running one is stopped,
and one paused on a question ends its thread (the question is withdrawn).
Cancelling a dispatch that already ended changes nothing. With --thread, ID is
a thread id and every round of it that has not ended is cancelled.

With --json stdout carries the dispatch record (or the thread) as one JSON
object.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return runCancel(cmd, g, o, args[0]) },
	}
	f := cmd.Flags()
	f.BoolVar(&o.thread, "thread", false, "ID is a thread: cancel all of it")
	f.StringVar(&o.reason, "reason", "", "why, kept in the cancelled event")
	f.StringVar(&o.as, "as", whoAmI(), "who cancels (default $USER, or cli)")
	f.BoolVar(&o.json, "json", false, "print JSON only: the record or thread")
	return cmd
}

func runCancel(cmd *cobra.Command, g *globals, o cancelOptions, id string) error {
	if err := lifecycle.ValidToken(id); err != nil {
		return fmt.Errorf("%q is not an id: no dots, spaces or wildcards", id)
	}
	c, err := g.connect(cmd.ErrOrStderr())
	if err != nil {
		return err
	}
	defer c.Close()
	ctx := cmd.Context()
	out := cmd.OutOrStdout()
	by := client.CancelBy(o.as, o.reason)
	if o.thread {
		th, err := c.CancelThread(ctx, id, by)
		if isNotFound(err) {
			return errNotFound("thread", id, "`agora events` lists recent ones")
		}
		if err != nil {
			return g.explain(err, lifecycle.APICancel)
		}
		if o.json {
			return newJSONLines(out).write(th)
		}
		fmt.Fprintf(out, "cancelled thread %s (%d rounds; the latest is %s)\n", th.ThreadID, len(th.Rounds), th.Status)
		return nil
	}
	rec, err := c.Cancel(ctx, id, by)
	if isNotFound(err) {
		return errNotFound("dispatch", id, "`agora events` lists recent ones")
	}
	if err != nil {
		return g.explain(err, lifecycle.APICancel)
	}
	if o.json {
		return newJSONLines(out).write(rec)
	}
	switch rec.Status {
	case lifecycle.KindCancelled:
		fmt.Fprintf(out, "cancelled dispatch %s (%s, round %d)\n", rec.DispatchID, rec.Subagent, rec.Round)
	case lifecycle.KindNeedsInput:
		fmt.Fprintf(out, "dispatch %s was paused on a question: its thread %s ends cancelled and the question is withdrawn\n", rec.DispatchID, rec.ThreadID)
	case lifecycle.KindFinished, lifecycle.KindFailed:
		fmt.Fprintf(out, "dispatch %s had already ended %s: nothing to cancel\n", rec.DispatchID, rec.Status)
	default:
		fmt.Fprintf(out, "cancelling dispatch %s (it was %s): %s status %s shows when it ends\n", rec.DispatchID, rec.Status, g.cli(cmd), rec.DispatchID)
	}
	return nil
}

type statusOptions struct {
	thread bool
	json   bool
	inbox  string
}

func newStatusCmd(g *globals) *cobra.Command {
	var o statusOptions
	cmd := &cobra.Command{
		Use:   "status ID [--thread] [--json]",
		Short: "Show a dispatch (or with --thread every round of a thread)",
		Long: `status shows a dispatch record: its sub-agent, round and thread, its status
(accepted, started, finished, needs_input, failed or cancelled) and result.
With --thread, ID is a thread id (the root dispatch's id) and every round is
listed.

With --json stdout carries the record (or the thread) as one JSON object.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return runStatus(cmd, g, o, args[0]) },
	}
	f := cmd.Flags()
	f.BoolVar(&o.thread, "thread", false, "ID is a thread: show every round")
	f.BoolVar(&o.json, "json", false, "print JSON only: the record or thread")
	inboxFlag(cmd, &o.inbox)
	return cmd
}

func runStatus(cmd *cobra.Command, g *globals, o statusOptions, id string) error {
	if err := lifecycle.ValidToken(id); err != nil {
		return fmt.Errorf("%q is not an id: no dots, spaces or wildcards", id)
	}
	c, err := g.connect(cmd.ErrOrStderr())
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(cmd.Context(), g.timeout)
	defer cancel()
	out := cmd.OutOrStdout()
	if o.thread {
		th, err := c.Thread(ctx, id)
		if isNotFound(err) {
			return errNotFound("thread", id, "`agora events` lists recent ones")
		}
		if err != nil {
			return g.explain(err, lifecycle.APIStatus)
		}
		if o.json {
			return newJSONLines(out).write(th)
		}
		return printThread(out, th)
	}
	rec, err := c.Status(ctx, id)
	if isNotFound(err) {
		return errNotFound("dispatch", id, "`agora events` lists recent ones")
	}
	if err != nil {
		return g.explain(err, lifecycle.APIStatus)
	}
	if o.json {
		return newJSONLines(out).write(rec)
	}
	printRecord(out, rec, g.cli(cmd), o.inbox)
	return nil
}

func printRecord(w io.Writer, r *client.Record, cli, inbox string) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k, format string, a ...any) { fmt.Fprintf(tw, "%s\t"+format+"\n", append([]any{k}, a...)...) }
	row("dispatch", "%s", r.DispatchID)
	row("thread", "%s, round %d", r.ThreadID, r.Round)
	sub := r.Subagent
	if r.SubagentRevision > 0 {
		sub += fmt.Sprintf(" (revision %d)", r.SubagentRevision)
	}
	row("subagent", "%s", sub)
	row("status", "%s", r.Status)
	row("created", "%s", when(&r.CreatedAt))
	if r.StartedAt != nil {
		s := when(r.StartedAt)
		if r.WorkerID != "" {
			s += " on worker " + r.WorkerID
		}
		if r.Attempt > 1 {
			s += fmt.Sprintf(" (attempt %d)", r.Attempt)
		}
		row("started", "%s", s)
	}
	if r.EndedAt != nil {
		row("ended", "%s", when(r.EndedAt))
	}
	if r.Request != nil && len(r.Request.Labels) > 0 {
		keys := slices.Sorted(maps.Keys(r.Request.Labels))
		kv := make([]string, len(keys))
		for i, k := range keys {
			kv[i] = k + "=" + r.Request.Labels[k]
		}
		row("labels", "%s", strings.Join(kv, " "))
	}
	res := r.Result
	if res != nil {
		switch res.Kind {
		case lifecycle.KindFinished:
			s := "finished"
			if res.ExitCode != nil {
				s = fmt.Sprintf("exit %d", *res.ExitCode)
			}
			row("result", "%s in %s", s, ms(res.DurationMS))
		case lifecycle.KindFailed:
			row("result", "failed: %s", res.Reason)
			if res.Detail != "" {
				row("detail", "%s", res.Detail)
			}
		case lifecycle.KindCancelled:
			s := "cancelled by " + cmpOr(res.By, "someone")
			if res.Detail != "" {
				s += ": " + res.Detail
			}
			row("result", "%s", s)
		case lifecycle.KindNeedsInput:
			row("question", "%s %q", res.QuestionID, res.Question)
		}
	}
	_ = tw.Flush()
	if res == nil {
		return
	}
	switch res.Kind {
	case lifecycle.KindFinished:
		if len(res.Output) > 0 && string(res.Output) != "null" {
			fmt.Fprintf(w, "output:\n%s\n", prettyJSON(res.Output))
		}
	case lifecycle.KindNeedsInput:
		fmt.Fprintf(w, "\nIf the question is still open, answer it in the inbox: %s\nor: %s answer %s ANSWER\n", inboxLink(inbox, res.QuestionID), cli, res.QuestionID)
		fmt.Fprintf(w, "Once answered the thread goes on as a new dispatch: %s status %s --thread\n", cli, r.ThreadID)
	}
}

func printThread(w io.Writer, th *client.Thread) error {
	fmt.Fprintf(w, "thread %s: %s\n", th.ThreadID, th.Status)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ROUND\tDISPATCH\tSUBAGENT\tSTATUS\tENDED\tRESULT")
	for _, rd := range th.Rounds {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", rd.Round, rd.DispatchID, rd.Subagent, rd.Status, when(rd.EndedAt), resultSummary(rd.Result))
	}
	return tw.Flush()
}

func resultSummary(r *client.Result) string {
	if r == nil {
		return "-"
	}
	switch r.Kind {
	case lifecycle.KindFinished:
		if len(r.Output) > 0 && string(r.Output) != "null" {
			return clipText(compactJSON(r.Output), 80)
		}
		return "no output"
	case lifecycle.KindFailed:
		return clipText(string(r.Reason)+": "+r.Detail, 80)
	case lifecycle.KindCancelled:
		return clipText("by "+r.By+" "+r.Detail, 80)
	case lifecycle.KindNeedsInput:
		return clipText(r.QuestionID+" "+r.Question, 80)
	}
	return "-"
}

// when formats a time for people, local, to the second.
func when(t *time.Time) string {
	if t == nil || t.IsZero() {
		return "-"
	}
	return t.Local().Format("2006-01-02 15:04:05")
}
