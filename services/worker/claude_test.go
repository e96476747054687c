package worker_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/internal/runtimes"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/services/worker"
)

// standInClaude replaces the claude CLI, which needs a network and keys.
// It records its argv ($0 first, NUL-separated), its environment, its
// working directory and the helper skill when present into $CLAUDE_REC
// (a directory outside the workspace), then asks a question through the
// sentinel as a real claude following the skill would.
const standInClaude = `#!/bin/sh
rec="$CLAUDE_REC"
mkdir -p "$rec" || exit 90
printf '%s\000' "$0" > "$rec/argv"
for a in "$@"; do printf '%s\000' "$a" >> "$rec/argv"; done
env > "$rec/env"
pwd > "$rec/pwd"
if [ -f .claude/skills/agora-needs-input/SKILL.md ]; then
	cp .claude/skills/agora-needs-input/SKILL.md "$rec/skill.md"
fi
if [ -f .agora/mcp.json ]; then
	cp .agora/mcp.json "$rec/mcp.json"
fi
printf '%s' '{"question":"Ship it?","options":["yes","no"],"kind":"approval"}' > "$AGORA_NEEDS_INPUT_FILE"
`

// claudeRun is what the stand-in recorded for one dispatch.
type claudeRun struct {
	argv  []string
	env   map[string]string
	skill *string // nil when no skill file existed
	// mcpConfig is the --mcp-config argument (taken out of argv), and
	// mcpJSON the file it named; both empty without one.
	mcpConfig, mcpJSON string
}

func readClaudeRun(t *testing.T, rec string) claudeRun {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(rec, "argv"))
	if err != nil {
		t.Fatalf("the stand-in claude did not run: %v", err)
	}
	var r claudeRun
	r.argv = strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
	if i := slices.Index(r.argv, "--mcp-config"); i > 0 && i+1 < len(r.argv) {
		r.mcpConfig = r.argv[i+1]
		r.argv = slices.Delete(r.argv, i, i+2)
		if b, err := os.ReadFile(filepath.Join(rec, "mcp.json")); err == nil {
			r.mcpJSON = string(b)
		}
	}
	r.env = parseEnvDump(string(must(os.ReadFile(filepath.Join(rec, "env")))))
	if s, err := os.ReadFile(filepath.Join(rec, "skill.md")); err == nil {
		str := string(s)
		r.skill = &str
	} else if !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return r
}

// writeExecutable writes an executable file and returns its path.
func writeExecutable(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestClaudeCodeRuntime runs the claude-code adapter against a stand-in
// claude found on the sub-agent's PATH.
func TestClaudeCodeRuntime(t *testing.T) {
	bin := t.TempDir()
	claude := writeExecutable(t, bin, "claude", standInClaude)
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))

	h := newHarness(t, provision.Config{})
	cfg := h.workerConfig()
	cfg.Concurrency = 5
	h.startWorker(cfg, worker.Deps{})

	const resumeTmpl = "Task: {{.Input.task}}\n{{if .Answer}}Operator answered: {{.Answer}}\n{{end}}{{if .PartialState}}Saved state:\n{{.PartialState}}{{end}}"
	cases := []struct {
		name     string
		def      subagent.Definition
		input    string
		wantArgs []string // after argv[0]
		// wantSkill is "" for the helper skill naming this workspace's
		// sentinel, else the exact content expected.
		wantSkill string
	}{
		{
			name:     "model and default permission",
			def:      subagent.Definition{Model: "M", Prompt: "Plan {{.Input.task}}."},
			input:    `{"task":"the migration"}`,
			wantArgs: []string{"--print", "--output-format", "json", "--model", "M", "--dangerously-skip-permissions", "Plan the migration."},
		},
		{
			name:     "strict permission",
			def:      subagent.Definition{Model: "M", Permission: subagent.PermissionStrict, Prompt: "Plan {{.Input.task}}."},
			input:    `{"task":"x"}`,
			wantArgs: []string{"--print", "--output-format", "json", "--model", "M", "Plan x."},
		},
		{
			name:     "no model",
			def:      subagent.Definition{Prompt: "Plan {{.Input.task}}."},
			input:    `{"task":"x"}`,
			wantArgs: []string{"--print", "--output-format", "json", "--dangerously-skip-permissions", "Plan x."},
		},
		{
			name:  "resume renders answer and partial state",
			def:   subagent.Definition{Model: "M", Prompt: resumeTmpl},
			input: `{"task":"rename the loader","answer":{"answer":"loadConfig","answered_by":"alice@example.com"},"partial_state":{"considered":["parseConfig","loadConfig"],"next":1e400}}`,
			wantArgs: []string{"--print", "--output-format", "json", "--model", "M", "--dangerously-skip-permissions",
				"Task: rename the loader\nOperator answered: loadConfig\nSaved state:\n{\n  \"considered\": [\n    \"parseConfig\",\n    \"loadConfig\"\n  ],\n  \"next\": 1e400\n}"},
		},
		{
			name:      "definition file overrides the helper skill",
			def:       subagent.Definition{Prompt: "p", Files: map[string]string{runtimes.SkillPath: "house rules win\n", "notes/a.md": "a"}},
			input:     `{}`,
			wantArgs:  []string{"--print", "--output-format", "json", "--dangerously-skip-permissions", "p"},
			wantSkill: "house rules win\n",
		},
	}
	recs := map[string]string{}
	ids := map[string]string{}
	for i, c := range cases {
		name := "claude-" + string(rune('a'+i))
		def := c.def
		def.Name, def.Runtime = name, subagent.RuntimeClaudeCode
		// The stand-in records its run under the test's temp directory.
		def.Sandbox.WritePaths = []string{os.TempDir()}
		h.define(def)
		recs[c.name] = filepath.Join(t.TempDir(), "rec")
		ids[c.name] = h.dispatch(lifecycle.Request{Subagent: name, Input: json.RawMessage(c.input), Env: map[string]string{"CLAUDE_REC": recs[c.name]}})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			id := ids[c.name]
			ni := eventAs[*lifecycle.NeedsInput](t, h.terminal(id)) // from the stand-in's sentinel
			if ni.Question != "Ship it?" || ni.Kind != "approval" {
				t.Errorf("needs_input = %+v", ni)
			}
			run := readClaudeRun(t, recs[c.name])
			if run.argv[0] != claude {
				t.Errorf("argv[0] = %q, want the claude found on PATH, %q", run.argv[0], claude)
			}
			if got := run.argv[1:]; !slices.Equal(got, c.wantArgs) {
				t.Errorf("argv[1:] =\n  %q\nwant\n  %q", got, c.wantArgs)
			}
			ws := strings.TrimSpace(string(must(os.ReadFile(filepath.Join(recs[c.name], "pwd")))))
			h.assertWorkspace(ws, id, 1)
			sentinelPath := filepath.Join(ws, ".agora", "needs_input.json")
			if got := run.env["AGORA_NEEDS_INPUT_FILE"]; got != sentinelPath {
				t.Errorf("AGORA_NEEDS_INPUT_FILE = %q, want %q", got, sentinelPath)
			}
			if got := run.env["AGORA_WORKSPACE"]; got != ws {
				t.Errorf("claude ran in %q, but AGORA_WORKSPACE = %q", ws, got)
			}
			// The require_input MCP server: the worker's own binary.
			if run.mcpConfig != filepath.Join(ws, runtimes.MCPConfigPath) || !strings.Contains(run.mcpJSON, `"AGORA_SUBAGENT_MCP":"serve"`) ||
				!strings.Contains(run.mcpJSON, string(must(json.Marshal(must(os.Executable()))))) {
				t.Errorf("--mcp-config %q with %s, want %s starting this binary", run.mcpConfig, run.mcpJSON, runtimes.MCPConfigPath)
			}
			if run.skill == nil {
				t.Fatalf("no %s in the workspace when claude ran", runtimes.SkillPath)
			}
			if c.wantSkill != "" {
				if *run.skill != c.wantSkill {
					t.Errorf("skill = %q, want the definition's file %q", *run.skill, c.wantSkill)
				}
				return
			}
			if !strings.Contains(*run.skill, sentinelPath) {
				t.Errorf("skill does not name the absolute sentinel path %s", sentinelPath)
			}
			if *run.skill != runtimes.Skill(sentinelPath) {
				t.Errorf("skill is not runtimes.Skill(%q)", sentinelPath)
			}
		})
	}
}

// TestClaudeCodeBinAndHelperOptOut: Config.Runtimes' claude-code entry names the executable
// by absolute path; DisableNeedsInputHelper "true" writes no skill.
func TestClaudeCodeBinAndHelperOptOut(t *testing.T) {
	cases := []struct {
		name      string
		disable   string
		wantSkill bool
	}{
		{name: "helper on by default", disable: "", wantSkill: true},
		{name: "helper explicitly on", disable: "false", wantSkill: true},
		{name: "helper disabled", disable: "true", wantSkill: false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			claude := writeExecutable(t, t.TempDir(), "my-claude", standInClaude)
			h := newHarness(t, provision.Config{})
			cfg := h.workerConfig()
			cfg.Runtimes.Bins = map[string]string{subagent.RuntimeClaudeCode: claude}
			cfg.DisableNeedsInputHelper = c.disable
			h.startWorker(cfg, worker.Deps{})
			h.define(subagent.Definition{Name: "coder", Runtime: subagent.RuntimeClaudeCode, Prompt: "Fix {{.Input.bug}}",
				Sandbox: subagent.Sandbox{WritePaths: []string{os.TempDir()}}})
			rec := filepath.Join(t.TempDir(), "rec")
			id := h.dispatch(lifecycle.Request{Subagent: "coder", Input: json.RawMessage(`{"bug":"#42"}`), Env: map[string]string{"CLAUDE_REC": rec}})
			if k := h.terminal(id).Data.(lifecycle.Lifecycle).LifecycleKind(); k != lifecycle.KindNeedsInput {
				t.Fatalf("terminal = %s, want needs_input", k)
			}
			run := readClaudeRun(t, rec)
			want := []string{claude, "--print", "--output-format", "json", "--dangerously-skip-permissions", "Fix #42"}
			if !slices.Equal(run.argv, want) {
				t.Errorf("argv = %q, want %q", run.argv, want)
			}
			if (run.skill != nil) != c.wantSkill {
				t.Errorf("skill written = %v, want %v", run.skill != nil, c.wantSkill)
			}
			if (run.mcpConfig != "") != c.wantSkill {
				t.Errorf("--mcp-config %q, want one only with the helper", run.mcpConfig)
			}
		})
	}
}

// TestDisableNeedsInputHelperIsExact: only exactly "true" disables the
// helper; any other spelling is a configuration error, not a silent "on".
func TestDisableNeedsInputHelperIsExact(t *testing.T) {
	for _, v := range []string{"", "true", "false"} {
		if err := (worker.Config{DisableNeedsInputHelper: v}).Validate(); err != nil {
			t.Errorf("Validate(%q) = %v, want nil", v, err)
		}
	}
	for _, v := range []string{"TRUE", "True", "1", "yes", " true", "true "} {
		err := (worker.Config{DisableNeedsInputHelper: v}).Validate()
		if err == nil || !strings.Contains(err.Error(), "AGORA_DISABLE_NEEDS_INPUT_HELPER") {
			t.Errorf("Validate(%q) = %v, want an error naming AGORA_DISABLE_NEEDS_INPUT_HELPER", v, err)
		}
		if _, err := worker.New(worker.Config{DisableNeedsInputHelper: v}, worker.Deps{}); err == nil {
			t.Errorf("New accepted DisableNeedsInputHelper=%q", v)
		}
	}
}
