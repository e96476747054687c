package main

import (
	"cmp"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/agora-dispatch/agora/internal/clip"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

func newDecisionsCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "decisions list [--route R] [--json] | forget ID [--json]",
		Short: "List and forget the decisions routes remember",
		Long: `A route with remember: in the routing file keeps each answer that long, and a
later question that matches it (same route, and the same dedupe_key, or else
the same sub-agent, question, options and kind) is answered with it at once,
answered_by memory:<question id> (docs/router.md, "Ask once").

  agora decisions list [--route R]   the remembered decisions, newest answer first
  agora decisions forget ID          forget one: later matching questions are asked again

Forgetting a decision never changes the threads it already answered.`,
	}
	cmd.AddCommand(newDecisionsListCmd(g), newDecisionsForgetCmd(g))
	return cmd
}

func newDecisionsListCmd(g *globals) *cobra.Command {
	var (
		route  string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "list [--route R] [--json]",
		Short: "List the remembered decisions, newest answer first",
		Long: `list shows the decisions the router remembers, of every route or of --route:
each decision's id (what forget takes), its route, what it matches (the
dedupe key, or the sub-agent), the question, the answer, who gave it, when,
and when it is forgotten by itself.

With --json stdout carries one JSON object per decision and nothing else:
id, route, subagent, dedupe_key, question, options, kind, question_id,
answer, decision, answered_by, comment, answered_at, expires_at.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if route != "" {
				if err := lifecycle.ValidToken(route); err != nil {
					return fmt.Errorf("--route %q is not a route name: %v", route, unprefix(err))
				}
			}
			c, ctx, done, err := g.call(cmd.Context(), safeErr(cmd))
			if err != nil {
				return err
			}
			defer done()
			ds, err := c.Decisions(ctx, route)
			if err != nil {
				return g.explain(err, lifecycle.APIDecisions)
			}
			out := safeOut(cmd)
			if asJSON {
				return writeJSONLines(out, ds, same)
			}
			if len(ds) == 0 {
				where := "no route"
				if route != "" {
					where = "route " + route
				}
				fmt.Fprintf(safeErr(cmd), "%s remembers a decision (a route keeps its answers with remember: in the routing file, e.g. remember: 720h)\n", where)
				return nil
			}
			if err := printDecisions(out, ds); err != nil {
				return err
			}
			fmt.Fprintf(safeErr(cmd), "\nforget one (later matching questions are asked again): %s decisions forget ID\n", g.cli(cmd))
			return nil
		},
	}
	cmd.Flags().StringVar(&route, "route", "", "only this route's decisions")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON only: one object per decision")
	return cmd
}

// printDecisions writes remembered decisions as a table, one line each.
func printDecisions(w io.Writer, ds []client.Decision) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tROUTE\tMATCHES\tQUESTION\tANSWER\tBY\tANSWERED\tEXPIRES")
	for _, d := range ds {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", d.ID, d.Route, decisionMatch(d), clip.Line(d.Question, 50),
			clip.Line(decisionAnswer(d), 30), d.AnsweredBy, age(d.AnsweredAt), until(d.ExpiresAt))
	}
	return tw.Flush()
}

// decisionMatch says what a decision matches on: its dedupe key, or else
// the sub-agent (with the question, options and kind).
func decisionMatch(d client.Decision) string {
	if d.DedupeKey != "" {
		return "key " + clip.Line(d.DedupeKey, 40)
	}
	return "sub-agent " + cmp.Or(d.Subagent, "-")
}

// decisionAnswer is a decision's answer, with an approval's decision.
func decisionAnswer(d client.Decision) string {
	a := cmp.Or(d.Answer, d.Decision)
	if d.Decision != "" && d.Answer != "" && d.Answer != d.Decision {
		a += " (" + d.Decision + ")"
	}
	return a
}

// until is how long until t, for people.
func until(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := time.Until(t)
	switch {
	case d <= 0:
		return "now"
	case d < time.Hour:
		return fmt.Sprintf("in %dm", int(d.Minutes())+1)
	case d < 48*time.Hour:
		return fmt.Sprintf("in %dh", int(d.Hours()))
	}
	return fmt.Sprintf("in %dd", int(d.Hours()/24))
}

func newDecisionsForgetCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "forget ID [--json]",
		Short: "Forget a remembered decision: later matching questions are asked again",
		Long: `forget removes one remembered decision (its id is in agora decisions list):
a later question that matched it is asked again, of a person or the route's
answerer. The threads it already answered are not changed.

With --json stdout carries the forgotten decision as one JSON object.`,
		Example: `  agora decisions forget 3f9a1c…`,
		Args:    args(1, arg{"ID", "the decision to forget (`agora decisions list` lists them)", "agora decisions forget 3f9a1c…"}),
		RunE: func(cmd *cobra.Command, a []string) error {
			id := a[0]
			if err := lifecycle.ValidToken(id); err != nil {
				return fmt.Errorf("%q is not a decision id (`%s decisions list` lists them)", id, g.cli(cmd))
			}
			c, ctx, done, err := g.call(cmd.Context(), safeErr(cmd))
			if err != nil {
				return err
			}
			defer done()
			d, err := c.ForgetDecision(ctx, id)
			if isNotFound(err) {
				return errNotFound("remembered decision", id, "it may have expired or been forgotten; `"+g.cli(cmd)+" decisions list` lists them")
			}
			if err != nil {
				return g.explain(err, lifecycle.APIDecisionsForget)
			}
			out := safeOut(cmd)
			if asJSON {
				return newJSONLines(out).write(d)
			}
			fmt.Fprintf(out, "forgot %s: %q, answered %q by %s (question %s, route %s)\n", d.ID, clip.Line(d.Question, 60),
				clip.Line(decisionAnswer(d), 40), d.AnsweredBy, d.QuestionID, d.Route)
			fmt.Fprintln(out, "later questions that match it are asked again; the threads it already answered are not changed")
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON only: the forgotten decision")
	return cmd
}
