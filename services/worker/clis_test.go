package worker_test

import (
	"encoding/json"
	"errors"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/internal/runtimes"
	"github.com/agora-dispatch/agora/internal/subagentmcp"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/runtime"
	"github.com/agora-dispatch/agora/pkg/sentinel"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/services/worker"
)

// The stand-ins replace the codex and gemini CLIs, which need a network
// and keys. Each records its argv ($0 first, NUL-separated), environment
// and working directory into $CLI_REC (a directory outside the
// workspace), takes its prompt from where the real CLI takes it, reads its
// stdin to the end as the real one does when stdin is no terminal, copies
// the instruction file and the MCP configuration from where the real CLI
// reads them, then asks a question through the sentinel as a model
// following the instructions would.
const (
	standInRecord = `#!/bin/sh
rec="$CLI_REC"
mkdir -p "$rec" || exit 90
printf '%s\000' "$0" > "$rec/argv"
for a in "$@"; do printf '%s\000' "$a" >> "$rec/argv"; done
env > "$rec/env"
pwd > "$rec/pwd"
if [ -t 0 ]; then echo terminal > "$rec/stdin-tty"; fi
`
	standInAsk = `printf '%s' '{"question":"Ship it?","options":["yes","no"],"kind":"approval"}' > "$AGORA_NEEDS_INPUT_FILE"
`
	// codex exec [OPTIONS] [--] PROMPT; the MCP configuration is in the
	// -c overrides of argv. Given a prompt and a stdin that is no
	// terminal, codex exec reads stdin to its end as more context. It
	// reads AGENTS.md in its working directory (no Git root above it).
	standInCodex = standInRecord + `[ "$1" = exec ] || { echo "stand-in codex: want codex exec" >&2; exit 91; }
while [ $# -gt 0 ] && [ "$1" != -- ]; do shift; done
[ $# -eq 2 ] || { echo "stand-in codex: want one prompt after --" >&2; exit 92; }
printf '%s' "$2" > "$rec/prompt"
cat > "$rec/stdin"
if [ -f AGENTS.md ]; then cp AGENTS.md "$rec/instructions"; fi
` + standInAsk
	// gemini [OPTIONS] --prompt=PROMPT runs headless; stdin that is no
	// terminal is read (to its end) and put before the prompt. It reads
	// GEMINI.md in its workspace, and the workspace settings
	// .gemini/settings.json only when the workspace is trusted (a new
	// home trusts none, short of GEMINI_CLI_TRUST_WORKSPACE=true).
	standInGemini = standInRecord + `found=
for a in "$@"; do
	case "$a" in --prompt=*) prompt=${a#--prompt=}; found=1 ;; esac
done
[ -n "$found" ] || { echo "stand-in gemini: want --prompt=PROMPT" >&2; exit 92; }
printf '%s' "$prompt" > "$rec/prompt"
cat > "$rec/stdin"
if [ -f GEMINI.md ]; then cp GEMINI.md "$rec/instructions"; fi
if [ "$GEMINI_CLI_TRUST_WORKSPACE" = true ] && [ -f .gemini/settings.json ]; then cp .gemini/settings.json "$rec/settings.json"; fi
` + standInAsk
)

// cliRun is what a stand-in recorded for one dispatch.
type cliRun struct {
	argv          []string
	env           map[string]string
	ws            string
	prompt, stdin string
	stdinTTY      bool
	instructions  *string // nil when there was no instruction file
	// mcp is the agora MCP server the CLI was configured to start: its
	// command and environment; found reports whether there was one.
	mcpCommand string
	mcpEnv     map[string]string
	mcpTrust   bool
	found      bool
}

// cliSpec is what differs between the CLIs.
type cliSpec struct {
	runtime, bin, script string
	instructions         string // the instruction file's path in the workspace
	// trust: the MCP server is configured as trusted (gemini-cli asks
	// to confirm a tool call otherwise, which headless refuses; codex exec
	// asks for no approval).
	trust bool
	// mcp takes the MCP configuration out of the recorded run (out of
	// argv, for codex's -c overrides).
	mcp func(t *testing.T, rec string, r *cliRun)
}

var (
	codexSpec = cliSpec{runtime: subagent.RuntimeCodex, bin: "codex", script: standInCodex, instructions: runtimes.CodexInstructionsPath,
		mcp: func(t *testing.T, _ string, r *cliRun) {
			const server = "mcp_servers.agora."
			for i := 0; i+1 < len(r.argv); {
				k, v, ok := strings.Cut(r.argv[i+1], "=")
				if r.argv[i] != "-c" || !ok || !strings.HasPrefix(k, server) {
					i++
					continue
				}
				var s string // the TOML strings these are are JSON strings
				if err := json.Unmarshal([]byte(v), &s); err != nil {
					t.Fatalf("-c %s: %v", r.argv[i+1], err)
				}
				switch name, _ := strings.CutPrefix(k, server); {
				case name == "command":
					r.mcpCommand, r.found = s, true
				case strings.HasPrefix(name, "env."):
					r.mcpEnv[strings.TrimPrefix(name, "env.")] = s
				default:
					t.Errorf("unexpected override -c %s", r.argv[i+1])
				}
				r.argv = slices.Delete(r.argv, i, i+2)
			}
		}}
	geminiSpec = cliSpec{runtime: subagent.RuntimeGeminiCLI, bin: "gemini", script: standInGemini, instructions: runtimes.GeminiInstructionsPath, trust: true,
		mcp: func(t *testing.T, rec string, r *cliRun) {
			b, err := os.ReadFile(filepath.Join(rec, "settings.json"))
			if errors.Is(err, os.ErrNotExist) {
				return
			}
			var settings struct {
				MCPServers map[string]struct {
					Command string            `json:"command"`
					Env     map[string]string `json:"env"`
					Trust   bool              `json:"trust"`
				} `json:"mcpServers"`
			}
			if err := json.Unmarshal(must(b, err), &settings); err != nil {
				t.Fatalf("%s: %v: %s", runtimes.GeminiSettingsPath, err, b)
			}
			if s, ok := settings.MCPServers["agora"]; ok {
				r.mcpCommand, r.mcpEnv, r.mcpTrust, r.found = s.Command, s.Env, s.Trust, true
			}
		}}
)

func readCLIRun(t *testing.T, spec cliSpec, rec string) cliRun {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(rec, "argv"))
	if err != nil {
		t.Fatalf("the stand-in %s did not run: %v", spec.bin, err)
	}
	read := func(name string) string { return string(must(os.ReadFile(filepath.Join(rec, name)))) }
	r := cliRun{argv: strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00"), mcpEnv: map[string]string{},
		env: parseEnvDump(read("env")), ws: strings.TrimSpace(read("pwd")), prompt: read("prompt"), stdin: read("stdin")}
	_, err = os.Stat(filepath.Join(rec, "stdin-tty"))
	r.stdinTTY = err == nil
	if s, err := os.ReadFile(filepath.Join(rec, "instructions")); err == nil {
		str := string(s)
		r.instructions = &str
	} else if !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	spec.mcp(t, rec, &r)
	return r
}

// cliCase is one dispatch of a CLI runtime.
type cliCase struct {
	name     string
	def      subagent.Definition
	input    string
	wantArgs []string // after argv[0], without the MCP configuration
	// wantPrompt is the prompt the CLI received; wantInstructions is ""
	// for the convention naming this workspace's sentinel, else the exact
	// content expected.
	wantPrompt, wantInstructions string
}

const resumeTmpl = "Task: {{.Input.task}}\n{{if .Answer}}Operator answered: {{.Answer}}\n{{end}}{{if .PartialState}}Saved state:\n{{.PartialState}}{{end}}"

const (
	resumeInput  = `{"task":"rename the loader","answer":{"answer":"loadConfig","answered_by":"alice@example.com"},"partial_state":{"considered":["parseConfig","loadConfig"],"next":1e400}}`
	resumePrompt = "Task: rename the loader\nOperator answered: loadConfig\nSaved state:\n{\n  \"considered\": [\n    \"parseConfig\",\n    \"loadConfig\"\n  ],\n  \"next\": 1e400\n}"
)

// TestCodexCLIRuntime runs the codex runtime against a stand-in codex
// found on the sub-agent's PATH.
func TestCodexCLIRuntime(t *testing.T) {
	bypass := "--dangerously-bypass-approvals-and-sandbox"
	testCLIRuntime(t, codexSpec, []cliCase{
		{name: "model and default permission", def: subagent.Definition{Model: "M", Prompt: "Plan {{.Input.task}}."}, input: `{"task":"the migration"}`,
			wantArgs: []string{"exec", "--skip-git-repo-check", "--model", "M", bypass, "--", "Plan the migration."}, wantPrompt: "Plan the migration."},
		{name: "strict permission keeps codex's sandbox", def: subagent.Definition{Model: "M", Permission: subagent.PermissionStrict, Prompt: "Plan {{.Input.task}}."}, input: `{"task":"x"}`,
			wantArgs: []string{"exec", "--skip-git-repo-check", "--model", "M", "--sandbox", "workspace-write", "--", "Plan x."}, wantPrompt: "Plan x."},
		{name: "no model, a prompt that looks like a flag", def: subagent.Definition{Prompt: "--{{.Input.task}}"}, input: `{"task":"help"}`,
			wantArgs: []string{"exec", "--skip-git-repo-check", bypass, "--", "--help"}, wantPrompt: "--help"},
		{name: "resume renders answer and partial state", def: subagent.Definition{Prompt: resumeTmpl}, input: resumeInput,
			wantArgs: []string{"exec", "--skip-git-repo-check", bypass, "--", resumePrompt}, wantPrompt: resumePrompt},
		{name: "definition file overrides AGENTS.md", def: subagent.Definition{Prompt: "p", Files: map[string]string{"AGENTS.md": "house rules win\n"}}, input: `{}`,
			wantArgs: []string{"exec", "--skip-git-repo-check", bypass, "--", "p"}, wantPrompt: "p", wantInstructions: "house rules win\n"},
	})
}

// TestGeminiCLIRuntime runs the gemini-cli runtime against a stand-in
// gemini that env(1) finds on the sub-agent's PATH.
func TestGeminiCLIRuntime(t *testing.T) {
	head := []string{"--output-format", "json"}
	args := func(a ...string) []string { return slices.Concat(head, a) }
	testCLIRuntime(t, geminiSpec, []cliCase{
		{name: "model and default permission", def: subagent.Definition{Model: "M", Prompt: "Plan {{.Input.task}}."}, input: `{"task":"the migration"}`,
			wantArgs: args("--model", "M", "--approval-mode", "yolo", "--prompt=Plan the migration."), wantPrompt: "Plan the migration."},
		{name: "strict permission keeps gemini's approvals", def: subagent.Definition{Model: "M", Permission: subagent.PermissionStrict, Prompt: "Plan {{.Input.task}}."}, input: `{"task":"x"}`,
			wantArgs: args("--model", "M", "--approval-mode", "default", "--prompt=Plan x."), wantPrompt: "Plan x."},
		{name: "no model, a prompt that looks like a flag", def: subagent.Definition{Prompt: "--{{.Input.task}}"}, input: `{"task":"help"}`,
			wantArgs: args("--approval-mode", "yolo", "--prompt=--help"), wantPrompt: "--help"},
		{name: "resume renders answer and partial state", def: subagent.Definition{Prompt: resumeTmpl}, input: resumeInput,
			wantArgs: args("--approval-mode", "yolo", "--prompt="+resumePrompt), wantPrompt: resumePrompt},
		{name: "definition file overrides GEMINI.md", def: subagent.Definition{Prompt: "p", Files: map[string]string{"GEMINI.md": "house rules win\n"}}, input: `{}`,
			wantArgs: args("--approval-mode", "yolo", "--prompt=p"), wantPrompt: "p", wantInstructions: "house rules win\n"},
	})
}

func testCLIRuntime(t *testing.T, spec cliSpec, cases []cliCase) {
	bin := t.TempDir()
	cli := writeExecutable(t, bin, spec.bin, spec.script)
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))

	h := newHarness(t, provision.Config{})
	cfg := h.workerConfig()
	cfg.Concurrency = 5
	h.startWorker(cfg, worker.Deps{})

	recs := map[string]string{}
	ids := map[string]string{}
	for i, c := range cases {
		def := c.def
		def.Name, def.Runtime = spec.bin+"-"+string(rune('a'+i)), spec.runtime
		// The stand-in records its run under the test's temp directory.
		def.Sandbox.WritePaths = []string{os.TempDir()}
		h.define(def)
		recs[c.name] = filepath.Join(t.TempDir(), "rec")
		ids[c.name] = h.dispatch(lifecycle.Request{Subagent: def.Name, Input: json.RawMessage(c.input), Env: map[string]string{"CLI_REC": recs[c.name]}})
	}
	self := must(os.Executable())
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			id := ids[c.name]
			ni := eventAs[*lifecycle.NeedsInput](t, h.terminal(id)) // from the stand-in's sentinel
			if ni.Question != "Ship it?" || ni.Kind != "approval" {
				t.Errorf("needs_input = %+v", ni)
			}
			run := readCLIRun(t, spec, recs[c.name])
			if run.argv[0] != cli {
				t.Errorf("argv[0] = %q, want the %s found on PATH, %q", run.argv[0], spec.bin, cli)
			}
			if got := run.argv[1:]; !slices.Equal(got, c.wantArgs) {
				t.Errorf("argv[1:] =\n  %q\nwant\n  %q", got, c.wantArgs)
			}
			if run.prompt != c.wantPrompt {
				t.Errorf("prompt %q, want %q", run.prompt, c.wantPrompt)
			}
			// The run's stdin is /dev/null: no terminal, at its end at once.
			if run.stdinTTY || run.stdin != "" {
				t.Errorf("stdin: a terminal %v, read %q; want /dev/null", run.stdinTTY, run.stdin)
			}
			h.assertWorkspace(run.ws, id, 1)
			sentinelPath := sentinel.Path(run.ws)
			if got := run.env["AGORA_NEEDS_INPUT_FILE"]; got != sentinelPath {
				t.Errorf("AGORA_NEEDS_INPUT_FILE = %q, want %q", got, sentinelPath)
			}
			// The require_input MCP server: the worker's own binary, given
			// the whole environment it needs.
			wantEnv := map[string]string{"AGORA_SUBAGENT_MCP": "serve", "AGORA_WORKSPACE": run.ws, "AGORA_NEEDS_INPUT_FILE": sentinelPath}
			if !run.found || run.mcpCommand != self || !maps.Equal(run.mcpEnv, wantEnv) || run.mcpTrust != spec.trust {
				t.Errorf("MCP server %q (found %v, trusted %v) with env %v, want %s with %v", run.mcpCommand, run.found, run.mcpTrust, run.mcpEnv, self, wantEnv)
			}
			if run.instructions == nil {
				t.Fatalf("no %s in the workspace when %s ran", spec.instructions, spec.bin)
			}
			want := c.wantInstructions
			if want == "" {
				want = runtimes.Instructions(sentinelPath)
			}
			if *run.instructions != want {
				t.Errorf("%s = %q, want %q", spec.instructions, *run.instructions, want)
			}
		})
	}
}

// TestCLIRuntimesBinAndHelperOptOut: the worker's codex and gemini-cli
// executables (Config.Runtimes) name the executable by absolute path; DisableNeedsInputHelper "true"
// lays down no instruction file and configures no MCP server.
func TestCLIRuntimesBinAndHelperOptOut(t *testing.T) {
	for _, spec := range []cliSpec{codexSpec, geminiSpec} {
		for _, disable := range []string{"", "true"} {
			t.Run(spec.runtime+" helper disabled "+disable, func(t *testing.T) {
				cli := writeExecutable(t, t.TempDir(), "my-"+spec.bin, spec.script)
				h := newHarness(t, provision.Config{})
				cfg := h.workerConfig()
				cfg.Runtimes.Bins = map[string]string{subagent.RuntimeCodex: cli, subagent.RuntimeGeminiCLI: cli}
				cfg.DisableNeedsInputHelper = disable
				h.startWorker(cfg, worker.Deps{})
				h.define(subagent.Definition{Name: "coder", Runtime: spec.runtime, Prompt: "Fix {{.Input.bug}}",
					Sandbox: subagent.Sandbox{WritePaths: []string{os.TempDir()}}})
				rec := filepath.Join(t.TempDir(), "rec")
				id := h.dispatch(lifecycle.Request{Subagent: "coder", Input: json.RawMessage(`{"bug":"#42"}`), Env: map[string]string{"CLI_REC": rec}})
				if k := h.terminal(id).Data.(lifecycle.Lifecycle).LifecycleKind(); k != lifecycle.KindNeedsInput {
					t.Fatalf("terminal = %s, want needs_input", k)
				}
				run := readCLIRun(t, spec, rec)
				if run.argv[0] != cli || run.prompt != "Fix #42" {
					t.Errorf("argv %q, prompt %q: want %s with the rendered prompt", run.argv, run.prompt, cli)
				}
				helper := disable != "true"
				if (run.instructions != nil) != helper || run.found != helper {
					t.Errorf("%s written %v, MCP server configured %v; want %v", spec.instructions, run.instructions != nil, run.found, helper)
				}
			})
		}
	}
}

// TestCLIRuntimesMCPServerWithItsConfiguredEnv starts the require_input
// server exactly as each CLI's configuration says, with no variable of the
// run's own but PATH and HOME (codex passes a server little more), and
// asks through it: the question lands where the worker reads it.
func TestCLIRuntimesMCPServerWithItsConfiguredEnv(t *testing.T) {
	for _, spec := range []cliSpec{codexSpec, geminiSpec} {
		t.Run(spec.runtime, func(t *testing.T) {
			ws := t.TempDir()
			if err := os.Mkdir(filepath.Join(ws, ".agora"), 0o700); err != nil {
				t.Fatal(err)
			}
			rt := runtimes.Builtin(runtimes.Config{})[spec.runtime]
			cmd, err := rt.Command(runtime.Invocation{Definition: subagent.Definition{Prompt: "p"}, Workspace: ws, Helper: runtime.Helper{
				MCPServer: must(os.Executable()), MCPEnv: subagentmcp.EnvServe + "=serve", NeedsInputFile: sentinel.Path(ws)}})
			if err != nil {
				t.Fatal(err)
			}
			// Lay the files down and record the run as the stand-in would.
			rec := t.TempDir()
			if err := os.WriteFile(filepath.Join(rec, "argv"), []byte(strings.Join(cmd.Args, "\x00")), 0o600); err != nil {
				t.Fatal(err)
			}
			for _, f := range cmd.Files {
				if f.Path == runtimes.GeminiSettingsPath {
					if err := os.WriteFile(filepath.Join(rec, "settings.json"), f.Data, 0o600); err != nil {
						t.Fatal(err)
					}
				}
			}
			var run cliRun
			run.argv, run.mcpEnv = cmd.Args, map[string]string{}
			spec.mcp(t, rec, &run)
			if !run.found {
				t.Fatal("no MCP server configured")
			}
			server := exec.Command(run.mcpCommand)
			server.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
			for k, v := range run.mcpEnv {
				server.Env = append(server.Env, k+"="+v)
			}
			session, err := mcp.NewClient(&mcp.Implementation{Name: spec.bin, Version: "test"}, nil).Connect(t.Context(), &mcp.CommandTransport{Command: server}, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer session.Close()
			res, err := session.CallTool(t.Context(), &mcp.CallToolParams{Name: "require_input", Arguments: map[string]any{"question": "Which loader?", "options": []string{"a", "b"}}})
			if err != nil || res.IsError {
				t.Fatalf("require_input: %v %+v", err, res)
			}
			var got sentinel.Request
			readJSONFile(t, sentinel.Path(ws), &got)
			if got.Question != "Which loader?" || !slices.Equal(got.Options, []string{"a", "b"}) {
				t.Errorf("sentinel %+v", got)
			}
		})
	}
}
