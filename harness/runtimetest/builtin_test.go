package runtimetest_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/agora-dispatch/agora/harness/runtimetest"
	"github.com/agora-dispatch/agora/internal/runtimes"
	"github.com/agora-dispatch/agora/internal/subagentmcp"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/services/worker"
)

// TestMain serves the require_input MCP tool when a run starts this
// binary as the worker's own (runtimetest.Subject.MCP).
func TestMain(m *testing.M) {
	subagentmcp.ServeIfAskedInTest()
	os.Exit(m.Run())
}

func TestExec(t *testing.T) {
	runtimetest.Run(t, runtimetest.Subject{
		Name: subagent.RuntimeExec,
		Define: func(name, script string) subagent.Definition {
			return subagent.Definition{Name: name, Runtime: subagent.RuntimeExec, Command: []string{"/bin/sh", "-c", script}}
		},
	})
}

// standIn writes a stand-in CLI that runs its last argument (where the
// runtime puts the prompt), less prefix, with /bin/sh, in a folder the run
// may read, and returns its path.
func standIn(t *testing.T, name, prefix string) string {
	dir := t.TempDir()
	// The run's user is not the test's: it reads the stand-in through
	// read_paths.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, name)
	if err := os.WriteFile(bin, []byte("#!/bin/sh\nfor a; do last=$a; done\nexec /bin/sh -c \"${last#"+prefix+"}\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

func TestClaudeCode(t *testing.T) {
	bin := standIn(t, "claude", "")
	runtimetest.Run(t, runtimetest.Subject{
		Name: subagent.RuntimeClaudeCode,
		Define: func(name, script string) subagent.Definition {
			return subagent.Definition{Name: name, Runtime: subagent.RuntimeClaudeCode, Prompt: script,
				Sandbox: subagent.Sandbox{ReadPaths: []string{filepath.Dir(bin)}}}
		},
		Worker: func(c *worker.Config) { c.ClaudeBin = bin },
		Taught: []string{runtimes.SkillPath, runtimes.MCPConfigPath},
		MCP:    true,
	})
}

func TestCodex(t *testing.T) {
	bin := standIn(t, "codex", "")
	runtimetest.Run(t, runtimetest.Subject{
		Name: subagent.RuntimeCodex,
		Define: func(name, script string) subagent.Definition {
			return subagent.Definition{Name: name, Runtime: subagent.RuntimeCodex, Prompt: script,
				Sandbox: subagent.Sandbox{ReadPaths: []string{filepath.Dir(bin)}}}
		},
		Worker: func(c *worker.Config) { c.CodexBin = bin },
		Taught: []string{runtimes.CodexInstructionsPath},
		MCP:    true,
	})
}

func TestGeminiCLI(t *testing.T) {
	// The prompt is --prompt=<prompt>, the last argument.
	bin := standIn(t, "gemini", "--prompt=")
	runtimetest.Run(t, runtimetest.Subject{
		Name: subagent.RuntimeGeminiCLI,
		Define: func(name, script string) subagent.Definition {
			return subagent.Definition{Name: name, Runtime: subagent.RuntimeGeminiCLI, Prompt: script,
				Sandbox: subagent.Sandbox{ReadPaths: []string{filepath.Dir(bin)}}}
		},
		Worker: func(c *worker.Config) { c.GeminiBin = bin },
		Taught: []string{runtimes.GeminiInstructionsPath, runtimes.GeminiSettingsPath},
		MCP:    true,
	})
}
