package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

type questionsOptions struct {
	route  string
	status string
	thread string
	json   bool
	limit  int
	cursor string
	all    bool
}

// questionLine is one question in `agora questions --json`.
type questionLine struct {
	QuestionID string     `json:"question_id"`
	Question   string     `json:"question"`
	Options    []string   `json:"options"`
	Kind       string     `json:"kind"`
	Route      string     `json:"route"`
	Status     string     `json:"status"`
	DispatchID string     `json:"dispatch_id"`
	ThreadID   string     `json:"thread_id"`
	Subagent   string     `json:"subagent"`
	Round      int        `json:"round"`
	Context    string     `json:"context,omitempty"`
	AskedAt    time.Time  `json:"asked_at"`
	Deadline   *time.Time `json:"deadline,omitempty"`
	Answer     string     `json:"answer,omitempty"`
	Decision   string     `json:"decision,omitempty"`
	AnsweredBy string     `json:"answered_by,omitempty"`
	AnsweredAt *time.Time `json:"answered_at,omitempty"`
}

func newQuestionsCmd(g *globals) *cobra.Command {
	var o questionsOptions
	cmd := &cobra.Command{
		Use:   "questions [--route R] [--status S] [--limit N] [--cursor C | --all] [--json]",
		Short: "List the questions sub-agents asked",
		Long: `questions lists question records, oldest first: by default those still
waiting for an answer (--status asked). --status takes asked, answered,
expired, withdrawn or all.

Waiting questions come a page at a time from the router (--limit, default
100, at most 1000); when more wait, stderr says how many and gives the
--cursor of the next page. --all reads every page. The other statuses read
the agora_questions bucket whole (as do waiting questions when no router
answers).

With --json stdout carries one JSON object per question and nothing else:
question_id, question, options, kind, route, status, dispatch_id, thread_id,
subagent, round, asked_at, and once answered answer, answered_by, answered_at.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runQuestions(cmd, g, o) },
	}
	f := cmd.Flags()
	f.StringVar(&o.route, "route", "", "only questions on this route")
	f.StringVar(&o.status, "status", "asked", "only questions in this status: asked, answered, expired, withdrawn, or all")
	f.StringVar(&o.thread, "thread", "", "only this thread's questions")
	f.BoolVar(&o.json, "json", false, "print JSON only: one object per question")
	f.IntVar(&o.limit, "limit", client.DefaultWaitingLimit, fmt.Sprintf("waiting questions per page (1-%d)", client.MaxWaitingLimit))
	f.StringVar(&o.cursor, "cursor", "", "the page after this cursor (printed with the previous page)")
	f.BoolVar(&o.all, "all", false, "every page of waiting questions")
	return cmd
}

func runQuestions(cmd *cobra.Command, g *globals, o questionsOptions) error {
	filter := client.QuestionFilter{Route: o.route, Status: o.status, ThreadID: o.thread}
	switch o.status {
	case "all", "any", "":
		filter.Status = ""
	case "asked", "answered", "expired", "withdrawn":
	case "pending":
		filter.Status = "asked"
	default:
		return fmt.Errorf("--status %q: want asked, answered, expired, withdrawn or all", o.status)
	}
	if o.limit < 1 || o.limit > client.MaxWaitingLimit {
		return fmt.Errorf("--limit %d: want 1 to %d", o.limit, client.MaxWaitingLimit)
	}
	if filter.Status != "asked" && (o.cursor != "" || o.all) {
		return fmt.Errorf("--cursor and --all page waiting questions (--status asked), not --status %s", o.status)
	}
	if o.cursor != "" && o.all {
		return errors.New("--cursor and --all: give one (--all starts at the first page)")
	}
	c, ctx, done, err := g.call(cmd.Context(), cmd.ErrOrStderr())
	if err != nil {
		return err
	}
	defer done()
	var (
		qs    []lifecycle.Question
		next  string
		count int
	)
	if filter.Status == "asked" {
		qs, next, count, err = waitingPages(ctx, c, filter, o)
		if errors.Is(err, client.ErrUnavailable) {
			fmt.Fprintln(cmd.ErrOrStderr(), "no router answers agora.api.questions: reading the questions bucket whole")
			next = ""
			qs, err = c.Questions(ctx, filter)
			count = len(qs)
		}
	} else {
		qs, err = c.Questions(ctx, filter)
	}
	if err != nil {
		return g.explain(err, "")
	}
	defer func() {
		if next != "" {
			fmt.Fprintf(cmd.ErrOrStderr(), "%d waiting in all, %d shown; the next page: %s questions --cursor %s\n", count, len(qs), g.cli(cmd), next)
		}
	}()
	out := cmd.OutOrStdout()
	if o.json {
		jl := newJSONLines(out)
		for _, q := range qs {
			if err := jl.write(lineOf(q)); err != nil {
				return err
			}
		}
		return nil
	}
	if len(qs) == 0 {
		if filter.Status == "asked" {
			fmt.Fprintln(cmd.ErrOrStderr(), "no questions are waiting for an answer (--status all lists every question)")
		} else {
			fmt.Fprintln(cmd.ErrOrStderr(), "no questions match")
		}
		return nil
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "QUESTION_ID\tSTATUS\tROUTE\tKIND\tSUBAGENT\tASKED\tQUESTION\tOPTIONS / ANSWER")
	for _, q := range qs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", q.QuestionID, q.Status, q.Route, cmp.Or(q.Kind, "-"), q.Subagent,
			age(q.AskedAt), clipText(q.Question, 60), answerCell(q))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if filter.Status == "asked" {
		fmt.Fprintf(cmd.ErrOrStderr(), "\nanswer one: %s answer QUESTION_ID ANSWER", g.cli(cmd))
		if slices.ContainsFunc(qs, func(q lifecycle.Question) bool { return q.Kind == "approval" }) {
			fmt.Fprintf(cmd.ErrOrStderr(), " (an approval: %s answer QUESTION_ID --decision approve|reject [--comment C])", g.cli(cmd))
		}
		fmt.Fprintln(cmd.ErrOrStderr())
	}
	return nil
}

// waitingPages reads the page o asks for (after o.cursor), or every page
// with o.all, from the router; next is the cursor of the page after.
func waitingPages(ctx context.Context, c *client.Client, f client.QuestionFilter, o questionsOptions) (qs []lifecycle.Question, next string, count int, err error) {
	cursor := o.cursor
	for {
		p, err := c.Waiting(ctx, f, o.limit, cursor)
		if err != nil {
			return nil, "", 0, err
		}
		qs, count = append(qs, p.Questions...), p.Count
		if !o.all || p.NextCursor == "" {
			return qs, p.NextCursor, count, nil
		}
		cursor = p.NextCursor
	}
}

func lineOf(q lifecycle.Question) questionLine {
	opts := q.Options
	if opts == nil {
		opts = []string{}
	}
	return questionLine{QuestionID: q.QuestionID, Question: q.Question, Options: opts, Kind: q.Kind, Route: q.Route,
		Status: q.Status, DispatchID: q.DispatchID, ThreadID: q.ThreadID, Subagent: q.Subagent, Round: q.Round,
		Context: q.Context, AskedAt: q.AskedAt, Deadline: q.Deadline, Answer: q.Answer, Decision: q.Decision,
		AnsweredBy: q.AnsweredBy, AnsweredAt: q.AnsweredAt}
}

func answerCell(q lifecycle.Question) string {
	if q.Status == "asked" {
		if q.Kind == "approval" {
			return "approval: --decision approve|reject"
		}
		if len(q.Options) == 0 {
			return "(free text)"
		}
		return clipText(strings.Join(q.Options, " | "), 60)
	}
	if q.AnsweredBy != "" {
		a := cmp.Or(q.Answer, q.Decision)
		return fmt.Sprintf("→ %s (by %s)", clipText(a, 40), q.AnsweredBy)
	}
	return clipText(q.Detail, 60)
}

// age is how long ago t was, for people.
func age(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := time.Since(t)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh ago", int(d.Hours()))
	}
	return t.Local().Format("2006-01-02")
}

type answerOptions struct {
	decision string
	comment  string
	as       string
	json     bool
}

func newAnswerCmd(g *globals) *cobra.Command {
	var o answerOptions
	cmd := &cobra.Command{
		Use:   "answer QUESTION_ID ANSWER [--decision approve|reject] [--comment C] [--as NAME]",
		Short: "Answer a question; the thread resumes with the answer",
		Long: `answer submits ANSWER to a question through the router (agora.api.answer). When
the question has options, ANSWER must be one of them. An approval needs
--decision approve or reject (ANSWER may then be left out). The first valid
answer wins: a question already answered, expired or withdrawn refuses the
answer, and so does an invalid one. Both exit 1 and say why.

With --json stdout carries the router's reply as one JSON object:
{"status": "accepted|already_answered|invalid|not_found|retry", "reason": …,
"answered_by": …, "answered_at": …}.`,
		Example: `  agora answer q-01JZ8W3K2Q… readConfig
  agora answer q-01JZ8W3K2Q… --decision approve --comment "ship it" --as alice`,
		Args: args(1, arg{"QUESTION_ID", "the question to answer (`agora questions` lists them)", "agora answer q-01JZ8W3K2Q… readConfig"}),
		RunE: func(cmd *cobra.Command, args []string) error {
			answer := ""
			if len(args) == 2 {
				answer = args[1]
			}
			return runAnswer(cmd, g, o, args[0], answer)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.decision, "decision", "", "approve or reject (approval questions)")
	f.StringVar(&o.comment, "comment", "", "a comment kept with the answer")
	f.StringVar(&o.as, "as", whoAmI(), "who answers: your $USER, or cli when it is unset")
	f.BoolVar(&o.json, "json", false, "print JSON only: the router's reply")
	return cmd
}

func runAnswer(cmd *cobra.Command, g *globals, o answerOptions, qid, answer string) error {
	switch o.decision {
	case "", "approve", "reject":
	default:
		return fmt.Errorf("--decision %q: want approve or reject", o.decision)
	}
	if answer == "" && o.decision == "" {
		return errors.New("give an ANSWER (or --decision approve|reject for an approval question)")
	}
	if err := lifecycle.ValidToken(qid); err != nil {
		return fmt.Errorf("%q is not a question id%s (`agora questions` lists them)", qid, suggestQuestionID(qid))
	}
	c, ctx, done, err := g.call(cmd.Context(), cmd.ErrOrStderr())
	if err != nil {
		return err
	}
	defer done()
	a := lifecycle.Answer{Answer: answer, Decision: o.decision, Comment: o.comment, AnsweredBy: o.as}
	reply, err := answerWithRetry(ctx, c, qid, a)
	out := cmd.OutOrStdout()
	var ae *client.AnswerError
	switch {
	case err == nil:
		if o.json {
			return newJSONLines(out).write(reply)
		}
		shown := answer
		switch {
		case o.decision != "" && answer == "":
			shown = o.decision
		case o.decision != "":
			shown = answer + " (" + o.decision + ")"
		}
		fmt.Fprintf(out, "answered %s: %s, as %s\n", qid, shown, cmp.Or(reply.AnsweredBy, o.as))
		if reply.Reason != "" {
			fmt.Fprintln(out, reply.Reason)
		} else {
			fmt.Fprintln(out, "the thread resumes with the answer as a new dispatch")
		}
		return nil
	case errors.As(err, &ae):
		if o.json {
			if werr := newJSONLines(out).write(ae.Reply); werr != nil {
				return werr
			}
		}
		return &exitErr{code: exitError, err: answerRefusal(g, cmd, qid, ae.Reply)}
	}
	return g.explain(err, lifecycle.APIAnswer)
}

// answerRefusal says why an answer was not taken.
func answerRefusal(g *globals, cmd *cobra.Command, qid string, r client.AnswerReply) error {
	switch r.Status {
	case client.AnswerAlreadyAnswered:
		why := r.Reason
		if why == "" && r.AnsweredBy != "" {
			why = "already answered by " + r.AnsweredBy
			if r.AnsweredAt != nil {
				why += " at " + r.AnsweredAt.Format(time.RFC3339)
			}
		}
		return fmt.Errorf("cannot answer %s: %s — the first answer wins", qid, cmp.Or(why, "it is closed"))
	case client.AnswerInvalid:
		return fmt.Errorf("answer to %s refused (invalid): %s", qid, cmp.Or(r.Reason, "no reason given"))
	case client.AnswerNotFound:
		msg := "no question " + qid
		if r.Reason != "" && r.Reason != msg {
			msg = r.Reason
		}
		return fmt.Errorf("%s%s — `%s questions --status all` lists them", msg, suggestQuestionID(qid), g.cli(cmd))
	case client.AnswerRetry:
		return fmt.Errorf("the router could not take the answer to %s within %s (%s) — send it again", qid, g.timeout, cmp.Or(r.Reason, "a temporary failure"))
	}
	return fmt.Errorf("answer to %s: %s %s", qid, r.Status, r.Reason)
}

// answerWithRetry sends an answer, and again while the router replies
// "retry" (a question asked a moment ago may not be recorded yet), until
// ctx ends.
func answerWithRetry(ctx context.Context, c *client.Client, qid string, a lifecycle.Answer) (*client.AnswerReply, error) {
	wait := 100 * time.Millisecond
	for {
		reply, err := c.Answer(ctx, qid, a)
		var ae *client.AnswerError
		if !errors.As(err, &ae) || ae.Reply.Status != client.AnswerRetry {
			return reply, err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, err
		case <-t.C:
		}
		wait = min(2*wait, time.Second)
	}
}
