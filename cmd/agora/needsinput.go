package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/agora-dispatch/agora/internal/subagentmcp"
	"github.com/agora-dispatch/agora/pkg/sentinel"
)

func newNeedsInputCmd() *cobra.Command {
	var (
		r           sentinel.Request
		kind, state string
		noReuse     bool
		asJSON      bool
	)
	cmd := &cobra.Command{
		Use:   "needs-input --question Q [--option A]... [--kind K] [--context C] [--partial-state JSON|@FILE|@-] [--dedupe-key KEY] [--no-reuse]",
		Short: "Inside a dispatch: ask the operator instead of guessing, then stop",
		Long: `needs-input is for sub-agents: it writes the dispatch's question file
($AGORA_NEEDS_INPUT_FILE, .agora/needs_input.json) atomically, after checking
it against the sentinel contract, and tells you to stop. Agora routes the
question to a person and starts the sub-agent again with the answer
("answer" in $AGORA_INPUT_FILE) and the saved partial state.

--kind is clarification, decision, information or approval. --partial-state
is any JSON (inline, @FILE, or @- for stdin): your analysis so far, returned
to you on the resumed run. Calling it again in the same run replaces the
earlier question. A bad call (an empty question, invalid JSON, a file over
1 MiB, or outside a dispatch) exits 1 with the reason and writes nothing.

--dedupe-key names the decision you ask for, stably (e.g.
"config-loader-name"): sibling sub-agents that ask with the same key on the
same route wait on one question, asked once, and a route that remembers
answers may answer it from an earlier decision. Without it, questions match
on sub-agent, question text, options and kind. --no-reuse asks for a fresh
answer: never one remembered from an earlier question.

Files the operator should see (a patch, a report) go under
$AGORA_ARTIFACTS_DIR before you ask: they are kept and shown with the
question. A sub-agent whose model speaks MCP can call the require_input tool instead:
the claude-code runtime wires it in; any binary of Agora serves it with
AGORA_SUBAGENT_MCP=serve.`,
		Example: `  agora needs-input --question "Deploy to staging or production?" \
    --option staging --option production --kind decision \
    --context "The change touches the billing schema." \
    --partial-state '{"checked": ["migrations apply cleanly"]}'
  exit 0`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ws, err := subagentmcp.Workspace()
			if err != nil {
				return err
			}
			r.Kind = sentinel.Kind(kind)
			if noReuse {
				no := false
				r.Reuse = &no
			}
			if state != "" {
				b, err := readArg(cmd.InOrStdin(), state)
				if err != nil {
					return fmt.Errorf("--partial-state: %w; nothing was written", err)
				}
				if !json.Valid(b) {
					return errors.New("--partial-state: not valid JSON; nothing was written")
				}
				r.PartialState = json.RawMessage(strings.TrimSpace(string(b)))
			}
			replaced, err := subagentmcp.RequireInput(ws, r)
			var me *sentinel.MalformedError
			var oe *sentinel.OversizedError
			switch {
			case errors.As(err, &me) && me.Field == "dedupe_key":
				return fmt.Errorf("%v (%s); nothing was written", flagNames(err.Error()), dedupeKeyRule)
			case errors.As(err, &me), errors.As(err, &oe):
				return fmt.Errorf("%v; nothing was written", flagNames(err.Error()))
			case err != nil:
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return newJSONLines(out).write(map[string]any{"written": sentinel.Path(ws), "replaced": replaced, "next": subagentmcp.StopMessage})
			}
			if replaced {
				fmt.Fprintln(out, "Replaced the earlier question of this run: only this one is asked.")
			}
			fmt.Fprintf(out, "Wrote %s.\n%s\n", sentinel.Path(ws), subagentmcp.StopMessage)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&r.Question, "question", "", "the question (required)")
	f.StringArrayVar(&r.Options, "option", nil, "an answer you can act on (repeat; none means free text)")
	f.StringVar(&kind, "kind", "", "clarification, decision, information or approval")
	f.StringVar(&r.Context, "context", "", "what the person needs to know to answer")
	f.StringVar(&state, "partial-state", "", "your analysis so far as JSON: inline, @FILE or @-")
	f.StringVar(&r.DedupeKey, "dedupe-key", "", "a stable name for the decision asked (e.g. config-loader-name): questions with the same key on a route are asked once")
	f.BoolVar(&noReuse, "no-reuse", false, "never answer this question from a remembered decision")
	f.BoolVar(&asJSON, "json", false, "print JSON only")
	return cmd
}

// dedupeKeyRule is the sentinel's rule for dedupe_key, in a sentence.
var dedupeKeyRule = fmt.Sprintf("a dedupe key is at most %d bytes of text, not blank, without control characters, e.g. config-loader-name", sentinel.MaxDedupeKey)

// readArg reads an inline value, @FILE, or @- (stdin).
func readArg(stdin io.Reader, v string) ([]byte, error) {
	switch {
	case v == "@-":
		return io.ReadAll(io.LimitReader(stdin, sentinel.MaxSize+1))
	case strings.HasPrefix(v, "@"):
		return os.ReadFile(v[1:])
	}
	return []byte(v), nil
}

// flagNames words a sentinel error in terms of this verb's flags.
func flagNames(msg string) string {
	msg = strings.TrimPrefix(msg, "sentinel: ")
	for field, flag := range map[string]string{"question": "--question", "options": "--option", "context": "--context", "kind": "--kind", "partial_state": "--partial-state", "dedupe_key": "--dedupe-key"} {
		msg = strings.Replace(msg, field, flag, 1)
	}
	return msg
}
