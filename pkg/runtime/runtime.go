// Package runtime is the seam between Agora's worker and the programs it
// runs as sub-agents: a Runtime turns one run of a sub-agent into the
// command line the worker starts and the files it lays down in the run's
// workspace first (an instruction overlay that teaches the needs-input
// convention, an MCP configuration). The worker, and only the worker,
// starts that command, always inside the run's sandbox; a Runtime has no
// way to start a process of its own (docs/subagents.md, "Writing a
// runtime").
//
// A runtime reads its end as every sub-agent's is read: the sentinel file,
// the output file, the exit status (docs/wire.md, "The sentinel file").
// What a CLI prints is kept as the run's stdout and stderr tails.
package runtime

import (
	"encoding/json"

	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
)

// Runtime makes the command of one run.
type Runtime interface {
	// Command returns what the worker runs for inv. An error fails the
	// dispatch with its text (a prompt template that does not render,
	// say); it is not retried.
	Command(inv Invocation) (Command, error)
}

// Validator is implemented by a runtime that needs more of a definition
// than every runtime does (a prompt, say). The worker calls it before a
// run and refuses the dispatch with its error.
type Validator interface {
	Validate(def subagent.Definition) error
}

// Invocation is one run of a sub-agent, as a runtime sees it.
type Invocation struct {
	Definition subagent.Definition
	Request    lifecycle.Request
	// Input is the whole input object the worker wrote to
	// .agora/input.json: on a resume with answer and partial_state.
	Input map[string]json.RawMessage
	// Workspace is the run's directory, its working directory.
	Workspace string
	// Env is the run's whole default-deny environment: AGORA_INPUT_FILE,
	// AGORA_OUTPUT_FILE, AGORA_NEEDS_INPUT_FILE and the rest.
	Env []string
	// Helper is how the run is taught to ask.
	Helper Helper
}

// Helper is how a run is taught the needs-input convention.
type Helper struct {
	// Disabled is set when the operator turned the helpers off
	// (AGORA_DISABLE_NEEDS_INPUT_HELPER=true): the runtime lays down no
	// instruction overlay and no MCP configuration.
	Disabled bool
	// MCPServer is the executable that serves the require_input MCP tool
	// over stdio when started with MCPEnv; "" when there is none.
	MCPServer string
	// MCPEnv is the environment entry (NAME=value) that makes MCPServer
	// serve the tool.
	MCPEnv string
	// NeedsInputFile is the absolute path of the sentinel file the
	// worker reads when the run ends.
	NeedsInputFile string
}

// Command is what the worker runs.
type Command struct {
	// Args is the command line; Args[0] is looked up on the run's own
	// PATH (Env) when it has no slash, and must be visible in the
	// sandbox (sandbox.read_paths).
	Args []string
	// Files are laid down in the workspace before the definition's own
	// files, which override them.
	Files []File
}

// File is a file a runtime lays down in the workspace.
type File struct {
	// Path is relative to the workspace, with no "..", as a definition's
	// files are (subagent.ValidFilePath), or a file directly in .agora
	// under a name Agora does not use itself (input.json, output.json,
	// needs_input.json, progress.jsonl, artifacts, tmp, home).
	Path string
	Data []byte
}
