package runtimes

import (
	"fmt"
	"strings"

	"github.com/agora-dispatch/agora/pkg/runtime"
	"github.com/agora-dispatch/agora/pkg/sentinel"
)

// Skill returns the agora-needs-input helper skill taught to claude-code
// sub-agents, naming the absolute sentinel path the worker will check.
func Skill(sentinelPath string) string {
	return `---
name: agora-needs-input
description: Use when the task is ambiguous and only the operator can decide (which of two functions to change, whether a risky step is approved, a fact you cannot find). Ask through Agora instead of guessing, then stop.
---

` + convention(sentinelPath, "mcp__agora__require_input")
}

// Instructions returns the same convention as Skill for a CLI taught
// through a project instruction file (codex's AGENTS.md, gemini-cli's
// GEMINI.md), whose require_input tool comes from the MCP server named
// agora.
func Instructions(sentinelPath string) string {
	return convention(sentinelPath, "from the agora MCP server")
}

// helperEnv is the whole environment of the require_input MCP server for
// a CLI that does not pass its own on to the servers it starts (codex
// passes a short list of names): Helper.MCPEnv, and the workspace and
// sentinel the server writes the question to.
func helperEnv(inv runtime.Invocation) map[string]string {
	env := map[string]string{"AGORA_WORKSPACE": inv.Workspace}
	if inv.Helper.NeedsInputFile != "" {
		env["AGORA_NEEDS_INPUT_FILE"] = inv.Helper.NeedsInputFile
	}
	if k, v, ok := strings.Cut(inv.Helper.MCPEnv, "="); ok {
		env[k] = v
	}
	return env
}

// convention is the needs-input convention; tool says how the CLI names
// the require_input tool.
func convention(sentinelPath, tool string) string {
	return fmt.Sprintf(`# Ask instead of guessing

You run unattended under Agora. Nobody reads your chat. When you reach a
decision that only the operator can make, do not pick one yourself and do not
stop silently. Write a question file and end your run; Agora routes the
question to the right person, and you are started again with the answer.

## When to ask
- Two or more reasonable readings of the task lead to different changes.
- A step is destructive or hard to undo and the task did not clearly ask for it.
- You need a fact (a name, a limit, a credential's owner) that is not in the
  workspace and that you cannot look up.
Do not ask about things you can find out yourself by reading the code or
running a command.

## How to ask
If you have the require_input tool (%s), call it with
the fields below, then finish your turn without doing more work. It checks
your question and writes it for you.

Otherwise write this JSON file yourself, then finish your turn without doing
more work:

    %s

    {
      "question": "Rename parseConfig or loadConfig?",
      "options": ["parseConfig", "loadConfig"],
      "context": "Both read config.yaml; parseConfig has 3 callers, loadConfig 11.",
      "kind": "decision",
      "partial_state": {
        "considered": ["parseConfig", "loadConfig"],
        "ruled_out": {"readConfig": "only used in tests"},
        "tentative": "loadConfig looks like the public entry point",
        "next_steps": ["rename", "update callers", "run go test ./..."]
      }
    }

Fields:
- "question" (required): one clear question, a non-empty string.
- "options": the answers you can act on, as strings. Leave it out for a free-text answer.
- "context": what the person needs to know to answer, in plain text.
- "kind": one of "clarification", "decision", "information", "approval".
- "partial_state": any JSON. Save your analysis so far here: options you
  considered, what you ruled out and why, tentative conclusions, and the
  remaining steps, so the next run does not redo the work.

The whole file must be at most %d bytes (1 MiB) and must be a regular file
(not a link). Use exactly the path above (also in $AGORA_NEEDS_INPUT_FILE).

## Files to keep, and progress
Your workspace is deleted when you exit. Put files the operator should see —
a patch, a report, a plot — under $AGORA_ARTIFACTS_DIR (.agora/artifacts/,
folders allowed): they are kept and listed with your result, also when you
ask a question (an approver sees the change before deciding). Report
progress on long work with the report_progress tool if you have it, or by
appending a JSON line such as {"message": "running the tests", "percent": 60}
to $AGORA_PROGRESS_FILE (.agora/progress.jsonl).

## When you are started again
Your input file ($AGORA_INPUT_FILE, .agora/input.json) then holds the
original input plus "answer" (the operator's answer) and "partial_state"
(what you saved). Continue from the saved state; do not repeat the analysis.
Write your final result as JSON to $AGORA_OUTPUT_FILE (.agora/output.json).
`, tool, sentinelPath, sentinel.MaxSize)
}
