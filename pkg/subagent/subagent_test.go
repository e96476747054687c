package subagent_test

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/subagent"
)

func TestParse(t *testing.T) {
	want := subagent.Definition{
		Name:        "planner",
		Runtime:     "exec",
		Command:     []string{"./agent", "--plan"},
		Prompt:      "{{.Input.task}} {{if .Answer}}Operator answered: {{.Answer}}{{end}}",
		Timeout:     "30m",
		EnvAllow:    []string{"ANTHROPIC_API_KEY"},
		Files:       map[string]string{".claude/skills/house-rules/SKILL.md": "be nice"},
		MaxRounds:   10,
		Description: "plans work",
	}
	tests := []struct {
		name string
		in   string
	}{
		{"yaml", `
name: planner
runtime: exec            # or claude-code
command: ["./agent", "--plan"]
prompt: "{{.Input.task}} {{if .Answer}}Operator answered: {{.Answer}}{{end}}"
model: ""
timeout: 30m
env_allow: [ANTHROPIC_API_KEY]
files: {".claude/skills/house-rules/SKILL.md": "be nice"}
max_rounds: 10
description: plans work
`},
		{"yaml block style", `
name: planner
runtime: exec
command:
  - ./agent
  - --plan
prompt: >-
  {{.Input.task}} {{if .Answer}}Operator answered: {{.Answer}}{{end}}
timeout: 30m
env_allow:
  - ANTHROPIC_API_KEY
files:
  .claude/skills/house-rules/SKILL.md: be nice
max_rounds: 10
description: plans work
`},
		{"json", `{"name":"planner","runtime":"exec","command":["./agent","--plan"],
"prompt":"{{.Input.task}} {{if .Answer}}Operator answered: {{.Answer}}{{end}}","timeout":"30m",
"env_allow":["ANTHROPIC_API_KEY"],"files":{".claude/skills/house-rules/SKILL.md":"be nice"},"max_rounds":10,
"description":"plans work"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := subagent.Parse([]byte(tt.in))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("Parse = %+v\nwant    %+v", got, want)
			}
		})
	}
}

// A definition is stored as JSON in the KV bucket and read back with Parse.
func TestJSONRoundTrip(t *testing.T) {
	d := subagent.Definition{Name: "coder", Runtime: subagent.RuntimeClaudeCode, Prompt: "Do {{.Input.task}}",
		Model: "opus", Permission: subagent.PermissionStrict, Timeout: "1h", MaxRounds: 3}
	b, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	got, err := subagent.Parse(b)
	if err != nil {
		t.Fatalf("Parse(%s): %v", b, err)
	}
	if !reflect.DeepEqual(got, d) {
		t.Errorf("round trip = %+v, want %+v", got, d)
	}
}

func TestParseRejects(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"unknown yaml field", "name: a\nruntime: exec\ncommand: [x]\nretries: 3\n", "retries"},
		{"unknown json field", `{"name":"a","runtime":"exec","command":["x"],"permissions":"all"}`, "permissions"},
		{"misspelt field", "name: a\nruntime: exec\ncommand: [x]\nmax_round: 3\n", "max_round"},
		{"wrong type", "name: a\nruntime: exec\ncommand: ./x\n", "command"},
		{"not yaml", "name: [a\n", "subagent"},
		{"invalid after parse", "name: a\nruntime: Docker\n", "runtime"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := subagent.Parse([]byte(tt.in))
			testkit.CheckErr(t, "Parse", err, tt.want)
		})
	}
}

func valid() subagent.Definition {
	return subagent.Definition{Name: "planner", Runtime: subagent.RuntimeExec, Command: []string{"./agent"}}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name   string
		change func(*subagent.Definition)
		want   []string // "field: ..." fragments; none means valid
	}{
		{"minimal exec", func(d *subagent.Definition) {}, nil},
		{"claude-code with prompt", func(d *subagent.Definition) {
			d.Runtime, d.Command, d.Prompt = subagent.RuntimeClaudeCode, nil, "Do {{.Input.task}}{{with .Answer}} ({{.}}){{end}}"
		}, nil},
		{"strict permissions", func(d *subagent.Definition) { d.Permission = subagent.PermissionStrict }, nil},
		{"every valid option", func(d *subagent.Definition) {
			d.Timeout, d.MaxRounds, d.EnvAllow = "90s", 1, []string{"ANTHROPIC_API_KEY", "_X", "lower_ok"}
			d.Files = map[string]string{"a.txt": "", "dir/b.md": "", ".claude/x": "", "./c": "", "d/../e": "", ".agorax/f": ""}
		}, nil},
		{"64-character name", func(d *subagent.Definition) { d.Name = strings.Repeat("a", 64) }, nil},

		{"empty name", func(d *subagent.Definition) { d.Name = "" }, []string{"name:"}},
		{"name with dot", func(d *subagent.Definition) { d.Name = "a.b" }, []string{"name:"}},
		{"name with space", func(d *subagent.Definition) { d.Name = "a b" }, []string{"name:"}},
		{"name with wildcard", func(d *subagent.Definition) { d.Name = "a*" }, []string{"name:"}},
		{"name starting with dash", func(d *subagent.Definition) { d.Name = "-a" }, []string{"name:"}},
		{"65-character name", func(d *subagent.Definition) { d.Name = strings.Repeat("a", 65) }, []string{"name:"}},
		{"missing runtime", func(d *subagent.Definition) { d.Runtime = "" }, []string{"runtime:"}},
		{"malformed runtime", func(d *subagent.Definition) { d.Runtime = "Docker!" }, []string{"runtime:"}},
		{"exec without command", func(d *subagent.Definition) { d.Command = nil }, []string{"command:"}},
		{"exec with empty program", func(d *subagent.Definition) { d.Command = []string{"", "x"} }, []string{"command:"}},
		{"claude-code without prompt", func(d *subagent.Definition) { d.Runtime = subagent.RuntimeClaudeCode; d.Prompt = " \n" }, []string{"prompt:"}},
		{"codex without prompt", func(d *subagent.Definition) { d.Runtime = subagent.RuntimeCodex; d.Prompt = "" }, []string{"prompt: required for runtime codex"}},
		{"gemini-cli without prompt", func(d *subagent.Definition) { d.Runtime = subagent.RuntimeGeminiCLI; d.Prompt = " " }, []string{"prompt: required for runtime gemini-cli"}},
		{"bad template", func(d *subagent.Definition) { d.Prompt = "{{.Input.task" }, []string{"prompt:"}},
		{"unknown template function", func(d *subagent.Definition) { d.Prompt = "{{nosuch .Input}}" }, []string{"prompt:"}},
		{"unknown permission mode", func(d *subagent.Definition) { d.Permission = "yolo" }, []string{"permission_mode:"}},
		{"bad timeout", func(d *subagent.Definition) { d.Timeout = "30" }, []string{"timeout:"}},
		{"zero timeout", func(d *subagent.Definition) { d.Timeout = "0s" }, []string{"timeout:"}},
		{"negative timeout", func(d *subagent.Definition) { d.Timeout = "-1m" }, []string{"timeout:"}},
		{"invalid env name", func(d *subagent.Definition) { d.EnvAllow = []string{"1ABC"} }, []string{"env_allow:", `"1ABC"`}},
		{"env name with dash", func(d *subagent.Definition) { d.EnvAllow = []string{"A-B"} }, []string{"env_allow:"}},
		{"empty env name", func(d *subagent.Definition) { d.EnvAllow = []string{""} }, []string{"env_allow:"}},
		{"reserved AGORA_", func(d *subagent.Definition) { d.EnvAllow = []string{"AGORA_NATS_CREDS"} }, []string{"env_allow:", "reserved"}},
		{"reserved NATS_", func(d *subagent.Definition) { d.EnvAllow = []string{"NATS_TOKEN"} }, []string{"env_allow:", "reserved"}},
		{"reserved in lower case", func(d *subagent.Definition) { d.EnvAllow = []string{"agora_x"} }, []string{"env_allow:", "reserved"}},
		{"absolute file", func(d *subagent.Definition) { d.Files = map[string]string{"/etc/passwd": ""} }, []string{"files:", "absolute"}},
		{"backslash file", func(d *subagent.Definition) { d.Files = map[string]string{`\x`: ""} }, []string{"files:", "absolute"}},
		{"escaping file", func(d *subagent.Definition) { d.Files = map[string]string{"../x": ""} }, []string{"files:", "escapes"}},
		{"escaping after clean", func(d *subagent.Definition) { d.Files = map[string]string{"a/../../x": ""} }, []string{"files:", "escapes"}},
		{"workspace itself", func(d *subagent.Definition) { d.Files = map[string]string{".": ""} }, []string{"files:", "escapes"}},
		{"parent dir", func(d *subagent.Definition) { d.Files = map[string]string{"..": ""} }, []string{"files:", "escapes"}},
		{"empty file path", func(d *subagent.Definition) { d.Files = map[string]string{"": ""} }, []string{"files:", "empty"}},
		{"inside .agora", func(d *subagent.Definition) { d.Files = map[string]string{".agora/needs_input.json": ""} }, []string{"files:", ".agora"}},
		{".agora itself", func(d *subagent.Definition) { d.Files = map[string]string{".agora": ""} }, []string{"files:", ".agora"}},
		{"into .agora after clean", func(d *subagent.Definition) { d.Files = map[string]string{"x/../.agora/input.json": ""} }, []string{"files:", ".agora"}},
		{"into .agora via ./", func(d *subagent.Definition) { d.Files = map[string]string{"./.agora/output.json": ""} }, []string{"files:", ".agora"}},
		{"negative max_rounds", func(d *subagent.Definition) { d.MaxRounds = -1 }, []string{"max_rounds:"}},

		{"everything at once", func(d *subagent.Definition) {
			*d = subagent.Definition{
				Name: "bad name", Runtime: "Docker", Prompt: "{{", Permission: "all", Timeout: "soon",
				EnvAllow: []string{"9X", "NATS_URL"}, Files: map[string]string{"/abs": "", "../up": "", ".agora/x": ""}, MaxRounds: -3,
			}
		}, []string{"name:", "runtime:", "prompt:", "permission_mode:", "timeout:", `env_allow: "9X"`, `env_allow: "NATS_URL"`,
			`files: "/abs"`, `files: "../up"`, `files: ".agora/x"`, "max_rounds:"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := valid()
			tt.change(&d)
			err := d.Validate()
			testkit.CheckErr(t, "Validate", err, tt.want...)
			if err == nil {
				return
			}
			if !strings.HasPrefix(err.Error(), "subagent ") {
				t.Errorf("error %q lacks the package prefix", err)
			}
			// Every problem is reported, one line each.
			if lines := strings.Split(err.Error(), "\n"); len(lines) != len(tt.want) && len(tt.want) > 2 {
				t.Errorf("error lists %d problems, want %d:\n%v", len(lines), len(tt.want), err)
			}
		})
	}
}

func TestValidNames(t *testing.T) {
	for _, tc := range []struct {
		name    string
		f       func(string) bool
		yes, no []string
	}{
		{"ValidName", subagent.ValidName,
			[]string{"a", "A", "0", "planner", "data-lookup", "data_lookup", "x9"},
			[]string{"", "_a", "-a", "a.b", "a b", "a/b", "a>", "é"}},
		{"ValidEnvName", subagent.ValidEnvName,
			[]string{"A", "_", "a_1", "PATH"},
			[]string{"", "1A", "A-B", "A=B", "A B"}},
		{"Reserved", subagent.Reserved,
			[]string{"AGORA_X", "agora_x", "NATS_URL", "Nats_Creds"},
			[]string{"AGORA", "NATS", "MY_AGORA_X", "ANTHROPIC_API_KEY", "NATSX"}},
	} {
		for _, n := range tc.yes {
			if !tc.f(n) {
				t.Errorf("%s(%q) = false", tc.name, n)
			}
		}
		for _, n := range tc.no {
			if tc.f(n) {
				t.Errorf("%s(%q) = true", tc.name, n)
			}
		}
	}
}

func TestTimeoutDuration(t *testing.T) {
	tests := []struct {
		timeout string
		want    time.Duration
	}{
		{"", subagent.DefaultTimeout},
		{"garbage", subagent.DefaultTimeout},
		{"0s", subagent.DefaultTimeout},
		{"-5m", subagent.DefaultTimeout},
		{"90s", 90 * time.Second},
		{"2h", 2 * time.Hour},
	}
	for _, tt := range tests {
		d := subagent.Definition{Timeout: tt.timeout}
		if got := d.TimeoutDuration(); got != tt.want {
			t.Errorf("TimeoutDuration(%q) = %v, want %v", tt.timeout, got, tt.want)
		}
	}
	if subagent.DefaultTimeout != 30*time.Minute {
		t.Errorf("DefaultTimeout = %v, want 30m (docs/subagents.md#definition-rules)", subagent.DefaultTimeout)
	}
}

func TestRounds(t *testing.T) {
	tests := []struct{ maxRounds, want int }{
		{0, subagent.DefaultMaxRounds},
		{-1, subagent.DefaultMaxRounds},
		{1, 1},
		{25, 25},
	}
	for _, tt := range tests {
		d := subagent.Definition{MaxRounds: tt.maxRounds}
		if got := d.Rounds(); got != tt.want {
			t.Errorf("Rounds(max_rounds %d) = %d, want %d", tt.maxRounds, got, tt.want)
		}
	}
	if subagent.DefaultMaxRounds != 10 {
		t.Errorf("DefaultMaxRounds = %d, want 10", subagent.DefaultMaxRounds)
	}
}

func TestParseFileResolvesCommandPaths(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"agent.sh", "bin/tool"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	def := filepath.Join(dir, "def.yaml")
	if err := os.WriteFile(def, []byte(`name: x
runtime: exec
command: ["sh", "./agent.sh", "bin/tool", "--flag=./agent.sh", "./missing", "/bin/true", "./shipped"]
files: {"shipped": "echo hi"}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	d, resolved, err := subagent.ParseFile(def)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"sh", filepath.Join(dir, "agent.sh"), filepath.Join(dir, "bin/tool"), "--flag=./agent.sh", "./missing", "/bin/true", "./shipped"}
	if !slices.Equal(d.Command, want) {
		t.Errorf("command = %q, want %q", d.Command, want)
	}
	if len(resolved) != 2 {
		t.Errorf("resolved = %q, want two entries", resolved)
	}
	if _, _, err := subagent.ParseFile(filepath.Join(dir, "nope.yaml")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a missing file: %v", err)
	}
}

// A definition with mistakes is refused with every one of them: each key
// that is no field with its line and the field it most likely meant, a
// value of the wrong type in YAML terms, and what validation finds in the
// rest.
func TestParseReportsEveryMistake(t *testing.T) {
	for _, tc := range []struct {
		name, doc string
		want      []string
	}{
		{"typos at every depth", "name: walk\nruntime: exec\ncommand: [sh]\ntimout: 2m\nsandbox:\n  read_path: [/opt]\n  network:\n    alow: [example.com:443]\n",
			[]string{"line 4: timout: not a field of a definition; did you mean timeout?", "line 6: read_path: not a field of sandbox; did you mean read_paths?",
				"line 8: alow: not a field of sandbox.network; did you mean allow?"}},
		{"a key nothing is near", "name: walk\nruntime: exec\ncommand: [sh]\nfoo: 1\n", []string{"line 4: foo: not a field of a definition (command, description"}},
		{"a typo and a bad value", "name: walk\nruntime: Exec\ncommand: [sh]\nmax-rounds: 3\n", []string{"line 4: max-rounds", "did you mean max_rounds?", `runtime: "Exec"`}},
		{"a wrong type", "name: walk\nruntime: exec\ncommand: [sh]\nmax_rounds: two\n", []string{"YAML: cannot unmarshal string into field Definition.max_rounds of type int"}},
		{"JSON", `{"name":"walk","runtime":"exec","command":["sh"],"timout":"2m"}`, []string{"line 1: timout", "did you mean timeout?"}},
		{"not YAML", "name: [walk\n", []string{"not valid YAML (or JSON)", "line"}},
		{"empty", "", []string{"the definition is empty"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := subagent.Parse([]byte(tc.doc))
			if err == nil {
				t.Fatal("parsed")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
		})
	}
	if _, err := subagent.Parse([]byte("name: walk\nruntime: exec\ncommand: [sh]\ntimeout: 2m\nsandbox:\n  read_paths: [/opt]\n  network:\n    allow: [example.com:443]\n")); err != nil {
		t.Errorf("a good definition: %v", err)
	}
}
