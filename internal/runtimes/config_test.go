package runtimes_test

import (
	"maps"
	"slices"
	"testing"

	"github.com/agora-dispatch/agora/internal/config"
	"github.com/agora-dispatch/agora/internal/runtimes"
	"github.com/agora-dispatch/agora/pkg/subagent"
)

// The CLI runtimes' executables are read from the variables the check
// names: AGORA_WORKER_CLAUDE_BIN and its siblings, defaulting to the
// CLI's name on PATH.
func TestConfig(t *testing.T) {
	want := map[string][2]string{ // runtime: default, variable
		subagent.RuntimeClaudeCode: {"claude", "AGORA_WORKER_CLAUDE_BIN"},
		subagent.RuntimeCodex:      {"codex", "AGORA_WORKER_CODEX_BIN"},
		subagent.RuntimeGeminiCLI:  {"gemini", "AGORA_WORKER_GEMINI_BIN"},
		subagent.RuntimeExec:       {"", ""},
	}
	set := map[string]string{}
	for _, s := range runtimes.Specs() {
		w, ok := want[s.Name]
		if !ok {
			continue // a runtime added since: its variable follows BinVar's rule (TestSpecVar)
		}
		delete(want, s.Name)
		if s.Bin != w[0] || s.BinVar() != w[1] {
			t.Errorf("%s: default %q, variable %q; want %q, %q", s.Name, s.Bin, s.BinVar(), w[0], w[1])
		}
		if w[1] != "" {
			t.Setenv(w[1], "/opt/"+s.Name)
			set[s.Name] = "/opt/" + s.Name
		}
	}
	for name := range want {
		t.Errorf("runtime %s is not built in", name)
	}
	var c struct{ Runtimes runtimes.Config }
	if err := config.Load(&c); err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(c.Runtimes.Bins, set) {
		t.Errorf("loaded %v, want %v", c.Runtimes.Bins, set)
	}
}

// A runtime may name its variable itself when the rule does not give it.
func TestSpecVar(t *testing.T) {
	if got := (runtimes.Spec{Name: "x", Bin: "my-cli.js"}).BinVar(); got != "AGORA_WORKER_MY_CLI_JS_BIN" {
		t.Errorf("BinVar = %q", got)
	}
	if got := (runtimes.Spec{Name: "x", Bin: "x", Var: "AGORA_WORKER_OTHER_BIN"}).BinVar(); got != "AGORA_WORKER_OTHER_BIN" {
		t.Errorf("BinVar = %q", got)
	}
}

// Every built-in runtime is one pkg/subagent lists, and none is missing.
func TestSpecsAreBuiltinRuntimes(t *testing.T) {
	var names []string
	for _, s := range runtimes.Specs() {
		names = append(names, s.Name)
	}
	if !slices.Equal(names, subagent.BuiltinRuntimes) {
		t.Errorf("registry %v, subagent.BuiltinRuntimes %v", names, subagent.BuiltinRuntimes)
	}
}
