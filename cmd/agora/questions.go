package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/agora-dispatch/agora/internal/clip"
	"github.com/agora-dispatch/agora/internal/termsafe"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

type questionsOptions struct {
	route  string
	status string
	thread string
	json   bool
	long   bool
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
	Detail     string     `json:"detail,omitempty"`
	// The question asked once (docs/router.md, "Ask once"): the threads waiting
	// on it, the question a joined one waits on, the remembered decision
	// that answered it, and an answerer's suggestion.
	WaitingThreads []lifecycle.WaitingThread `json:"waiting_threads,omitempty"`
	JoinedTo       string                    `json:"joined_to,omitempty"`
	Reused         *lifecycle.Reused         `json:"reused,omitempty"`
	Suggestion     *lifecycle.Suggestion     `json:"suggestion,omitempty"`
	// ShownDigest is what the question shows, for agora answer --shown
	// (docs/cli.md, "Bound answers").
	ShownDigest string `json:"shown_digest,omitempty"`
}

func newQuestionsCmd(g *globals) *cobra.Command {
	var o questionsOptions
	cmd := &cobra.Command{
		Use:   "questions [--route R] [--status S] [--limit N] [--cursor C | --all] [--long] [--json]",
		Short: "List the questions sub-agents asked",
		Long: `questions lists question records, oldest first: by default those still
waiting for an answer (--status asked). --status takes asked, joined,
answered, expired, withdrawn or all.

A question several threads wait on is asked once: it says "asked by N
threads", and --long (or questions show QUESTION_ID) lists the threads. A
joined question is one that matched a question already waiting on its route
and waits on it (joined_to). A question answered from a remembered decision
names whose decision it reused; an answerer's suggestion waiting for a person
shows as "suggested: B (0.72, by agent:reviewer): why".

Waiting questions come a page at a time from the router (--limit, default
100, at most 1000); when more wait, stderr says how many and gives the
--cursor of the next page. --all reads every page. The other statuses read
the agora_questions bucket whole (as do waiting questions when no router
answers).

With --json stdout carries one JSON object per question and nothing else:
question_id, question, options, kind, route, status, dispatch_id, thread_id,
subagent, round, asked_at, and once answered answer, answered_by, answered_at;
waiting_threads, joined_to, reused and suggestion when the question has them.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runQuestions(cmd, g, o) },
	}
	cmd.AddCommand(newQuestionShowCmd(g))
	f := cmd.Flags()
	f.StringVar(&o.route, "route", "", "only questions on this route")
	f.StringVar(&o.status, "status", "asked", "only questions in this status: asked, answered, expired, withdrawn, or all")
	f.StringVar(&o.thread, "thread", "", "only this thread's questions")
	f.BoolVar(&o.json, "json", false, "print JSON only: one object per question")
	f.BoolVarP(&o.long, "long", "l", false, "every detail of each question, with the threads waiting on it")
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
	case "asked", lifecycle.StatusJoined, "answered", "expired", "withdrawn":
	case "pending":
		filter.Status = "asked"
	default:
		return fmt.Errorf("--status %q: want asked, joined, answered, expired, withdrawn or all", o.status)
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
	c, ctx, done, err := g.call(cmd.Context(), safeErr(cmd))
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
			fmt.Fprintln(safeErr(cmd), "no router answers agora.api.questions: reading the questions bucket whole")
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
			fmt.Fprintf(safeErr(cmd), "%d waiting in all, %d shown; the next page: %s questions --cursor %s\n", count, len(qs), g.cli(cmd), next)
		}
	}()
	out := safeOut(cmd)
	if o.json {
		return writeJSONLines(out, qs, lineOf)
	}
	if len(qs) == 0 {
		if filter.Status == "asked" {
			fmt.Fprintln(safeErr(cmd), "no questions are waiting for an answer (--status all lists every question)")
		} else {
			fmt.Fprintln(safeErr(cmd), "no questions match")
		}
		return nil
	}
	if o.long {
		for i, q := range qs {
			if i > 0 {
				fmt.Fprintln(out)
			}
			if err := printQuestion(out, q); err != nil {
				return err
			}
		}
	} else if err := printQuestions(out, qs); err != nil {
		return err
	}
	if filter.Status == "asked" {
		fmt.Fprintf(safeErr(cmd), "\nanswer one: %s answer QUESTION_ID ANSWER", g.cli(cmd))
		if slices.ContainsFunc(qs, func(q lifecycle.Question) bool { return q.KindIs(lifecycle.QuestionApproval) }) {
			fmt.Fprintf(safeErr(cmd), " (an approval: %s answer QUESTION_ID --decision approve|reject [--comment C])", g.cli(cmd))
		}
		fmt.Fprintln(safeErr(cmd))
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

// printQuestions writes questions as a table, one line each.
func printQuestions(w io.Writer, qs []lifecycle.Question) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "QUESTION_ID\tSTATUS\tROUTE\tKIND\tSUBAGENT\tASKED\tQUESTION\tOPTIONS / ANSWER")
	for _, q := range qs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", q.QuestionID, statusCell(q), q.Route, cmp.Or(q.Kind, "-"), q.Subagent,
			age(q.AskedAt), clip.Line(q.Question, 60), answerCell(q))
	}
	return tw.Flush()
}

// threadsWaiting is how many threads wait on q: its waiting_threads, which
// are absent when the asking thread alone waits.
func threadsWaiting(q lifecycle.Question) int { return max(1, len(q.WaitingThreads)) }

// statusCell is q's status for the table: how many threads an asked
// question waits for, which question a joined one waits on.
func statusCell(q lifecycle.Question) string {
	switch {
	case q.Status == "asked" && threadsWaiting(q) > 1:
		return fmt.Sprintf("asked by %d threads", threadsWaiting(q))
	case q.Status == lifecycle.StatusJoined && q.JoinedTo != "":
		return "joined " + q.JoinedTo
	}
	return q.Status
}

// suggestionText words an answerer's suggestion: "suggested: B (0.72, by
// agent:reviewer): why".
func suggestionText(s *lifecycle.Suggestion, rationale int) string {
	t := fmt.Sprintf("suggested: %s (%.2f, by %s)", clip.Line(cmp.Or(s.Answer, s.Decision), 40), s.Confidence, cmp.Or(s.By, "an answerer"))
	if s.Rationale != "" {
		t += ": " + clip.Line(s.Rationale, rationale)
	}
	return t
}

// reusedText words whose remembered decision answered a question.
func reusedText(r *lifecycle.Reused) string {
	t := "reused the decision of " + r.QuestionID
	if r.AnsweredBy != "" {
		t += " by " + r.AnsweredBy
	}
	if !r.AnsweredAt.IsZero() {
		t += ", made " + when(&r.AnsweredAt)
	}
	return t
}

// printQuestion writes every detail of q, the threads waiting on it
// among them.
func printQuestion(w io.Writer, q lifecycle.Question) error {
	fmt.Fprintf(w, "%s  %s\n", q.QuestionID, statusCell(q))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k, format string, a ...any) { fmt.Fprintf(tw, "  %s\t"+format+"\n", append([]any{k}, a...)...) }
	// A field of one line each: a line break in a sub-agent's text would
	// forge a row (or a command) of its own.
	row("question", "%s", termsafe.Text(q.Question))
	if len(q.Options) > 0 {
		row("options", "%s", termsafe.Text(strings.Join(q.Options, " | ")))
	}
	row("route", "%s", q.Route)
	if q.Kind != "" {
		row("kind", "%s", q.Kind)
	}
	row("asked", "%s (%s) by %s, thread %s round %d", when(&q.AskedAt), age(q.AskedAt), q.Subagent, q.ThreadID, q.Round)
	if q.Context != "" {
		row("context", "%s", clip.Line(q.Context, 200))
	}
	if q.Deadline != nil {
		row("deadline", "%s", when(q.Deadline))
	}
	if q.JoinedTo != "" {
		row("waits on", "%s: this question matched it and is answered with it", q.JoinedTo)
	}
	if s := q.Suggestion; s != nil {
		if s.Accepted {
			row("suggestion", "%s — accepted as the answer", suggestionText(s, 200))
		} else {
			row("suggestion", "%s — shown preselected", suggestionText(s, 200))
		}
	}
	if q.AnsweredBy != "" {
		a := cmp.Or(q.Answer, q.Decision)
		if q.Decision != "" && q.Answer != "" && q.Answer != q.Decision {
			a += " (" + q.Decision + ")"
		}
		row("answer", "%s, by %s at %s", clip.Line(a, 200), q.AnsweredBy, when(q.AnsweredAt))
	}
	if q.Reused != nil {
		row("reused", "%s", reusedText(q.Reused))
	}
	if q.Detail != "" {
		row("detail", "%s", termsafe.Text(q.Detail))
	}
	if len(q.WaitingThreads) > 0 {
		row("threads", "%d waiting", len(q.WaitingThreads))
	}
	if q.Status == "asked" && q.ShownDigest != "" {
		row("shown", "%s (agora answer %s … --shown %s answers what this shows, or nothing)", q.ShownDigest, q.QuestionID, q.ShownDigest)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(q.WaitingThreads) == 0 {
		return nil
	}
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "    THREAD\tDISPATCH\tSUBAGENT\tQUESTION_ID\tASKED")
	for _, t := range q.WaitingThreads {
		fmt.Fprintf(tw, "    %s\t%s\t%s\t%s\t%s\n", t.ThreadID, t.DispatchID, cmp.Or(t.Subagent, "-"), t.QuestionID, age(t.AskedAt))
	}
	return tw.Flush()
}

func newQuestionShowCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "show QUESTION_ID [--json]",
		Short: "Show one question: its answer, suggestion and the threads waiting on it",
		Long: `show prints one question record from the agora_questions bucket, whatever
its status: the question, its route, the threads waiting on it (when it was
asked once for several), the question it joined, a suggestion, the answer and
whose remembered decision answered it.

With --json stdout carries the question as one JSON object, as
agora questions --json prints it.`,
		Example: `  agora questions show q-01JZ8W3K2Q…`,
		Args:    args(1, arg{"QUESTION_ID", "the question to show (`agora questions` lists them)", "agora questions show q-01JZ8W3K2Q…"}),
		RunE: func(cmd *cobra.Command, args []string) error {
			qid := args[0]
			c, ctx, done, err := g.callQuestion(cmd, qid)
			if err != nil {
				return err
			}
			defer done()
			q, err := c.Question(ctx, qid)
			if isNotFound(err) {
				return errNotFound("question", qid+suggestQuestionID(qid), "`"+g.cli(cmd)+" questions --status all` lists them")
			}
			if err != nil {
				return g.explain(err, "")
			}
			if asJSON {
				return newJSONLines(safeOut(cmd)).write(lineOf(q))
			}
			return printQuestion(safeOut(cmd), q)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON only: the question")
	return cmd
}

func lineOf(q lifecycle.Question) questionLine {
	opts := q.Options
	if opts == nil {
		opts = []string{}
	}
	return questionLine{QuestionID: q.QuestionID, Question: q.Question, Options: opts, Kind: string(q.Kind), Route: q.Route,
		Status: q.Status, DispatchID: q.DispatchID, ThreadID: q.ThreadID, Subagent: q.Subagent, Round: q.Round,
		Context: q.Context, AskedAt: q.AskedAt, Deadline: q.Deadline, Answer: q.Answer, Decision: q.Decision,
		AnsweredBy: q.AnsweredBy, AnsweredAt: q.AnsweredAt, Detail: q.Detail,
		WaitingThreads: q.WaitingThreads, JoinedTo: q.JoinedTo, Reused: q.Reused, Suggestion: q.Suggestion, ShownDigest: q.ShownDigest}
}

func answerCell(q lifecycle.Question) string {
	if q.Status == "asked" {
		cell := clip.Line(strings.Join(q.Options, " | "), 60)
		switch {
		case q.KindIs(lifecycle.QuestionApproval):
			cell = "approval: --decision approve|reject"
		case len(q.Options) == 0:
			cell = "(free text)"
		}
		if q.Suggestion != nil && !q.Suggestion.Accepted {
			cell += "; " + suggestionText(q.Suggestion, 60)
		}
		return cell
	}
	if q.Status == lifecycle.StatusJoined {
		return "answered with " + q.JoinedTo
	}
	if q.AnsweredBy != "" {
		a := cmp.Or(q.Answer, q.Decision)
		if q.Reused != nil {
			return fmt.Sprintf("→ %s (%s)", clip.Line(a, 40), reusedText(q.Reused))
		}
		if s := q.Suggestion; s != nil && s.Accepted {
			return fmt.Sprintf("→ %s (by %s, confidence %.2f)", clip.Line(a, 40), q.AnsweredBy, s.Confidence)
		}
		return fmt.Sprintf("→ %s (by %s)", clip.Line(a, 40), q.AnsweredBy)
	}
	return clip.Line(q.Detail, 60)
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
	shown    string
	json     bool
}

func newAnswerCmd(g *globals) *cobra.Command {
	var o answerOptions
	cmd := &cobra.Command{
		Use:   "answer QUESTION_ID ANSWER [--decision approve|reject] [--comment C] [--as NAME] [--shown DIGEST]",
		Short: "Answer a question; the thread resumes with the answer",
		Long: `answer submits ANSWER to a question through the router (agora.api.answer). When
the question has options, ANSWER must be one of them. An approval needs
--decision approve or reject (ANSWER may then be left out). The first valid
answer wins: a question already answered, expired or withdrawn refuses the
answer, and so does an invalid one. Both exit 1 and say why.

--shown binds the answer to what you read: pass the digest
agora questions show printed ("shown"), and the router refuses the answer
(changed, exit 1) if the question no longer shows that — reworded, moved
or asked anew. Without it the answer answers the question as it stands.

With --json stdout carries the router's reply as one JSON object:
{"status": "accepted|already_answered|invalid|changed|not_found|retry", "reason": …,
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
	f.StringVar(&o.as, "as", "", "a name to record beside your NATS credentials' (answered_by \"NAME (via cli:<credentials>)\"); without it answered_by is cli:<credentials>")
	f.StringVar(&o.shown, "shown", "", "the shown digest `agora questions show` printed: the answer is refused if the question no longer shows that")
	f.BoolVar(&o.json, "json", false, "print JSON only: the router's reply")
	return cmd
}

// callQuestion starts a verb's exchange (call) about one question, once
// qid is a question id.
func (g *globals) callQuestion(cmd *cobra.Command, qid string) (*client.Client, context.Context, func(), error) {
	if err := lifecycle.ValidToken(qid); err != nil {
		return nil, nil, nil, fmt.Errorf("%q is not a question id%s (`agora questions` lists them)", qid, suggestQuestionID(qid))
	}
	return g.call(cmd.Context(), safeErr(cmd))
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
	who, err := credentialName(g.natsURL, g.creds)
	if err != nil {
		return err
	}
	by := attributed("cli", who, o.as)
	c, ctx, done, err := g.callQuestion(cmd, qid)
	if err != nil {
		return err
	}
	defer done()
	a := lifecycle.Answer{Answer: answer, Decision: o.decision, Comment: o.comment, AnsweredBy: by, ShownDigest: o.shown, Door: lifecycle.DoorCLI}
	reply, err := answerWithRetry(ctx, c, qid, a)
	out := safeOut(cmd)
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
		fmt.Fprintf(out, "answered %s: %s, as %s\n", qid, shown, cmp.Or(reply.AnsweredBy, by))
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
	case client.AnswerChanged:
		return fmt.Errorf("answer to %s refused (changed): %s — `%s questions show %s` shows it as it stands", qid, cmp.Or(r.Reason, "the question changed since it was shown"), g.cli(cmd), qid)
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
