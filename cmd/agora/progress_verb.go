package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/agora-dispatch/agora/internal/subagentmcp"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

func newProgressCmd() *cobra.Command {
	var (
		percent    float64
		todo, done []string
	)
	cmd := &cobra.Command{
		Use:   "progress [MESSAGE] [--percent N] [--todo TEXT]... [--done TEXT]...",
		Short: "Inside a dispatch: report how the work goes",
		Long: `progress is for sub-agents: it appends one line to the dispatch's progress
file ($AGORA_PROGRESS_FILE, .agora/progress.jsonl), which the worker
publishes live (coalesced, at most 4 reports a second). MESSAGE says what
you are doing; --percent how far along you are (0-100); --todo and --done
list your to-do items, open and done. Outside a dispatch it exits 1 and
writes nothing.`,
		Example: `  agora progress "running the tests" --percent 60 --done "read the code" --todo "fix the flaky test"`,
		Args:    cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, a []string) error {
			ws, err := subagentmcp.Workspace()
			if err != nil {
				return err
			}
			var p subagentmcp.ProgressArgs
			if len(a) == 1 {
				p.Message = a[0]
			}
			if cmd.Flags().Changed("percent") {
				p.Percent = &percent
			}
			for _, t := range done {
				p.Todo = append(p.Todo, lifecycle.ProgressTodo{Text: t, Done: true})
			}
			for _, t := range todo {
				p.Todo = append(p.Todo, lifecycle.ProgressTodo{Text: t})
			}
			if p.Message == "" && p.Percent == nil && p.Todo == nil {
				return errors.New("say something: a MESSAGE, --percent, --todo or --done, e.g. `agora progress \"running the tests\" --percent 60`")
			}
			if err := subagentmcp.ReportProgress(ws, p); err != nil {
				return fmt.Errorf("%v; nothing was written", err)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.Float64Var(&percent, "percent", 0, "how far along, 0 to 100")
	f.StringArrayVar(&todo, "todo", nil, "an open to-do item (repeat)")
	f.StringArrayVar(&done, "done", nil, "a done to-do item (repeat)")
	return cmd
}
