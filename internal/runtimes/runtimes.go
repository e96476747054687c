// Package runtimes holds the runtimes every Agora worker offers, by the
// name a sub-agent definition gives as its runtime: exec (the
// definition's command line), and claude-code, codex and gemini-cli (the
// claude, codex and gemini CLIs, each taught to ask by an instruction file
// and a require_input MCP tool). Each is a
// runtime.Runtime (pkg/runtime): it says what to run, and the worker runs
// it in the sandbox (docs/subagents.md, "Writing a runtime").
package runtimes

import (
	"github.com/agora-dispatch/agora/pkg/runtime"
	"github.com/agora-dispatch/agora/pkg/subagent"
)

// Config are the built-in runtimes' settings.
type Config struct {
	// ClaudeBin is the claude CLI (default: claude on the run's PATH).
	ClaudeBin string
	// CodexBin is the codex CLI (default: codex on the run's PATH).
	CodexBin string
	// GeminiBin is the gemini CLI (default: gemini on the run's PATH).
	GeminiBin string
}

// Builtin returns the built-in runtimes by definition runtime name.
func Builtin(cfg Config) map[string]runtime.Runtime {
	return map[string]runtime.Runtime{
		subagent.RuntimeExec:       Exec{},
		subagent.RuntimeClaudeCode: ClaudeCode{Bin: cfg.ClaudeBin},
		subagent.RuntimeCodex:      Codex{Bin: cfg.CodexBin},
		subagent.RuntimeGeminiCLI:  GeminiCLI{Bin: cfg.GeminiBin},
	}
}
