package runtimes

import (
	"cmp"
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"strings"

	"github.com/agora-dispatch/agora/internal/subagentmcp"
	"github.com/agora-dispatch/agora/pkg/runtime"
	"github.com/agora-dispatch/agora/pkg/subagent"
)

// Codex runs OpenAI's Codex CLI non-interactively (codex exec) with the
// prompt rendered from the definition. Unless the helpers are off it lays
// down AGENTS.md, which Codex reads in its working directory, and
// configures the require_input MCP server with -c overrides: codex exec
// takes no configuration file, its own (CODEX_HOME, default ~/.codex) lies
// in the run's private home where a runtime lays down nothing, and a
// runtime sets no environment (docs/subagents.md, "codex").
//
// Agora's sandbox is the box: by default Codex's own sandbox and approvals
// are off (--dangerously-bypass-approvals-and-sandbox, documented for "an
// externally hardened environment"); permission_mode strict keeps Codex's
// sandbox on as well (--sandbox workspace-write).
type Codex struct {
	// Bin is the codex executable (default: codex on the run's PATH).
	Bin string
}

// codexSpec is the codex runtime's entry in the registry.
var codexSpec = Spec{Name: subagent.RuntimeCodex, Bin: "codex", New: func(bin string) runtime.Runtime { return Codex{Bin: bin} }}

// CodexInstructionsPath is where the codex runtime writes the needs-input
// convention, relative to the workspace.
const CodexInstructionsPath = "AGENTS.md"

// Command implements runtime.Runtime.
func (c Codex) Command(inv runtime.Invocation) (runtime.Command, error) {
	prompt, err := RenderPrompt(inv.Definition.Prompt, inv.Input)
	if err != nil {
		return runtime.Command{}, err
	}
	if prompt == "-" {
		// codex exec then reads the prompt from stdin: /dev/null in a run.
		return runtime.Command{}, errors.New(`the prompt renders to "-", which codex exec takes as "read the prompt from stdin"`)
	}
	bin := cmp.Or(c.Bin, codexSpec.Bin)
	cmd := runtime.Command{Args: []string{bin, "exec", "--skip-git-repo-check"}}
	if inv.Definition.Model != "" {
		cmd.Args = append(cmd.Args, "--model", inv.Definition.Model)
	}
	if inv.Definition.Permission == subagent.PermissionStrict {
		cmd.Args = append(cmd.Args, "--sandbox", "workspace-write")
	} else {
		cmd.Args = append(cmd.Args, "--dangerously-bypass-approvals-and-sandbox")
	}
	if !inv.Helper.Disabled {
		if inv.Helper.MCPServer != "" {
			// Codex passes an MCP server only a few variables of its own
			// environment, so the server's whole environment is given.
			server := "mcp_servers." + subagentmcp.ServerName
			cmd.Args = append(cmd.Args, "-c", server+".command="+tomlString(inv.Helper.MCPServer))
			env := helperEnv(inv)
			for _, k := range slices.Sorted(maps.Keys(env)) {
				cmd.Args = append(cmd.Args, "-c", server+".env."+k+"="+tomlString(env[k]))
			}
		}
		cmd.Files = append(cmd.Files, runtime.File{Path: CodexInstructionsPath, Data: []byte(Instructions(inv.Helper.NeedsInputFile))})
	}
	// After "--" a prompt that starts with a dash is not read as a flag.
	cmd.Args = append(cmd.Args, "--", prompt)
	return cmd, nil
}

// tomlString quotes s as a TOML basic string, the value syntax of a -c
// override: JSON's string escapes are TOML's, but for DEL.
func tomlString(s string) string {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a string always encodes
	return strings.ReplaceAll(strings.TrimSuffix(b.String(), "\n"), "\x7f", `\u007f`)
}

// Validate implements runtime.Validator.
func (Codex) Validate(def subagent.Definition) error {
	if def.Prompt == "" {
		return errors.New("runtime codex needs a prompt")
	}
	return nil
}
