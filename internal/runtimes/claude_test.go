package runtimes_test

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/agora-dispatch/agora/internal/runtimes"
	"github.com/agora-dispatch/agora/pkg/runtime"
	"github.com/agora-dispatch/agora/pkg/subagent"
)

func TestRenderPrompt(t *testing.T) {
	cases := []struct {
		name  string
		tmpl  string
		input string
		want  string
		err   bool
	}{
		{name: "input field", tmpl: "Plan {{.Input.task}} for {{.Input.team}}.", input: `{"task":"the release","team":"payments"}`, want: "Plan the release for payments."},
		{name: "nested input", tmpl: "{{.Input.ticket.id}}/{{index .Input.files 1}}", input: `{"ticket":{"id":"T-1"},"files":["a","b"]}`, want: "T-1/b"},
		{name: "numbers keep their text", tmpl: "{{.Input.n}} {{.Input.big}}", input: `{"n":12345678901234567890123,"big":1e400}`, want: "12345678901234567890123 1e400"},
		{name: "answer object gives its answer", tmpl: "{{.Answer}}", input: `{"answer":{"answer":"B","answered_by":"alice","decision":"approve"}}`, want: "B"},
		{name: "answer string", tmpl: "{{.Answer}}", input: `{"answer":"B"}`, want: "B"},
		{name: "answer fields stay reachable", tmpl: "{{.Input.answer.answered_by}} {{.Input.answer.decision}}", input: `{"answer":{"answer":"B","answered_by":"alice","decision":"approve"}}`, want: "alice approve"},
		{name: "first round has no answer or state", tmpl: "{{if .Answer}}A{{else}}no answer{{end}} {{if .PartialState}}S{{else}}no state{{end}}", input: `{"task":"t"}`, want: "no answer no state"},
		{name: "partial state is indented JSON", tmpl: "{{.PartialState}}", input: `{"partial_state":{"a":[1,2],"b":"c"}}`, want: "{\n  \"a\": [\n    1,\n    2\n  ],\n  \"b\": \"c\"\n}"},
		{name: "null partial state is absent", tmpl: "{{if .PartialState}}S{{else}}none{{end}}", input: `{"partial_state":null}`, want: "none"},
		{name: "no input", tmpl: "static prompt", input: `{}`, want: "static prompt"},
		{name: "parse error", tmpl: "{{.Input.task", input: `{}`, err: true},
		{name: "execution error", tmpl: "{{.Nope}}", input: `{}`, err: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var in map[string]json.RawMessage
			if err := json.Unmarshal([]byte(c.input), &in); err != nil {
				t.Fatal(err)
			}
			got, err := runtimes.RenderPrompt(c.tmpl, in)
			if c.err {
				if err == nil {
					t.Fatalf("RenderPrompt = %q, want an error", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Errorf("RenderPrompt = %q, want %q", got, c.want)
			}
		})
	}
}

func TestClaudeCodeCommand(t *testing.T) {
	in := map[string]json.RawMessage{"task": json.RawMessage(`"x"`)}
	cases := []struct {
		name string
		rt   runtimes.ClaudeCode
		help runtime.Helper
		def  subagent.Definition
		want []string
		err  bool
	}{
		{name: "defaults", def: subagent.Definition{Prompt: "do {{.Input.task}}"},
			want: []string{"claude", "--print", "--output-format", "json", "--dangerously-skip-permissions", "do x"}},
		{name: "model", def: subagent.Definition{Prompt: "do {{.Input.task}}", Model: "claude-opus-4"},
			want: []string{"claude", "--print", "--output-format", "json", "--model", "claude-opus-4", "--dangerously-skip-permissions", "do x"}},
		{name: "strict", def: subagent.Definition{Prompt: "do {{.Input.task}}", Model: "M", Permission: subagent.PermissionStrict},
			want: []string{"claude", "--print", "--output-format", "json", "--model", "M", "do x"}},
		{name: "strict without model", def: subagent.Definition{Prompt: "p", Permission: subagent.PermissionStrict},
			want: []string{"claude", "--print", "--output-format", "json", "p"}},
		{name: "bin", rt: runtimes.ClaudeCode{Bin: "/opt/claude/bin/claude"}, def: subagent.Definition{Prompt: "p"},
			want: []string{"/opt/claude/bin/claude", "--print", "--output-format", "json", "--dangerously-skip-permissions", "p"}},
		{name: "prompt starting with a dash stays one argument", def: subagent.Definition{Prompt: "--help me"},
			want: []string{"claude", "--print", "--output-format", "json", "--dangerously-skip-permissions", "--help me"}},
		{name: "bad template", def: subagent.Definition{Prompt: "{{.Nope}}"}, err: true},
		{name: "require_input MCP server", help: runtime.Helper{MCPServer: "/usr/local/bin/worker"}, def: subagent.Definition{Prompt: "p"},
			want: []string{"claude", "--print", "--output-format", "json", "--dangerously-skip-permissions", "--mcp-config", "/ws/.agora/mcp.json", "p"}},
		{name: "helper off: no MCP server", help: runtime.Helper{MCPServer: "/usr/local/bin/worker", Disabled: true}, def: subagent.Definition{Prompt: "p"},
			want: []string{"claude", "--print", "--output-format", "json", "--dangerously-skip-permissions", "p"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cmd, err := c.rt.Command(runtime.Invocation{Definition: c.def, Input: in, Workspace: "/ws", Helper: c.help})
			got := cmd.Args
			if c.err {
				if err == nil {
					t.Fatalf("Args = %q, want an error", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("Args =\n  %q\nwant\n  %q", got, c.want)
			}
			var files []string
			for _, f := range cmd.Files {
				files = append(files, f.Path)
			}
			want := []string{runtimes.SkillPath}
			switch {
			case c.help.Disabled:
				want = nil
			case c.help.MCPServer != "":
				want = []string{runtimes.MCPConfigPath, runtimes.SkillPath}
			}
			if !slices.Equal(files, want) {
				t.Errorf("files %q, want %q", files, want)
			}
		})
	}
}
