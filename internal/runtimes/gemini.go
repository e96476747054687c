package runtimes

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/agora-dispatch/agora/internal/subagentmcp"
	"github.com/agora-dispatch/agora/pkg/runtime"
	"github.com/agora-dispatch/agora/pkg/subagent"
)

// GeminiCLI runs Google's Gemini CLI headless (gemini --prompt, JSON
// output) with the prompt rendered from the definition. Unless the helpers
// are off it lays down GEMINI.md, the context file Gemini CLI reads in its
// workspace, and the workspace settings .gemini/settings.json with the
// require_input MCP server (docs/subagents.md, "gemini-cli").
//
// Agora's sandbox is the box: Gemini CLI's own sandbox (a container) stays
// off, the workspace is trusted for the run, and tools are approved
// without asking (--approval-mode yolo); permission_mode strict keeps
// Gemini CLI's own approvals (--approval-mode default), which headless
// runs deny. The trust is GEMINI_CLI_TRUST_WORKSPACE=true, set through
// env(1) since a runtime sets no environment: a run's home is new, so no
// folder is trusted yet, and Gemini CLI runs no headless session in an
// untrusted one; its --skip-trust flag comes too late to load the
// workspace settings.
type GeminiCLI struct {
	// Bin is the gemini executable (default: gemini on the run's PATH).
	Bin string
}

// geminiCLISpec is the gemini-cli runtime's entry in the registry.
var geminiCLISpec = Spec{Name: subagent.RuntimeGeminiCLI, Bin: "gemini", New: func(bin string) runtime.Runtime { return GeminiCLI{Bin: bin} }}

// Where the gemini-cli runtime writes its files, relative to the
// workspace.
const (
	GeminiInstructionsPath = "GEMINI.md"
	GeminiSettingsPath     = ".gemini/settings.json"
)

// Command implements runtime.Runtime.
func (g GeminiCLI) Command(inv runtime.Invocation) (runtime.Command, error) {
	prompt, err := RenderPrompt(inv.Definition.Prompt, inv.Input)
	if err != nil {
		return runtime.Command{}, err
	}
	bin := cmp.Or(g.Bin, geminiCLISpec.Bin)
	if strings.Contains(bin, "=") {
		return runtime.Command{}, fmt.Errorf("gemini CLI %q: env(1) would take a name with '=' for a variable", bin)
	}
	cmd := runtime.Command{Args: []string{"env", "GEMINI_CLI_TRUST_WORKSPACE=true", bin, "--output-format", "json"}}
	if inv.Definition.Model != "" {
		cmd.Args = append(cmd.Args, "--model", inv.Definition.Model)
	}
	mode := "yolo"
	if inv.Definition.Permission == subagent.PermissionStrict {
		mode = "default"
	}
	cmd.Args = append(cmd.Args, "--approval-mode", mode)
	if !inv.Helper.Disabled {
		if inv.Helper.MCPServer != "" {
			// trust: the tool is called without a confirmation, which a
			// headless run could not give.
			settings, err := json.Marshal(map[string]any{"mcpServers": map[string]any{subagentmcp.ServerName: map[string]any{
				"command": inv.Helper.MCPServer, "env": helperEnv(inv), "trust": true,
			}}})
			if err != nil {
				return runtime.Command{}, err
			}
			cmd.Files = append(cmd.Files, runtime.File{Path: GeminiSettingsPath, Data: settings})
		}
		cmd.Files = append(cmd.Files, runtime.File{Path: GeminiInstructionsPath, Data: []byte(Instructions(inv.Helper.NeedsInputFile))})
	}
	// One argument, so that a prompt starting with a dash is its value.
	cmd.Args = append(cmd.Args, "--prompt="+prompt)
	return cmd, nil
}

// Validate implements runtime.Validator.
func (GeminiCLI) Validate(def subagent.Definition) error {
	if def.Prompt == "" {
		return errors.New("runtime gemini-cli needs a prompt")
	}
	return nil
}
