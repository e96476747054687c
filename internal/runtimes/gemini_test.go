package runtimes_test

import (
	"encoding/json"
	"maps"
	"slices"
	"testing"

	"github.com/agora-dispatch/agora/internal/runtimes"
	"github.com/agora-dispatch/agora/pkg/runtime"
	"github.com/agora-dispatch/agora/pkg/subagent"
)

func TestGeminiCLICommand(t *testing.T) {
	in := map[string]json.RawMessage{"task": json.RawMessage(`"x"`)}
	head := []string{"env", "GEMINI_CLI_TRUST_WORKSPACE=true", "gemini", "--output-format", "json"}
	yolo := []string{"--approval-mode", "yolo"}
	cases := []struct {
		name string
		rt   runtimes.GeminiCLI
		help runtime.Helper
		def  subagent.Definition
		want []string
		err  bool
	}{
		{name: "defaults", def: subagent.Definition{Prompt: "do {{.Input.task}}"},
			want: slices.Concat(head, yolo, []string{"--prompt=do x"})},
		{name: "model", def: subagent.Definition{Prompt: "do {{.Input.task}}", Model: "gemini-2.5-pro"},
			want: slices.Concat(head, []string{"--model", "gemini-2.5-pro"}, yolo, []string{"--prompt=do x"})},
		{name: "strict keeps gemini's approvals", def: subagent.Definition{Prompt: "p", Model: "M", Permission: subagent.PermissionStrict},
			want: slices.Concat(head, []string{"--model", "M", "--approval-mode", "default", "--prompt=p"})},
		{name: "bin", rt: runtimes.GeminiCLI{Bin: "/opt/gemini/bin/gemini"}, def: subagent.Definition{Prompt: "p"},
			want: slices.Concat(head[:2], []string{"/opt/gemini/bin/gemini"}, head[3:], yolo, []string{"--prompt=p"})},
		{name: "prompt starting with a dash stays the flag's value", def: subagent.Definition{Prompt: "--help me\n-p"},
			want: slices.Concat(head, yolo, []string{"--prompt=--help me\n-p"})},
		{name: "bad template", def: subagent.Definition{Prompt: "{{.Nope}}"}, err: true},
		{name: "require_input MCP server", help: helper, def: subagent.Definition{Prompt: "p"},
			want: slices.Concat(head, yolo, []string{"--prompt=p"})},
		{name: "strict with the MCP server", help: helper, def: subagent.Definition{Prompt: "p", Permission: subagent.PermissionStrict},
			want: slices.Concat(head, []string{"--approval-mode", "default", "--prompt=p"})},
		{name: "helper off: no files", help: runtime.Helper{MCPServer: "/usr/local/bin/worker", Disabled: true}, def: subagent.Definition{Prompt: "p"},
			want: slices.Concat(head, yolo, []string{"--prompt=p"})},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cmd, err := c.rt.Command(runtime.Invocation{Definition: c.def, Input: in, Workspace: "/ws", Helper: c.help})
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
			files := map[string]string{}
			for _, f := range cmd.Files {
				files[f.Path] = string(f.Data)
			}
			want := []string{runtimes.GeminiInstructionsPath}
			switch {
			case c.help.Disabled:
				want = nil
			case c.help.MCPServer != "":
				want = append(want, runtimes.GeminiSettingsPath)
			}
			if got := slices.Sorted(maps.Keys(files)); !slices.Equal(got, slices.Sorted(slices.Values(want))) {
				t.Errorf("files %q, want %q", got, want)
			}
			if md, ok := files[runtimes.GeminiInstructionsPath]; ok && md != runtimes.Instructions(c.help.NeedsInputFile) {
				t.Errorf("%s is not runtimes.Instructions(%q)", runtimes.GeminiInstructionsPath, c.help.NeedsInputFile)
			}
			if s, ok := files[runtimes.GeminiSettingsPath]; ok {
				var settings struct {
					MCPServers map[string]struct {
						Command string            `json:"command"`
						Env     map[string]string `json:"env"`
						Trust   bool              `json:"trust"`
					} `json:"mcpServers"`
				}
				if err := json.Unmarshal([]byte(s), &settings); err != nil {
					t.Fatalf("%s: %v", runtimes.GeminiSettingsPath, err)
				}
				srv := settings.MCPServers["agora"]
				wantEnv := map[string]string{"AGORA_SUBAGENT_MCP": "serve", "AGORA_WORKSPACE": "/ws", "AGORA_NEEDS_INPUT_FILE": "/ws/.agora/needs_input.json"}
				if len(settings.MCPServers) != 1 || srv.Command != c.help.MCPServer || !maps.Equal(srv.Env, wantEnv) || !srv.Trust {
					t.Errorf("%s = %s, want the trusted agora server %s with env %v", runtimes.GeminiSettingsPath, s, c.help.MCPServer, wantEnv)
				}
			}
		})
	}
}
