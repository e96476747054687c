package runtimes

import (
	"cmp"
	"errors"
	"path/filepath"

	"github.com/agora-dispatch/agora/internal/subagentmcp"
	"github.com/agora-dispatch/agora/pkg/runtime"
	"github.com/agora-dispatch/agora/pkg/subagent"
)

// ClaudeCode runs the claude CLI non-interactively (--print, JSON
// output) with the prompt rendered from the definition. Unless the
// helpers are off it lays down the agora-needs-input skill and an MCP
// configuration that starts the require_input tool.
type ClaudeCode struct {
	// Bin is the claude executable (default: claude on the run's PATH).
	Bin string
}

// claudeCodeSpec is the claude-code runtime's entry in the registry.
var claudeCodeSpec = Spec{Name: subagent.RuntimeClaudeCode, Bin: "claude", New: func(bin string) runtime.Runtime { return ClaudeCode{Bin: bin} }}

// MCPConfigPath is where the claude-code runtime writes its MCP
// configuration, relative to the workspace.
const MCPConfigPath = ".agora/mcp.json"

// SkillPath is where the claude-code runtime writes the needs-input skill.
const SkillPath = ".claude/skills/agora-needs-input/SKILL.md"

// Command implements runtime.Runtime.
func (c ClaudeCode) Command(inv runtime.Invocation) (runtime.Command, error) {
	prompt, err := RenderPrompt(inv.Definition.Prompt, inv.Input)
	if err != nil {
		return runtime.Command{}, err
	}
	var cmd runtime.Command
	bin := cmp.Or(c.Bin, claudeCodeSpec.Bin)
	cmd.Args = []string{bin, "--print", "--output-format", "json"}
	if inv.Definition.Model != "" {
		cmd.Args = append(cmd.Args, "--model", inv.Definition.Model)
	}
	if inv.Definition.Permission != subagent.PermissionStrict {
		cmd.Args = append(cmd.Args, "--dangerously-skip-permissions")
	}
	if !inv.Helper.Disabled {
		if inv.Helper.MCPServer != "" {
			cmd.Files = append(cmd.Files, runtime.File{Path: MCPConfigPath, Data: subagentmcp.Config(inv.Helper.MCPServer)})
			cmd.Args = append(cmd.Args, "--mcp-config", filepath.Join(inv.Workspace, MCPConfigPath))
		}
		cmd.Files = append(cmd.Files, runtime.File{Path: SkillPath, Data: []byte(Skill(inv.Helper.NeedsInputFile))})
	}
	cmd.Args = append(cmd.Args, prompt)
	return cmd, nil
}

// Validate implements runtime.Validator.
func (ClaudeCode) Validate(def subagent.Definition) error {
	if def.Prompt == "" {
		return errors.New("runtime claude-code needs a prompt")
	}
	return nil
}
