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

// cli is the Subject of a CLI runtime run against a stand-in of its CLI
// that runs its last argument (where the runtime puts the prompt), less
// prefix, with /bin/sh; the worker runs the stand-in as the runtime's
// CLI.
func cli(t *testing.T, name, prefix string, taught ...string) runtimetest.Subject {
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
	return runtimetest.Subject{
		Name: name,
		Define: func(def, script string) subagent.Definition {
			return subagent.Definition{Name: def, Runtime: name, Prompt: script, Sandbox: subagent.Sandbox{ReadPaths: []string{dir}}}
		},
		Worker: func(c *worker.Config) { c.Runtimes.Bins = map[string]string{name: bin} },
		Taught: taught,
		MCP:    true,
	}
}

func TestClaudeCode(t *testing.T) {
	runtimetest.Run(t, cli(t, subagent.RuntimeClaudeCode, "",
		runtimes.SkillPath, runtimes.MCPConfigPath))
}

func TestCodex(t *testing.T) {
	runtimetest.Run(t, cli(t, subagent.RuntimeCodex, "",
		runtimes.CodexInstructionsPath))
}

func TestGeminiCLI(t *testing.T) {
	// The prompt is --prompt=<prompt>, the last argument.
	runtimetest.Run(t, cli(t, subagent.RuntimeGeminiCLI, "--prompt=",
		runtimes.GeminiInstructionsPath, runtimes.GeminiSettingsPath))
}
