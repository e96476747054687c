package runtimes_test

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/agora-dispatch/agora/internal/runtimes"
	"github.com/agora-dispatch/agora/pkg/runtime"
	"github.com/agora-dispatch/agora/pkg/subagent"
)

// helper is the Helper the worker gives a run in the workspace /ws.
var helper = runtime.Helper{MCPServer: "/usr/local/bin/worker", MCPEnv: "AGORA_SUBAGENT_MCP=serve", NeedsInputFile: "/ws/.agora/needs_input.json"}

func TestCodexCommand(t *testing.T) {
	in := map[string]json.RawMessage{"task": json.RawMessage(`"x"`)}
	mcp := []string{
		"-c", `mcp_servers.agora.command="/usr/local/bin/worker"`,
		"-c", `mcp_servers.agora.env.AGORA_NEEDS_INPUT_FILE="/ws/.agora/needs_input.json"`,
		"-c", `mcp_servers.agora.env.AGORA_SUBAGENT_MCP="serve"`,
		"-c", `mcp_servers.agora.env.AGORA_WORKSPACE="/ws"`,
	}
	args := func(a ...[]string) []string { return slices.Concat(a...) }
	exec := []string{"codex", "exec", "--skip-git-repo-check"}
	bypass := []string{"--dangerously-bypass-approvals-and-sandbox"}
	cases := []struct {
		name string
		rt   runtimes.Codex
		help runtime.Helper
		def  subagent.Definition
		in   map[string]json.RawMessage // default in
		want []string
		err  bool
	}{
		{name: "defaults", def: subagent.Definition{Prompt: "do {{.Input.task}}"},
			want: args(exec, bypass, []string{"--", "do x"})},
		{name: "model", def: subagent.Definition{Prompt: "do {{.Input.task}}", Model: "gpt-5-codex"},
			want: args(exec, []string{"--model", "gpt-5-codex"}, bypass, []string{"--", "do x"})},
		{name: "strict keeps codex's own sandbox", def: subagent.Definition{Prompt: "p", Model: "M", Permission: subagent.PermissionStrict},
			want: args(exec, []string{"--model", "M", "--sandbox", "workspace-write", "--", "p"})},
		{name: "bin", rt: runtimes.Codex{Bin: "/opt/codex/bin/codex"}, def: subagent.Definition{Prompt: "p"},
			want: args([]string{"/opt/codex/bin/codex", "exec", "--skip-git-repo-check"}, bypass, []string{"--", "p"})},
		{name: "prompt starting with a dash follows --", def: subagent.Definition{Prompt: "--help me"},
			want: args(exec, bypass, []string{"--", "--help me"})},
		{name: "a prompt of - would read stdin", def: subagent.Definition{Prompt: "{{.Input.dash}}"}, in: map[string]json.RawMessage{"dash": json.RawMessage(`"-"`)}, err: true},
		{name: "bad template", def: subagent.Definition{Prompt: "{{.Nope}}"}, err: true},
		{name: "require_input MCP server", help: helper, def: subagent.Definition{Prompt: "p"},
			want: args(exec, bypass, mcp, []string{"--", "p"})},
		{name: "strict with the MCP server", help: helper, def: subagent.Definition{Prompt: "p", Permission: subagent.PermissionStrict},
			want: args(exec, []string{"--sandbox", "workspace-write"}, mcp, []string{"--", "p"})},
		{name: "helper off: no MCP server", help: runtime.Helper{MCPServer: "/usr/local/bin/worker", Disabled: true}, def: subagent.Definition{Prompt: "p"},
			want: args(exec, bypass, []string{"--", "p"})},
		{name: "server path quoted as TOML", help: runtime.Helper{MCPServer: `/opt/a "b"\c` + "\x7f", MCPEnv: "AGORA_SUBAGENT_MCP=serve"}, def: subagent.Definition{Prompt: "p"},
			want: args(exec, bypass, []string{
				"-c", `mcp_servers.agora.command="/opt/a \"b\"\\c\u007f"`,
				"-c", `mcp_servers.agora.env.AGORA_SUBAGENT_MCP="serve"`,
				"-c", `mcp_servers.agora.env.AGORA_WORKSPACE="/ws"`,
				"--", "p"})},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			input := in
			if c.in != nil {
				input = c.in
			}
			cmd, err := c.rt.Command(runtime.Invocation{Definition: c.def, Input: input, Workspace: "/ws", Helper: c.help})
			if c.err {
				if err == nil {
					t.Fatalf("Args = %q, want an error", cmd.Args)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(cmd.Args, c.want) {
				t.Errorf("Args =\n  %q\nwant\n  %q", cmd.Args, c.want)
			}
			var files []string
			for _, f := range cmd.Files {
				files = append(files, f.Path)
				if want := runtimes.Instructions(c.help.NeedsInputFile); f.Path == runtimes.CodexInstructionsPath && string(f.Data) != want {
					t.Errorf("%s is not runtimes.Instructions(%q)", f.Path, c.help.NeedsInputFile)
				}
			}
			want := []string{runtimes.CodexInstructionsPath}
			if c.help.Disabled {
				want = nil
			}
			if !slices.Equal(files, want) {
				t.Errorf("files %q, want %q", files, want)
			}
		})
	}
}

// TestCLIRuntimesNeedAPrompt: each CLI runtime refuses a definition
// without a prompt, as Definition.Validate does.
func TestCLIRuntimesNeedAPrompt(t *testing.T) {
	for name, v := range map[string]runtime.Validator{
		subagent.RuntimeClaudeCode: runtimes.ClaudeCode{},
		subagent.RuntimeCodex:      runtimes.Codex{},
		subagent.RuntimeGeminiCLI:  runtimes.GeminiCLI{},
	} {
		if err := v.Validate(subagent.Definition{Name: "a", Runtime: name}); err == nil {
			t.Errorf("%s accepted a definition without a prompt", name)
		}
		if err := v.Validate(subagent.Definition{Name: "a", Runtime: name, Prompt: "p"}); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		if err := (subagent.Definition{Name: "a", Runtime: name}).Validate(); err == nil {
			t.Errorf("Definition.Validate accepted runtime %s without a prompt", name)
		}
		if _, ok := runtimes.Builtin(runtimes.Config{})[name]; !ok || !slices.Contains(subagent.BuiltinRuntimes, name) {
			t.Errorf("%s is not built in", name)
		}
	}
}
