package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"

	"github.com/agora-dispatch/agora/internal/clip"
	"github.com/agora-dispatch/agora/internal/config"
	"github.com/agora-dispatch/agora/internal/sandbox/contain"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/subagent"
)

func newSubagentCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "subagent",
		Aliases: []string{"subagents"},
		Short:   "Register, list and show sub-agent definitions",
		Long: `subagent manages the sub-agent definitions in the agora_subagents bucket. A
definition is YAML or JSON: name, runtime (exec, claude-code, codex,
gemini-cli or one the workers announce), command or
prompt, timeout, env_allow, files, max_rounds, description.`,
	}
	cmd.AddCommand(newSubagentApplyCmd(g), newSubagentCheckCmd(g), newSubagentListCmd(g), newSubagentGetCmd(g))
	return cmd
}

// applyResult is one line of `agora subagent apply --json`.
type applyResult struct {
	Name     string `json:"name"`
	Revision uint64 `json:"revision"`
	// Result is created, updated or unchanged.
	Result string `json:"result"`
	File   string `json:"file"`
}

func newSubagentApplyCmd(g *globals) *cobra.Command {
	var files []string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "apply -f FILE [-f FILE…]",
		Short: "Validate sub-agent definitions and store those that changed",
		Long: `apply reads each definition (YAML or JSON; - is stdin), validates it, and
stores it in the agora_subagents bucket under its name when it differs from the
stored one, so revisions change only with the definition. It prints each
definition's subagent_revision, the number a dispatch records: the sub-agent
bucket's sequence, shared by all definitions, so a new one's first revision
need not be 1. An invalid file stores nothing and names every field at
fault. A new dispatch uses the latest revision; one already accepted keeps the
revision it was accepted with.

A definition below the operator's sandbox floor is refused, naming the setting
that would allow it: AGORA_SANDBOX_FLOOR (the weakest mode: strict, standard
or off; default standard), AGORA_SANDBOX_ALLOW_PATHS (path prefixes read_paths
and write_paths may name) and AGORA_SANDBOX_ALLOW_HOSTS (destinations
network.allow may name), as this command's environment sets them. The
dispatcher and the workers enforce their own settings whatever apply checked.

apply also checks, on this host, what each definition's command needs that
its sandbox would not show (as agora subagent check does) and warns on
stderr with the read_paths line to add; it stores the definition anyway,
since the workers' host may differ from this one.`,
		Example: `  agora subagent apply -f planner.yaml`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(files) == 0 {
				return errors.New("-f FILE is required: a YAML or JSON sub-agent definition")
			}
			return runApply(cmd, g, files, asJSON)
		},
	}
	cmd.Flags().StringArrayVarP(&files, "file", "f", nil, "definition file, YAML or JSON (- reads stdin; repeatable)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON only: one object per definition")
	return cmd
}

func runApply(cmd *cobra.Command, g *globals, files []string, asJSON bool) error {
	type parsed struct {
		file string
		def  subagent.Definition
	}
	var defs []parsed
	var errs []error
	floor, err := envFloor()
	if err != nil {
		return err
	}
	for _, f := range files {
		d, err := readDefinition(cmd, f)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var fe *subagent.FloorError
		if errors.As(d.Sandbox.CheckFloor(floor), &fe) {
			errs = append(errs, fmt.Errorf("%s: sub-agent %s is below the operator's sandbox floor (as this environment sets it; dispatchers and workers enforce their own):\n  %s",
				f, d.Name, strings.Join(fe.Problems, "\n  ")))
			continue
		}
		defs = append(defs, parsed{f, d})
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for _, p := range defs {
		// A warning only: the workers' host may show what this one lacks.
		if rep := contain.CheckDefinition(p.def, os.Environ()); rep.Denied() || rep.Missing() {
			w := cmd.ErrOrStderr()
			fmt.Fprintf(w, "%s: warning: %s\n", p.file, checkSummary(rep))
			printCheck(w, rep, floor, true)
		}
	}
	c, ctx, done, err := g.call(cmd.Context(), cmd.ErrOrStderr())
	if err != nil {
		return err
	}
	defer done()
	out := cmd.OutOrStdout()
	jl := newJSONLines(out)
	for _, p := range defs {
		a, err := c.ApplySubagent(ctx, p.def)
		if errors.Is(err, client.ErrSubagentChanged) {
			err = errors.New("changed by someone else meanwhile; apply again")
		}
		if err != nil {
			return g.explain(fmt.Errorf("sub-agent %s (%s): %w", p.def.Name, p.file, err), "")
		}
		res := applyResult{Name: a.Name, Revision: a.Revision, Result: a.Result, File: p.file}
		if asJSON {
			if err := jl.write(res); err != nil {
				return err
			}
			continue
		}
		fmt.Fprintln(out, applyLine(res))
	}
	return nil
}

// applyLine words one applied definition. Its revision is the sub-agent
// bucket's sequence at the write (what a dispatch records as
// subagent_revision), shared by every definition, so a new definition's
// first revision is rarely 1: the line says "first version" rather than
// let the number read as a count.
func applyLine(res applyResult) string {
	if res.Result == "created" {
		return fmt.Sprintf("sub-agent %s created: first version, subagent_revision %d", res.Name, res.Revision)
	}
	return fmt.Sprintf("sub-agent %s %s (subagent_revision %d)", res.Name, res.Result, res.Revision)
}

// readDefinition reads, parses and validates the definition in file f
// (- is stdin), its command's relative paths resolved against the file's
// folder; the error names the file and every field at fault.
func readDefinition(cmd *cobra.Command, f string) (subagent.Definition, error) {
	var (
		d        subagent.Definition
		resolved []string
		err      error
	)
	if f == "-" {
		var b []byte
		if b, err = io.ReadAll(cmd.InOrStdin()); err != nil {
			return d, err
		}
		d, err = subagent.Parse(b)
	} else {
		d, resolved, err = subagent.ParseFile(f)
	}
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) {
		return d, errors.Unwrap(err) // "open FILE: …"
	}
	for _, r := range resolved {
		fmt.Fprintf(cmd.ErrOrStderr(), "%s: command path %s (relative to the definition file)\n", f, r)
	}
	if err != nil {
		msg := strings.TrimPrefix(err.Error(), "subagent: ")
		return d, fmt.Errorf("%s: invalid sub-agent definition:\n  %s", f, strings.ReplaceAll(msg, "\n", "\n  "))
	}
	return d, nil
}

func newSubagentCheckCmd(g *globals) *cobra.Command {
	var files []string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "check NAME | check -f FILE [-f FILE…]",
		Short: "Show what a sub-agent's sandbox would deny its command, and the read_paths to add",
		Long: `check resolves what a run of the sub-agent executes — its command on the
sub-agent's PATH (for runtime claude-code, codex or gemini-cli, its CLI:
AGORA_WORKER_CLAUDE_BIN, AGORA_WORKER_CODEX_BIN or AGORA_WORKER_GEMINI_BIN,
else claude, codex or gemini on PATH), each symbolic link on the way,
the interpreter a script's #! line names (through /usr/bin/env to PATH), what a
pyenv, rbenv or asdf shim runs, an ELF program's loader and the libraries its
RUNPATH finds — and prints, for each path, whether the run's root shows it
(ok), does not (denied) or this host lacks it (missing), then the read_paths
line that shows every denied path (docs/sandbox.md, "Checking a definition").

NAME checks the stored definition; -f FILE checks a file without storing it.
The check reads this host's filesystem with this shell's PATH, which stands
for the worker's (a sub-agent inherits the worker's PATH): a worker on another
host, or with another PATH, may resolve the command differently. It runs
nothing.

Exit codes: 0 the run sees every path its command needs (a missing one is
reported, not counted), 6 some path would be denied, 1 an error. --json prints
one object per definition: name, runtime, mode, path (the PATH used), steps
(path, why, status, suggest), add_read_paths, read_paths (the list to write)
and notes.`,
		Example: `  agora subagent check coder
  agora subagent check -f coder.yaml --json`,
		Args: func(cmd *cobra.Command, a []string) error {
			if len(files) > 0 {
				if len(a) > 0 {
					return fmt.Errorf("give NAME or -f FILE, not both (%q and -f %s)", a[0], files[0])
				}
				return nil
			}
			return args(0, arg{"NAME", "the sub-agent to check, or -f FILE", "agora subagent check coder"})(cmd, a)
		},
		RunE: func(cmd *cobra.Command, a []string) error {
			var defs []subagent.Definition
			if len(files) > 0 {
				var errs []error
				for _, f := range files {
					d, err := readDefinition(cmd, f)
					if err != nil {
						errs = append(errs, err)
						continue
					}
					defs = append(defs, d)
				}
				if err := errors.Join(errs...); err != nil {
					return err
				}
			} else {
				d, err := storedDefinition(cmd, g, a[0])
				if err != nil {
					return err
				}
				defs = append(defs, d)
			}
			floor, _ := envFloor() // only to say whether the suggestion passes it
			out := cmd.OutOrStdout()
			jl := newJSONLines(out)
			denied := false
			for i, d := range defs {
				rep := contain.CheckDefinition(d, os.Environ())
				denied = denied || rep.Denied()
				if asJSON {
					if err := jl.write(rep); err != nil {
						return err
					}
					continue
				}
				if i > 0 {
					fmt.Fprintln(out)
				}
				fmt.Fprintf(out, "%s (runtime %s, sandbox %s):\n", rep.Name, rep.Runtime, rep.Mode)
				printCheck(out, rep, floor, false)
			}
			if denied {
				return exitWith(exitDenied)
			}
			return nil
		},
	}
	cmd.Flags().StringArrayVarP(&files, "file", "f", nil, "definition file to check without storing it, YAML or JSON (- reads stdin; repeatable)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON only: one object per definition")
	return cmd
}

// storedDefinition reads sub-agent name's definition from the
// agora_subagents bucket.
func storedDefinition(cmd *cobra.Command, g *globals, name string) (subagent.Definition, error) {
	var d subagent.Definition
	if !subagent.ValidName(name) {
		return d, fmt.Errorf("%q is not a sub-agent name: 1-64 letters, digits, '-' or '_'", name)
	}
	c, ctx, done, err := g.call(cmd.Context(), cmd.ErrOrStderr())
	if err != nil {
		return d, err
	}
	defer done()
	sa, err := c.Subagent(ctx, name)
	if errors.Is(err, client.ErrNotFound) {
		return d, errNotFound("sub-agent", name, fmt.Sprintf("`%s subagent list` lists them; -f FILE checks a file", g.cli(cmd)))
	}
	if err != nil {
		return d, g.explain(err, "")
	}
	return sa.Definition, nil
}

// checkSummary is the one-line gist of a check that found something.
func checkSummary(rep contain.CheckReport) string {
	var denied, missing int
	for _, s := range rep.Steps {
		switch s.Status {
		case contain.CheckDenied:
			denied++
		case contain.CheckMissing:
			missing++
		}
	}
	var parts []string
	if denied > 0 {
		parts = append(parts, fmt.Sprintf("its sandbox would deny %d path(s) its command needs", denied))
	}
	if missing > 0 {
		parts = append(parts, fmt.Sprintf("%d path(s) it needs do not exist here", missing))
	}
	return fmt.Sprintf("sub-agent %s: %s (checked on this host; the workers' host may differ: agora subagent check)", rep.Name, strings.Join(parts, ", and "))
}

// printCheck writes a check's steps (only those not ok when problems),
// its notes, and the read_paths line to add, with whether the operator's
// floor as this environment sets it allows that line.
func printCheck(w io.Writer, rep contain.CheckReport, floor subagent.Floor, problems bool) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, s := range rep.Steps {
		if !problems || s.Status != contain.CheckOK {
			fmt.Fprintf(tw, "  %s\t%s\t%s\n", s.Status, s.Path, s.Why)
		}
	}
	_ = tw.Flush()
	for _, n := range rep.Notes {
		fmt.Fprintf(w, "  note: %s\n", n)
	}
	if len(rep.Add) > 0 {
		quoted := make([]string, len(rep.ReadPaths))
		for i, p := range rep.ReadPaths {
			quoted[i] = yamlScalar(p)
		}
		fmt.Fprintf(w, "add to the definition:\n  sandbox:\n    read_paths: [%s]\n", strings.Join(quoted, ", "))
		sb := subagent.Sandbox{ReadPaths: rep.ReadPaths}
		var fe *subagent.FloorError
		if errors.As(sb.CheckFloor(floor), &fe) {
			fmt.Fprintf(w, "  but the operator's floor (as this environment sets it) refuses it: %s\n", strings.Join(fe.Problems, "; "))
		}
	} else if !problems && rep.Missing() {
		fmt.Fprintln(w, "nothing would be denied, but what is missing here is not checked: is the workers' host another one?")
	} else if !problems {
		fmt.Fprintln(w, "the run sees every path its command needs.")
	}
	if !problems {
		fmt.Fprintf(w, "checked on this host with PATH=%s; a worker on another host, or with another PATH, may resolve the command differently.\n", rep.PATH)
	}
}

// yamlScalar writes a path as a YAML flow scalar, quoted when it must be.
func yamlScalar(s string) string {
	for _, r := range s {
		if !(r == '/' || r == '.' || r == '_' || r == '-' || r == '+' || r == '@' || r == '~' ||
			'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9') {
			b, _ := json.Marshal(s)
			return string(b)
		}
	}
	return s
}

// floorConfig is the operator's sandbox floor as the environment sets
// it: the variables the dispatcher and the worker read (docs/sandbox.md,
// "The operator's floor").
type floorConfig struct {
	Mode  string   `envconfig:"SANDBOX_FLOOR" default:"standard"`
	Paths []string `envconfig:"SANDBOX_ALLOW_PATHS"`
	Hosts []string `envconfig:"SANDBOX_ALLOW_HOSTS"`
}

// envFloor reads the operator's sandbox floor from the environment; an
// invalid setting is an error naming it.
func envFloor() (subagent.Floor, error) {
	var c floorConfig
	if err := config.Load(&c); err != nil {
		return subagent.Floor{}, err
	}
	f := subagent.Floor{Mode: c.Mode, Paths: c.Paths, Hosts: c.Hosts}
	if err := f.Validate(); err != nil {
		return subagent.Floor{}, fmt.Errorf("config: %w", err)
	}
	return f, nil
}

// listedSubagent is one line of `agora subagent list --json`.
type listedSubagent struct {
	Name       string              `json:"name"`
	Revision   uint64              `json:"revision"`
	UpdatedAt  time.Time           `json:"updated_at"`
	Definition subagent.Definition `json:"definition"`
}

func newSubagentListCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the registered sub-agents",
		Long: `list prints every registered sub-agent with its runtime, revision and
description. With --json stdout carries one object per sub-agent: name,
revision, updated_at and the definition.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, ctx, done, err := g.call(cmd.Context(), cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			defer done()
			all, err := c.Subagents(ctx)
			var ue *client.UndecodableError
			if errors.As(err, &ue) {
				for _, n := range ue.Names {
					fmt.Fprintf(cmd.ErrOrStderr(), "sub-agent %s: stored definition does not decode\n", n)
				}
			} else if err != nil {
				return g.explain(err, "")
			}
			var list []listedSubagent
			for _, sa := range all {
				list = append(list, listedSubagent{Name: sa.Name, Revision: sa.Revision, UpdatedAt: sa.UpdatedAt, Definition: sa.Definition})
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return writeJSONLines(out, list, same)
			}
			if len(list) == 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "no sub-agents are registered (%s subagent apply -f FILE)\n", g.cli(cmd))
				return nil
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tRUNTIME\tREVISION\tUPDATED\tDESCRIPTION")
			for _, s := range list {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", s.Name, s.Definition.Runtime, s.Revision, when(&s.UpdatedAt), clip.Line(s.Definition.Description, 70))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON only: one object per sub-agent")
	return cmd
}

func newSubagentGetCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "get NAME",
		Short: "Print a sub-agent's definition as YAML (or JSON)",
		Long: `get prints the stored definition of NAME as YAML, headed by a comment with its
revision; with --json, as one JSON object. Either can be edited and applied
again with agora subagent apply -f.`,
		Args: args(0, arg{"NAME", "the sub-agent to show (`agora subagent list` lists them)", "agora subagent get demo"}),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if !subagent.ValidName(name) {
				return fmt.Errorf("%q is not a sub-agent name: 1-64 letters, digits, '-' or '_'", name)
			}
			c, ctx, done, err := g.call(cmd.Context(), cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			defer done()
			sa, err := c.Subagent(ctx, name)
			if errors.Is(err, client.ErrNotFound) {
				return errNotFound("sub-agent", name, fmt.Sprintf("`%s subagent list` lists them", g.cli(cmd)))
			}
			if err != nil {
				return g.explain(err, "")
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return newJSONLines(out).write(sa.Definition)
			}
			b, err := json.Marshal(sa.Definition)
			if err != nil {
				return fmt.Errorf("sub-agent %s: %w", name, err)
			}
			y, err := jsonToYAML(b)
			if err != nil {
				return fmt.Errorf("sub-agent %s: %w", name, err)
			}
			fmt.Fprintf(out, "# sub-agent %s, revision %d, stored %s\n%s", name, sa.Revision, sa.UpdatedAt.UTC().Format(time.RFC3339), y)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON only: the definition")
	return cmd
}

// jsonToYAML re-encodes a JSON document as YAML, keeping the order of
// object members (the order of the definition's fields).
func jsonToYAML(b []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	n, err := yamlNode(dec)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(&yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{n}}); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func yamlNode(dec *json.Decoder) (*yaml.Node, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	scalar := func(tag, v string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Tag: tag, Value: v} }
	switch t := tok.(type) {
	case json.Delim:
		n := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
		if t == '[' {
			n = &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		}
		for dec.More() {
			if n.Kind == yaml.MappingNode {
				k, err := dec.Token()
				if err != nil {
					return nil, err
				}
				n.Content = append(n.Content, scalar("!!str", fmt.Sprint(k)))
			}
			v, err := yamlNode(dec)
			if err != nil {
				return nil, err
			}
			n.Content = append(n.Content, v)
		}
		if _, err := dec.Token(); err != nil { // the closing delimiter
			return nil, err
		}
		return n, nil
	case string:
		n := scalar("!!str", t)
		if strings.Contains(t, "\n") {
			n.Style = yaml.LiteralStyle
		}
		return n, nil
	case json.Number:
		if _, err := t.Int64(); err == nil {
			return scalar("!!int", t.String()), nil
		}
		return scalar("!!float", t.String()), nil
	case bool:
		return scalar("!!bool", fmt.Sprint(t)), nil
	case nil:
		return scalar("!!null", "null"), nil
	}
	return nil, fmt.Errorf("unexpected JSON token %v", tok)
}
