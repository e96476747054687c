package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/spf13/cobra"

	"github.com/agora-dispatch/agora/answerers/inbox"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

type dispatchOptions struct {
	input      string
	id         string
	labels     []string
	env        []string
	runTimeout string
	maxRounds  int
	wait       bool
	round      bool
	json       bool
	inbox      string
}

// defaultInbox is where `agora dev` serves the inbox.
const defaultInbox = "http://127.0.0.1:8080/inbox"

func inboxFlag(cmd *cobra.Command, v *string) {
	cmd.Flags().StringVar(v, "inbox", os.Getenv("AGORA_INBOX_URL"), "base URL of the inbox, for the links printed to questions (AGORA_INBOX_URL; default: the URL the running inbox announces over NATS, else "+defaultInbox+")")
}

// inboxURL is the base URL of the inbox for printed links: the --inbox
// flag (or AGORA_INBOX_URL), else the URL a running inbox announces as the
// NATS micro service agora-inbox, else defaultInbox.
func inboxURL(ctx context.Context, nc *nats.Conn, flag string) string {
	if flag != "" {
		return flag
	}
	ctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	m, err := nc.RequestWithContext(ctx, "$SRV.INFO."+inbox.ServiceName, nil)
	if err != nil {
		return defaultInbox
	}
	var info micro.Info
	if json.Unmarshal(m.Data, &info) != nil || info.Metadata["url"] == "" {
		return defaultInbox
	}
	return info.Metadata["url"]
}

func newDispatchCmd(g *globals) *cobra.Command {
	var o dispatchOptions
	cmd := &cobra.Command{
		Use:   "dispatch SUBAGENT [--input JSON|@file] [--wait | --round] [--json]",
		Short: "Dispatch work to a sub-agent, and optionally follow it to its end",
		Long: `dispatch asks the dispatcher to run SUBAGENT with --input and prints the
dispatch id. With --wait it follows the thread: when the sub-agent stops to ask,
it prints the question, its options and where to answer (the inbox link and the
agora answer line), keeps waiting while it is answered, and prints the final
result. With --round it stops at this dispatch's own end.

Exit codes: 0 finished (or queued, without --wait/--round), 1 error,
2 failed, 3 cancelled, 4 needs_input (with --round), 130 interrupted.

With --json stdout carries one structured-mode CloudEvent per lifecycle event
(without --wait/--round: the dispatch record), and nothing else.`,
		Example: `  agora dispatch demo --input '{"task":"rename the config loader"}' --wait
  agora dispatch planner --input @task.json --label team=infra --round --json`,
		Args: args(0, arg{"SUBAGENT", "the name of the sub-agent to run (`agora subagent list` lists them)", `agora dispatch demo --input '{"task":"rename the config loader"}' --wait`}),
		RunE: func(cmd *cobra.Command, args []string) error { return runDispatch(cmd, g, o, args[0]) },
	}
	f := cmd.Flags()
	f.StringVar(&o.input, "input", "", "the input: a JSON object, @FILE to read it from a file, @- from stdin")
	f.StringVar(&o.id, "id", "", "dispatch id (the idempotency key: the same id again is the same dispatch)")
	f.StringArrayVar(&o.labels, "label", nil, "label KEY=VALUE (repeatable)")
	f.StringArrayVar(&o.env, "env", nil, "environment variable KEY=VALUE for the sub-agent (repeatable; not for secrets)")
	f.StringVar(&o.runTimeout, "timeout", "", "the sub-agent's time limit per round, e.g. 10m: its definition's or shorter (default: its definition's); --request-timeout bounds each request to Agora")
	f.IntVar(&o.maxRounds, "max-rounds", 0, "the thread's round limit (default: the definition's)")
	f.BoolVar(&o.wait, "wait", false, "follow the thread across its questions to its end")
	f.BoolVar(&o.round, "round", false, "follow this dispatch to its own end (exit 4 when it asks a question)")
	f.BoolVar(&o.json, "json", false, "print JSON only: one CloudEvent per line")
	inboxFlag(cmd, &o.inbox)
	cmd.MarkFlagsMutuallyExclusive("wait", "round")
	return cmd
}

func runDispatch(cmd *cobra.Command, g *globals, o dispatchOptions, name string) error {
	input, err := readInput(o.input, cmd.InOrStdin())
	if err != nil {
		return err
	}
	labels, err := keyValues("label", o.labels)
	if err != nil {
		return err
	}
	env, err := keyValues("env", o.env)
	if err != nil {
		return err
	}
	req := lifecycle.Request{DispatchID: o.id, Subagent: name, Input: input, Labels: labels, Env: env,
		Timeout: o.runTimeout, MaxRounds: o.maxRounds}
	c, err := g.connect(cmd.ErrOrStderr())
	if err != nil {
		return err
	}
	defer c.Close()
	ctx := cmd.Context()
	d, err := c.Dispatch(ctx, req)
	if err != nil {
		return g.explain(err, lifecycle.APIDispatch)
	}
	out := safeOut(cmd)
	if !o.wait && !o.round {
		if o.json {
			return newJSONLines(out).write(d.Record)
		}
		fmt.Fprintf(out, "dispatched %s to %s (thread %s, round %d)\n", d.DispatchID, d.Record.Subagent, d.ThreadID, d.Record.Round)
		fmt.Fprintf(out, "follow it:  %s events --thread %s --follow\nits status: %s status %s\n", g.cli(cmd), d.ThreadID, g.cli(cmd), d.DispatchID)
		return nil
	}
	return followDispatch(ctx, cmd, g, o, c, d)
}

// readInput reads --input: inline JSON, @file or @- (stdin). It must be a
// JSON object.
func readInput(s string, stdin io.Reader) (json.RawMessage, error) {
	if s == "" {
		return nil, nil
	}
	b := []byte(s)
	if path, ok := strings.CutPrefix(s, "@"); ok {
		var err error
		if path == "-" {
			b, err = io.ReadAll(stdin)
		} else {
			b, err = os.ReadFile(path)
		}
		if err != nil {
			return nil, fmt.Errorf("--input %s: %w", s, err)
		}
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, fmt.Errorf("--input is not valid JSON: %v", err)
	}
	if _, ok := v.(map[string]any); !ok {
		return nil, fmt.Errorf(`--input must be a JSON object such as {"task": "…"}`)
	}
	return json.RawMessage(b), nil
}

// followDispatch follows d: its thread (--wait) or itself (--round), to the end.
func followDispatch(ctx context.Context, cmd *cobra.Command, g *globals, o dispatchOptions, c *client.Client, d *client.Dispatch) error {
	out, errOut := safeOut(cmd), cmd.ErrOrStderr() // the progress line escapes what it shows itself
	var jl *jsonLines
	if o.json {
		jl = newJSONLines(out)
	}
	p := newProgress(errOut, o.json)
	defer p.close()
	p.note("dispatched %s to %s (thread %s, round %d)", d.DispatchID, d.Record.Subagent, d.ThreadID, d.Record.Round)
	f := client.Filter{ThreadID: d.ThreadID, FromStart: true}
	if o.round {
		f.DispatchID = d.DispatchID
	}
	// Progress reports of the followed runs go to the progress line (and,
	// with --json, to stdout as CloudEvents of their own type).
	var jmu sync.Mutex
	var lastShown string // the progress event id last shown
	pctx, stopProgress := context.WithCancel(ctx)
	progressDone := make(chan struct{})
	showProgress := func(e lifecycle.Event, r *lifecycle.Progress) {
		jmu.Lock()
		defer jmu.Unlock()
		if e.ID() == lastShown {
			return
		}
		lastShown = e.ID()
		p.set(fmt.Sprintf("progress   %s round %d — %s", r.Subagent, r.Round, client.ProgressLine(r)))
		if jl != nil {
			_ = jl.write(e)
		}
	}
	go func() {
		defer close(progressDone)
		for it, err := range c.WatchProgress(pctx, f) {
			if err != nil {
				return
			}
			showProgress(it.Event, it.Progress)
		}
	}()
	// At the end, the run's last report (sent just before its terminal
	// event, on another stream) is read once more, so it is not missed.
	finalProgress := func() {
		stopProgress()
		<-progressDone
		lctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if it, err := c.LatestProgress(lctx, f.ThreadID); err == nil && it != nil && (f.DispatchID == "" || it.Progress.DispatchID == f.DispatchID) {
			showProgress(it.Event, it.Progress)
		}
	}
	defer func() { stopProgress(); <-progressDone }()
	inboxKnown := false // o.inbox resolved, once, at the first question
	for it, err := range c.Watch(ctx, f) {
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			return g.explain(err, "")
		}
		if jl != nil {
			jmu.Lock()
			err := jl.write(it.Event)
			jmu.Unlock()
			if err != nil {
				return err
			}
		}
		p.set(stateOf(it.Data))
		switch v := it.Data.(type) {
		case *lifecycle.NeedsInput:
			if jl == nil {
				if !inboxKnown {
					o.inbox, inboxKnown = inboxURL(ctx, c.Conn(), o.inbox), true
				}
				note, reused, rec := askedOnceNote(ctx, c, v.QuestionID)
				block := questionBlock(g.cli(cmd), o.inbox, shownAs(questionOf(v), rec))
				if reused {
					block = askedBlock(questionOf(v))
				}
				block += note
				switch {
				case o.round:
					block += fmt.Sprintf("The dispatch stopped to ask. Once answered, the thread goes on as a new dispatch:\n  %s events --thread %s --follow\n", g.cli(cmd), v.ThreadID)
				case reused:
					block += "The thread goes on with it…\n\n"
				default:
					block += "Waiting for the answer…\n\n"
				}
				p.out(out, "%s", block)
			}
			if o.round {
				return exitWith(exitNeedsInput)
			}
		case *lifecycle.Finished, *lifecycle.Failed, *lifecycle.Cancelled:
			finalProgress()
			p.close()
			if jl == nil {
				printResult(out, it.Data)
			}
			return exitWith(exitCodeOf(it.Kind()))
		}
	}
	p.close()
	fmt.Fprintf(errOut, "stopped following; dispatch %s goes on without you — %s status %s\n", d.DispatchID, g.cli(cmd), d.DispatchID)
	return exitWith(exitInterrupt)
}

// exitCodeOf is the exit code of a followed dispatch that ended with k.
func exitCodeOf(k lifecycle.Kind) int {
	switch k {
	case lifecycle.KindFinished:
		return exitOK
	case lifecycle.KindFailed:
		return exitFailed
	case lifecycle.KindCancelled:
		return exitCancelled
	case lifecycle.KindNeedsInput:
		return exitNeedsInput
	}
	return exitError
}

// cli is the command line prefix that reaches the same server as this
// one: "agora", plus --nats and --creds when they were given as flags.
func (g *globals) cli(cmd *cobra.Command) string {
	s := "agora"
	if f := cmd.Flags().Lookup("nats"); f != nil && f.Changed {
		s += " --nats " + shellQuote(g.natsURL)
	}
	if f := cmd.Flags().Lookup("creds"); f != nil && f.Changed {
		s += " --creds " + shellQuote(g.creds)
	}
	return s
}

// stateOf is the progress line of a lifecycle event.
func stateOf(d lifecycle.Lifecycle) string {
	c := d.Base()
	where := fmt.Sprintf("%s round %d", c.Subagent, c.Round)
	switch v := d.(type) {
	case *lifecycle.Accepted:
		return fmt.Sprintf("accepted   %s — queued for a worker (dispatch %s)", where, c.DispatchID)
	case *lifecycle.Started:
		s := fmt.Sprintf("running    %s on worker %s", where, v.WorkerID)
		if v.Attempt > 1 {
			s += fmt.Sprintf(" (attempt %d)", v.Attempt)
		}
		return s
	case *lifecycle.NeedsInput:
		return fmt.Sprintf("asking     %s — waiting for an answer to %s", where, v.QuestionID)
	case *lifecycle.Finished:
		return fmt.Sprintf("finished   %s in %s", where, ms(v.DurationMS))
	case *lifecycle.Failed:
		return fmt.Sprintf("failed     %s: %s", where, v.Reason)
	case *lifecycle.Cancelled:
		return fmt.Sprintf("cancelled  %s by %s", where, v.By)
	}
	return string(d.LifecycleKind()) + " " + where
}

// question is what the CLI shows of a question.
type question struct {
	ID, Question, Context string
	Kind                  lifecycle.QuestionKind
	Options               []string
	Subagent              string
	Round                 int
	DispatchID            string
	// Shown is the record's shown digest when it shows what was printed:
	// the answer lines carry it (docs/cli.md, "Bound answers").
	Shown string
}

// shownAs binds q, printed from the needs_input event, to the shown
// digest of its record rec, when rec is asked on its own and shows the
// same text, context, kind and options.
func shownAs(q question, rec *lifecycle.Question) question {
	if rec != nil && rec.Status == "asked" && rec.Question == q.Question && rec.Context == q.Context && lifecycle.QuestionKind(rec.Kind) == q.Kind && slices.Equal(rec.Options, q.Options) {
		q.Shown = rec.ShownDigest
	}
	return q
}

func questionOf(n *lifecycle.NeedsInput) question {
	return question{ID: n.QuestionID, Question: n.Question, Context: n.Context, Kind: lifecycle.QuestionKind(n.Kind), Options: n.Options,
		Subagent: n.Subagent, Round: n.Round, DispatchID: n.DispatchID}
}

// questionBlock shows a question, its options and where to answer it.
func questionBlock(cli, inbox string, q question) string {
	var b strings.Builder
	b.WriteString(askedBlock(q))
	fmt.Fprintf(&b, "\nAnswer it in the inbox: %s\n", inboxLink(inbox, q.ID))
	lines := answerLines(cli, q)
	fmt.Fprintf(&b, "or here:                %s\n", lines[0])
	for _, l := range lines[1:] {
		fmt.Fprintf(&b, "                        %s\n", l)
	}
	return b.String()
}

// askedOnceNote says how the router took the question qid, from its
// record (docs/router.md, "Ask once"): answered at once from a remembered
// decision (reused), joined to one already waiting, or asked once for
// several threads, and a suggestion waiting for a person. It waits up to 3 s for
// the record, which the router writes a moment after the needs_input; ""
// when it is plainly asked or not recorded by then. rec is the record
// read, nil when none was.
func askedOnceNote(ctx context.Context, c *client.Client, qid string) (note string, reused bool, rec *lifecycle.Question) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	var q lifecycle.Question
	for {
		var err error
		if q, err = c.Question(ctx, qid); err == nil {
			break
		}
		if !isNotFound(err) {
			return "", false, nil
		}
		select {
		case <-ctx.Done():
			return "", false, nil
		case <-time.After(100 * time.Millisecond):
		}
	}
	var b strings.Builder
	switch {
	case q.Reused != nil:
		fmt.Fprintf(&b, "\nAnswered at once from memory: %q — %s.\n", cmp.Or(q.Answer, q.Decision), reusedText(q.Reused))
	case q.Status == lifecycle.StatusJoined:
		n := 0
		if jq, err := c.Question(ctx, q.JoinedTo); err == nil {
			n = threadsWaiting(jq)
		}
		fmt.Fprintf(&b, "\nAsked once: this question joined %s, the same question", q.JoinedTo)
		if n > 1 {
			fmt.Fprintf(&b, ", which %d threads wait on", n)
		}
		b.WriteString("; one answer resumes them all.\n")
	case q.Status == "asked" && threadsWaiting(q) > 1:
		fmt.Fprintf(&b, "\nAsked once for %d threads; one answer resumes them all.\n", threadsWaiting(q))
	}
	if s := q.Suggestion; s != nil && !s.Accepted && q.Status == "asked" {
		fmt.Fprintf(&b, "%s\n", suggestionText(s, 200))
	}
	return b.String(), q.Reused != nil, &q
}

// askedBlock shows a question and its options.
func askedBlock(q question) string {
	var b strings.Builder
	kind := ""
	if q.Kind != "" {
		kind = string(q.Kind) + ", "
	}
	fmt.Fprintf(&b, "\n%s asks (%sround %d, dispatch %s):\n", cmp.Or(q.Subagent, "the sub-agent"), kind, q.Round, q.DispatchID)
	fmt.Fprintf(&b, "  %s\n", q.Question)
	if q.Context != "" {
		for _, line := range strings.Split(strings.TrimRight(q.Context, "\n"), "\n") {
			fmt.Fprintf(&b, "    %s\n", line)
		}
	}
	if len(q.Options) > 0 {
		fmt.Fprintf(&b, "  Options: %s\n", strings.Join(q.Options, ", "))
	}
	return b.String()
}

// inboxLink is the inbox page of one question (answerers/inbox serves
// it at <inbox>/questions/<question_id>).
func inboxLink(inbox, qid string) string {
	return strings.TrimRight(inbox, "/") + "/questions/" + qid
}

// answerLines are the agora answer commands that answer q: one per
// option, approve and reject for an approval, a placeholder otherwise.
func answerLines(cli string, q question) []string {
	base := cli + " answer " + shellQuote(q.ID) + " "
	shown := ""
	if q.Shown != "" {
		shown = " --shown " + q.Shown
	}
	switch {
	case q.Kind == lifecycle.QuestionApproval:
		return []string{base + "approve --decision approve" + shown, base + "reject --decision reject" + shown}
	case len(q.Options) > 0:
		lines := make([]string, len(q.Options))
		for i, o := range q.Options {
			lines[i] = base + shellQuote(o) + shown
		}
		return lines
	}
	return []string{base + "'your answer'" + shown}
}

// printResult prints how a thread or dispatch ended: the finished output
// pretty-printed, or the failure or cancel.
func printResult(w io.Writer, d lifecycle.Lifecycle) {
	c := d.Base()
	where := fmt.Sprintf("%s, round %d of thread %s (dispatch %s)", c.Subagent, c.Round, c.ThreadID, c.DispatchID)
	switch v := d.(type) {
	case *lifecycle.Finished:
		fmt.Fprintf(w, "Finished: %s, exit %d in %s.\n", where, v.ExitCode, ms(v.DurationMS))
		switch {
		case len(v.Output) > 0 && string(v.Output) != "null":
			fmt.Fprintln(w, prettyJSON(v.Output))
		case v.StdoutTail != "":
			fmt.Fprintf(w, "No output.json; the end of its output:\n%s\n", strings.TrimRight(v.StdoutTail, "\n"))
		default:
			fmt.Fprintln(w, "No output.json.")
		}
	case *lifecycle.Failed:
		fmt.Fprintf(w, "Failed (%s): %s.\n", v.Reason, where)
		if v.Detail != "" {
			fmt.Fprintf(w, "  %s\n", strings.ReplaceAll(strings.TrimRight(v.Detail, "\n"), "\n", "\n  "))
		}
		if v.ExitCode != nil {
			fmt.Fprintf(w, "  exit code %d after %s\n", *v.ExitCode, ms(v.DurationMS))
		}
	case *lifecycle.Cancelled:
		fmt.Fprintf(w, "Cancelled by %s: %s.\n", cmp.Or(v.By, "someone"), where)
		if v.Reason != "" {
			fmt.Fprintf(w, "  %s\n", v.Reason)
		}
	}
}

// checkID refuses an id argument that cannot name a thread or dispatch
// (lifecycle.ValidToken) before anything is asked of the server.
func checkID(id string) error {
	if lifecycle.ValidToken(id) != nil {
		return fmt.Errorf("%q is not an id: no dots, spaces or wildcards", id)
	}
	return nil
}

// errNotFound words an unknown id.
func errNotFound(what, id, hint string) error {
	return &exitErr{code: exitError, err: fmt.Errorf("no %s %s — %s", what, id, hint)}
}

// errGone is errNotFound for a status read: the dispatcher's reason (it
// names how long finished work is kept) when it gave one.
func errGone(err error, what, id, hint string) error {
	var p *client.Problem
	if errors.As(err, &p) && p.Detail != "" {
		return &exitErr{code: exitError, err: fmt.Errorf("%s — %s", p.Detail, hint)}
	}
	return errNotFound(what, id, hint)
}

// isNotFound reports a pkg/client not-found error.
func isNotFound(err error) bool { return errors.Is(err, client.ErrNotFound) }
