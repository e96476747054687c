// Package runtimes holds the runtimes every Agora worker offers, by the
// name a sub-agent definition gives as its runtime: exec (the
// definition's command line), and claude-code, codex and gemini-cli (the
// claude, codex and gemini CLIs, each taught to ask by an instruction file
// and a require_input MCP tool). Each is a
// runtime.Runtime (pkg/runtime): it says what to run, and the worker runs
// it in the sandbox (docs/subagents.md, "Writing a runtime").
//
// A built-in runtime is one file of this package, which declares its Spec,
// and one entry in specs below. The registry gives the rest: the worker's
// runtimes (Builtin), the setting of its CLI (BinVar), which the worker's
// configuration and `agora subagent check` read.
package runtimes

import (
	"strings"

	"github.com/agora-dispatch/agora/pkg/runtime"
)

// specs are the built-in runtimes, in the order their names are listed to
// users. Adding one is its file and its entry here.
var specs = []Spec{
	execSpec,
	claudeCodeSpec,
	codexSpec,
	geminiCLISpec,
}

// Spec is one built-in runtime, declared in its own file.
type Spec struct {
	// Name is the runtime a definition names.
	Name string
	// Bin is the CLI the runtime runs unless its variable says otherwise,
	// looked up on the run's PATH; "" for a runtime that runs no CLI of
	// its own (exec).
	Bin string
	// Var names the variable that sets the CLI when BinVar's rule does
	// not give it; usually "".
	Var string
	// New makes the runtime, running bin as its CLI ("" means Bin).
	New func(bin string) runtime.Runtime
}

// BinVar is the variable that sets the runtime's CLI: AGORA_WORKER_, its
// default executable upper-cased with '-' and '.' as '_', then _BIN
// (AGORA_WORKER_CLAUDE_BIN, AGORA_WORKER_CODEX_BIN,
// AGORA_WORKER_GEMINI_BIN), unless Var names another; "" for a runtime
// without a CLI.
func (s Spec) BinVar() string {
	switch {
	case s.Var != "":
		return s.Var
	case s.Bin == "":
		return ""
	}
	return "AGORA_WORKER_" + strings.ToUpper(strings.NewReplacer("-", "_", ".", "_").Replace(s.Bin)) + "_BIN"
}

// Specs returns the built-in runtimes, in the order their names are
// listed to users.
func Specs() []Spec { return append([]Spec(nil), specs...) }

// Lookup returns the built-in runtime named name.
func Lookup(name string) (Spec, bool) {
	for _, s := range specs {
		if s.Name == name {
			return s, true
		}
	}
	return Spec{}, false
}

// Config are the built-in runtimes' settings.
type Config struct {
	// Bins is the CLI each runtime runs, by runtime name; a runtime
	// missing here, or "", runs its Spec's Bin from the run's PATH.
	Bins map[string]string
}

// LoadEnv reads each CLI runtime's variable (BinVar) through lookup. It
// is how config.Load fills a Config, so a service's Config holds one as a
// field.
func (c *Config) LoadEnv(lookup func(string) (string, bool)) error {
	for _, s := range specs {
		name := s.BinVar()
		if name == "" {
			continue
		}
		if v, ok := lookup(name); ok && v != "" {
			if c.Bins == nil {
				c.Bins = map[string]string{}
			}
			c.Bins[s.Name] = v
		}
	}
	return nil
}

// Builtin returns the built-in runtimes by definition runtime name.
func Builtin(cfg Config) map[string]runtime.Runtime {
	m := make(map[string]runtime.Runtime, len(specs))
	for _, s := range specs {
		m[s.Name] = s.New(cfg.Bins[s.Name])
	}
	return m
}
