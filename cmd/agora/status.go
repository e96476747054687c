package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/agora-dispatch/agora/internal/clip"
	"github.com/agora-dispatch/agora/internal/termsafe"
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
		Args: args(0, arg{"ID", "the dispatch to cancel (or with --thread, the thread)", "agora cancel 01JZ8W3K2Q…"}),
		RunE: func(cmd *cobra.Command, args []string) error { return runCancel(cmd, g, o, args[0]) },
	}
	f := cmd.Flags()
	f.BoolVar(&o.thread, "thread", false, "ID is a thread: cancel all of it")
	f.StringVar(&o.reason, "reason", "", "why, kept in the cancelled event")
	f.StringVar(&o.as, "as", "", "a name to record beside your NATS credentials' (\"NAME (via cli:<credentials>)\"); without it cli:<credentials>")
	f.BoolVar(&o.json, "json", false, "print JSON only: the record or thread")
	return cmd
}

func runCancel(cmd *cobra.Command, g *globals, o cancelOptions, id string) error {
	who, err := credentialName(g.natsURL, g.creds)
	if err != nil {
		return err
	}
	c, err := g.connectTo(id, safeErr(cmd))
	if err != nil {
		return err
	}
	defer c.Close()
	ctx := cmd.Context()
	out := safeOut(cmd)
	by := client.CancelBy(attributed("cli", who, o.as), o.reason)
	if o.thread {
		th, err := c.CancelThread(ctx, id, by)
		if isNotFound(err) {
			return errNotFound("thread", id, "`agora events` lists recent ones")
		}
		if err != nil {
			return g.explain(err, lifecycle.APICancel)
		}
		if o.json {
			if err := newJSONLines(out).write(th); err != nil {
				return err
			}
		} else {
			fmt.Fprintln(out, threadCancelMessage(th))
		}
		if th.Outcome == client.OutcomeAlreadyEnded {
			return exitWith(exitNothing)
		}
		return nil
	}
	rec, err := c.Cancel(ctx, id, by)
	if isNotFound(err) {
		return errNotFound("dispatch", id, "`agora events` lists recent ones")
	}
	if err != nil {
		return g.explain(err, lifecycle.APICancel)
	}
	res := cancelOutcome(ctx, c, rec)
	if o.json {
		if err := newJSONLines(out).write(res); err != nil {
			return err
		}
	} else {
		fmt.Fprintln(out, res.message(g.cli(cmd)))
	}
	if res.Outcome == outcomeAlreadyEnded {
		return exitWith(exitNothing)
	}
	return nil
}

// What a cancel did, the "outcome" of `agora cancel --json`
// (client.Outcome*; the dispatcher decides it from the state the cancel
// found).
const (
	outcomeCancelled    = client.OutcomeCancelled
	outcomeCancelling   = client.OutcomeCancelling
	outcomeThreadCancel = client.OutcomeThreadCancelling
	outcomeAlreadyEnded = client.OutcomeAlreadyEnded
)

// threadCancelMessage is the human line for a thread cancel.
func threadCancelMessage(th *client.Thread) string {
	switch th.Outcome {
	case client.OutcomeAlreadyEnded:
		return fmt.Sprintf("thread %s had already ended (%d rounds; the latest is %s): nothing to cancel", th.ThreadID, len(th.Rounds), th.Status)
	case client.OutcomeThreadCancelling:
		return fmt.Sprintf("thread %s was paused on a question: it ends cancelled and the question is withdrawn (%d rounds)", th.ThreadID, len(th.Rounds))
	}
	return fmt.Sprintf("cancelled thread %s (%d rounds; the latest is %s)", th.ThreadID, len(th.Rounds), th.Status)
}

// cancelResult is what `agora cancel` reports: the dispatch record as the
// dispatcher returned it, plus what the cancel did and, for a dispatch
// whose thread went on, the thread's latest round. Its JSON is the record's
// with "outcome", "thread_status" and "latest_dispatch_id" added.
type cancelResult struct {
	client.Record
	Outcome          string         `json:"outcome"`
	ThreadStatus     lifecycle.Kind `json:"thread_status,omitempty"`
	LatestDispatchID string         `json:"latest_dispatch_id,omitempty"`
	LatestRound      int            `json:"latest_round,omitempty"`
}

// cancelOutcome decides what a cancel did from the record it returned. A
// needs_input dispatch was paused on a question only when the dispatcher
// marked it cancel_requested (it does so only for a thread's latest round);
// otherwise its question was answered (or expired) and the thread went on,
// so the thread's latest round says how the thread stands.
func cancelOutcome(ctx context.Context, c *client.Client, rec *client.Record) cancelResult {
	res := cancelResult{Record: *rec}
	if rec.Outcome != "" {
		// The dispatcher's word, from the state the cancel found.
		res.Outcome = rec.Outcome
		if res.Outcome == outcomeAlreadyEnded && rec.Status == lifecycle.KindNeedsInput && rec.CancelRequested == nil {
			res.addLatest(ctx, c)
		}
		return res
	}
	switch rec.Status {
	case lifecycle.KindCancelled:
		res.Outcome = outcomeCancelled
	case lifecycle.KindNeedsInput:
		if rec.CancelRequested != nil {
			res.Outcome = outcomeThreadCancel
			return res
		}
		res.Outcome = outcomeAlreadyEnded
		res.addLatest(ctx, c)
	case lifecycle.KindFinished, lifecycle.KindFailed:
		res.Outcome = outcomeAlreadyEnded
	default:
		res.Outcome = outcomeCancelling
	}
	return res
}

// addLatest adds the thread's latest round, for a round whose thread went
// on.
func (r *cancelResult) addLatest(ctx context.Context, c *client.Client) {
	if th, err := c.Thread(ctx, r.ThreadID); err == nil {
		if l := th.Latest(); l != nil && l.DispatchID != r.DispatchID {
			r.ThreadStatus, r.LatestDispatchID, r.LatestRound = l.Status, l.DispatchID, l.Round
		}
	}
}

// message is the human line for a cancel's outcome.
func (r cancelResult) message(cli string) string {
	switch r.Outcome {
	case outcomeCancelled:
		return fmt.Sprintf("cancelled dispatch %s (%s, round %d)", r.DispatchID, r.Subagent, r.Round)
	case outcomeThreadCancel:
		return fmt.Sprintf("dispatch %s was paused on a question: its thread %s ends cancelled and the question is withdrawn", r.DispatchID, r.ThreadID)
	case outcomeCancelling:
		// The record ends cancelled at once; the worker stops the run.
		return fmt.Sprintf("cancelled dispatch %s (%s, round %d): it was running, and its worker is stopping it", r.DispatchID, r.Subagent, r.Round)
	}
	if r.LatestDispatchID == "" && r.Status == lifecycle.KindNeedsInput && r.CancelRequested != nil {
		return fmt.Sprintf("dispatch %s was paused on a question and its thread %s was already being cancelled: nothing more to cancel", r.DispatchID, r.ThreadID)
	}
	if r.LatestDispatchID == "" {
		return fmt.Sprintf("dispatch %s had already ended %s: nothing to cancel", r.DispatchID, r.Status)
	}
	head := fmt.Sprintf("dispatch %s had already ended (its question was settled and thread %s went on to round %d, dispatch %s", r.DispatchID, r.ThreadID, r.LatestRound, r.LatestDispatchID)
	switch r.ThreadStatus {
	case lifecycle.KindFinished, lifecycle.KindFailed, lifecycle.KindCancelled:
		return fmt.Sprintf("%s, which %s): nothing to cancel", head, endedWord(r.ThreadStatus))
	}
	return fmt.Sprintf("%s, now %s): nothing cancelled; %s cancel --thread %s cancels the thread", head, r.ThreadStatus, cli, r.ThreadID)
}

// endedWord says how a round ended, for a sentence.
func endedWord(k lifecycle.Kind) string {
	switch k {
	case lifecycle.KindFinished:
		return "finished"
	case lifecycle.KindCancelled:
		return "was cancelled"
	}
	return "ended " + string(k)
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
		Args: args(0, arg{"ID", "the dispatch to show (or with --thread, the thread)", "agora status 01JZ8W3K2Q… --thread"}),
		RunE: func(cmd *cobra.Command, args []string) error { return runStatus(cmd, g, o, args[0]) },
	}
	f := cmd.Flags()
	f.BoolVar(&o.thread, "thread", false, "ID is a thread: show every round")
	f.BoolVar(&o.json, "json", false, "print JSON only: the record or thread")
	inboxFlag(cmd, &o.inbox)
	return cmd
}

func runStatus(cmd *cobra.Command, g *globals, o statusOptions, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	c, ctx, done, err := g.call(cmd.Context(), safeErr(cmd))
	if err != nil {
		return err
	}
	defer done()
	out := safeOut(cmd)
	if o.thread {
		th, err := c.Thread(ctx, id)
		if isNotFound(err) {
			return errGone(err, "thread", id, "`agora events` lists recent ones")
		}
		if err != nil {
			return g.explain(err, lifecycle.APIStatus)
		}
		if o.json {
			return newJSONLines(out).write(th)
		}
		if err := printThread(out, th); err != nil {
			return err
		}
		// A thread paused on a question asked once: say how.
		if n := len(th.Rounds); n > 0 {
			if res := th.Rounds[n-1].Result; res != nil && res.Kind == lifecycle.KindNeedsInput {
				if q, err := c.Question(ctx, res.QuestionID); err == nil {
					tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
					questionRows(func(k, format string, a ...any) { fmt.Fprintf(tw, "%s\t"+format+"\n", append([]any{k}, a...)...) }, &q, g.cli(cmd))
					return tw.Flush()
				}
			}
		}
		return nil
	}
	rec, err := c.Status(ctx, id)
	if isNotFound(err) {
		return errGone(err, "dispatch", id, "`agora events` lists recent ones")
	}
	if err != nil {
		return g.explain(err, lifecycle.APIStatus)
	}
	if o.json {
		return newJSONLines(out).write(rec)
	}
	inbox := o.inbox
	var q *lifecycle.Question
	if rec.Result != nil && rec.Result.Kind == lifecycle.KindNeedsInput {
		inbox = inboxURL(ctx, c.Conn(), inbox)
		// The question's record says whether it joined another; a record
		// not readable (not asked yet) leaves the plain form.
		if rq, err := c.Question(ctx, rec.Result.QuestionID); err == nil {
			q = &rq
		}
	}
	// A question no longer open: where its thread went.
	var next *client.Record
	if q != nil && q.Status != "asked" && q.Status != lifecycle.StatusJoined {
		if th, err := c.Thread(ctx, rec.ThreadID); err == nil {
			for i := range th.Rounds {
				if th.Rounds[i].ParentID == rec.DispatchID {
					next = &th.Rounds[i].Record
				}
			}
		}
	}
	printRecord(out, rec, q, next, g.cli(cmd), inbox)
	return nil
}

// printRecord writes a dispatch record; q is the question it ended on,
// when it did and the record is known, and next the round that question's
// answer started, when there is one.
func printRecord(w io.Writer, r *client.Record, q *lifecycle.Question, next *client.Record, cli, inbox string) {
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
	if a := resumedWith(r); a != "" {
		row("resumed", "%s", a)
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
				row("detail", "%s", termsafe.Text(res.Detail))
			}
		case lifecycle.KindCancelled:
			s := "cancelled by " + termsafe.Text(cmp.Or(res.By, "someone"))
			if res.Detail != "" {
				s += ": " + termsafe.Text(res.Detail)
			}
			row("result", "%s", s)
		case lifecycle.KindNeedsInput:
			row("question", "%s %q", res.QuestionID, res.Question)
			questionRows(row, q, cli)
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
		if q != nil && q.Status != "asked" && q.Status != lifecycle.StatusJoined {
			fmt.Fprintf(w, "\n%s\n", closedQuestion(q))
			if next != nil {
				fmt.Fprintf(w, "The thread went on: round %d is dispatch %s, %s (%s status %s).\n", next.Round, next.DispatchID, next.Status, cli, next.DispatchID)
			}
			fmt.Fprintf(w, "The whole thread: %s status %s --thread\n", cli, r.ThreadID)
			return
		}
		qid := res.QuestionID
		if q != nil && q.JoinedTo != "" {
			qid = q.JoinedTo // a joined question is answered with the one it joined
		}
		fmt.Fprintf(w, "\nIf the question is still open, answer it in the inbox: %s\nor: %s answer %s ANSWER\n", inboxLink(inbox, qid), cli, qid)
		fmt.Fprintf(w, "Once answered the thread goes on as a new dispatch: %s status %s --thread\n", cli, r.ThreadID)
	}
}

// questionRows adds to a paused dispatch's rows how its question is asked:
// the question it joined and waits on, the threads waiting with it, a
// suggestion waiting for a person, or the remembered decision that
// answered it.
func questionRows(row func(k, format string, a ...any), q *lifecycle.Question, cli string) {
	if q == nil {
		return
	}
	switch {
	case q.Status == lifecycle.StatusJoined:
		row("waits on", "%s: the same question, asked once for every thread waiting on it (%s questions show %s)", q.JoinedTo, cli, q.JoinedTo)
	case q.JoinedTo != "":
		row("joined", "%s, and ended with it: %s", q.JoinedTo, q.Status)
	case q.Status == "asked" && threadsWaiting(*q) > 1:
		row("asked by", "%d threads (%s questions show %s)", threadsWaiting(*q), cli, q.QuestionID)
	}
	if s := q.Suggestion; s != nil && !s.Accepted && q.Status == "asked" {
		row("suggested", "%s", strings.TrimPrefix(suggestionText(s, 120), "suggested: "))
	}
	if q.Reused != nil {
		row("answered", "%s from memory: %s", cmp.Or(q.Answer, q.Decision), reusedText(q.Reused))
	}
}

func printThread(w io.Writer, th *client.Thread) error {
	fmt.Fprintf(w, "thread %s: %s\n", th.ThreadID, th.Status)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ROUND\tDISPATCH\tSUBAGENT\tSTATUS\tENDED\tRESUMED WITH\tRESULT")
	for _, rd := range th.Rounds {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", rd.Round, rd.DispatchID, rd.Subagent, rd.Status, when(rd.EndedAt),
			cmp.Or(resumedWith(&rd.Record), "-"), resultSummary(rd.Result))
	}
	return tw.Flush()
}

// resumedWith says which answer resumed a round ("readConfig" by alice,
// question q-…), from the answer the router put in the round's input; ""
// for a round no answer resumed.
func resumedWith(r *client.Record) string {
	if r.Request == nil || r.Request.QuestionID == "" {
		return ""
	}
	var in struct {
		Answer     string `json:"answer"`
		AnsweredBy string `json:"answered_by"`
		Decision   string `json:"decision"`
		Comment    string `json:"comment"`
	}
	if json.Unmarshal(r.Request.Input, &in) != nil || (in.Answer == "" && in.Decision == "") {
		return ""
	}
	s := strconv.Quote(clip.Line(cmp.Or(in.Answer, in.Decision), 40))
	if in.Decision != "" && in.Answer != in.Decision {
		s += " (" + in.Decision + ")"
	}
	if in.AnsweredBy != "" {
		s += " by " + in.AnsweredBy
	}
	if in.Comment != "" {
		s += ", comment " + strconv.Quote(clip.Line(in.Comment, 60))
	}
	return s + " to " + r.Request.QuestionID
}

func resultSummary(r *client.Result) string {
	if r == nil {
		return "-"
	}
	switch r.Kind {
	case lifecycle.KindFinished:
		if len(r.Output) > 0 && string(r.Output) != "null" {
			return clip.Line(compactJSON(r.Output), 80)
		}
		return "no output"
	case lifecycle.KindFailed:
		return clip.Line(string(r.Reason)+": "+r.Detail, 80)
	case lifecycle.KindCancelled:
		return clip.Line("by "+r.By+" "+r.Detail, 80)
	case lifecycle.KindNeedsInput:
		return clip.Line(r.QuestionID+" "+r.Question, 80)
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

// closedQuestion says how a question that no longer waits was closed.
func closedQuestion(q *lifecycle.Question) string {
	at := ""
	if q.AnsweredAt != nil {
		at = " at " + when(q.AnsweredAt)
	}
	switch q.Status {
	case "answered":
		a := q.Answer
		if q.Decision != "" {
			a = strings.TrimSpace(q.Decision + " " + q.Answer)
		}
		return fmt.Sprintf("Its question was answered: %q by %s%s.", termsafe.Text(a), termsafe.Text(q.AnsweredBy), at)
	case "expired":
		return "Its question expired before anyone answered: " + termsafe.Text(cmp.Or(q.Detail, "its deadline passed")) + "."
	case "withdrawn":
		return "Its question was withdrawn: " + termsafe.Text(cmp.Or(q.Detail, "its thread no longer needs the answer")) + "."
	}
	return "Its question is " + termsafe.Text(q.Status) + "."
}
