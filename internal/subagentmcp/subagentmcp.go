// Package subagentmcp is the sub-agent's side of Agora: require_input, a
// tool that writes the needs_input sentinel (pkg/sentinel) atomically, and
// report_progress, which appends a progress line, as a stdio MCP server a
// model calls and as the functions `agora needs-input` and `agora
// progress` use. Any binary that imports it serves the MCP server when started with
// AGORA_SUBAGENT_MCP=serve in its environment (the worker points the
// claude-code runtime's --mcp-config at its own executable that way), so a
// FROM scratch worker image needs nothing else. See docs/mcp.md.
package subagentmcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agora-dispatch/agora/internal/buildinfo"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/sentinel"
)

// EnvServe, set to "serve", makes a binary whose main calls ServeIfAsked
// serve the MCP server on stdin/stdout instead of doing its own work.
const EnvServe = "AGORA_SUBAGENT_MCP"

// ServerName is the MCP server's name in a client's configuration; the
// tool's full name in Claude Code is mcp__agora__require_input.
const ServerName = "agora"

// ServeIfAsked serves the require_input MCP server on stdin/stdout and
// exits the process when EnvServe is "serve"; otherwise it returns at once.
// A binary the worker may name as the server — the worker's own, since the
// claude-code runtime's MCP configuration starts it (Config) — calls it
// first thing in main (docs/mcp.md, "The sub-agent's side").
func ServeIfAsked() {
	if os.Getenv(EnvServe) != "serve" {
		return
	}
	if err := Serve(context.Background(), &mcp.StdioTransport{}); err != nil {
		fmt.Fprintln(os.Stderr, "agora sub-agent MCP server:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// ServeIfAskedInTest is ServeIfAsked for a test binary that the worker's
// runs may start as their MCP server; its TestMain calls it first. Started
// with EnvServe set to anything else, the binary exits (status 2) rather
// than run its tests again in the child.
func ServeIfAskedInTest() {
	ServeIfAsked()
	if os.Getenv(EnvServe) != "" {
		fmt.Fprintln(os.Stderr, "test binary started with", EnvServe, "did not serve")
		os.Exit(2)
	}
}

// StopMessage is what the sub-agent is told once its question is written.
const StopMessage = "Input requested. Stop now: end your turn without doing more work. You will be started again with the answer in your input file (.agora/input.json: \"answer\") and your partial_state."

// ErrNotInDispatch is returned outside an Agora dispatch: no workspace to
// write the question into.
var ErrNotInDispatch = errors.New("not inside an Agora dispatch: AGORA_WORKSPACE is not set (this asks the operator of a running dispatch; nothing was written)")

// Workspace returns the dispatch's workspace from the environment the
// worker gives a sub-agent, checking that the taught sentinel path is the
// one Agora reads.
func Workspace() (string, error) {
	ws := os.Getenv("AGORA_WORKSPACE")
	if ws == "" {
		return "", ErrNotInDispatch
	}
	if f := os.Getenv("AGORA_NEEDS_INPUT_FILE"); f != "" && filepath.Clean(f) != sentinel.Path(ws) {
		return "", fmt.Errorf("AGORA_NEEDS_INPUT_FILE=%s is not %s, the file Agora reads; nothing was written", f, sentinel.Path(ws))
	}
	return ws, nil
}

// RequireInput validates r against the sentinel contract and writes it as
// the dispatch's question, atomically. replaced reports that an earlier
// question of this run was there and is replaced (one question per
// dispatch: the last call wins). Nothing is written when r is invalid.
func RequireInput(workspace string, r sentinel.Request) (replaced bool, err error) {
	_, statErr := os.Lstat(sentinel.Path(workspace))
	if err := sentinel.Write(workspace, r); err != nil { // validates first
		return false, err
	}
	return statErr == nil, nil
}

// RequireInputArgs are the require_input tool's arguments.
type RequireInputArgs struct {
	Question     string          `json:"question" jsonschema:"one clear question for the operator"`
	Options      []string        `json:"options,omitempty" jsonschema:"the answers you can act on; leave out for a free-text answer"`
	Kind         string          `json:"kind,omitempty" jsonschema:"clarification, decision, information or approval"`
	Context      string          `json:"context,omitempty" jsonschema:"what the person needs to know to answer, in plain text"`
	PartialState json.RawMessage `json:"partial_state,omitempty"`
	DedupeKey    string          `json:"dedupe_key,omitempty" jsonschema:"a short stable name for the decision you ask for, the same in every run and sub-agent that could ask it (e.g. config-loader-name, not the question's wording): sibling sub-agents asking with the same key wait on one question, answered once, and a route that remembers decisions may answer it from an earlier one. Leave it out for a question only this run would ask. At most 256 bytes, no control characters"`
	Reuse        *bool           `json:"reuse,omitempty" jsonschema:"false asks for a fresh answer: never answer this question from a remembered earlier decision (use it when circumstances changed since it may have been asked before); leave out otherwise"`
}

// RequireInputResult is the tool's structured result.
type RequireInputResult struct {
	Written  string `json:"written" jsonschema:"the question file Agora reads"`
	Replaced bool   `json:"replaced" jsonschema:"an earlier question of this run was replaced: only the last one is asked"`
	Next     string `json:"next"`
}

const requireInputDesc = `Ask the operator a question instead of guessing, when the task is ambiguous and only they can decide (which of two functions to change, whether a risky step is approved, a fact you cannot find out yourself). Save your analysis so far in partial_state. After calling it, STOP: end your turn without doing more work. Agora routes the question to a person and starts you again with the answer ("answer" in your input file) and your partial_state. Calling it again replaces the earlier question (one question per run). When other sub-agents working on the same task may hit the same decision, give it a dedupe_key naming the decision (e.g. "config-loader-name"): they are all asked once and resumed with the one answer.`

// Server returns the sub-agent's MCP server with the require_input tool.
func Server() *mcp.Server {
	srv := mcp.NewServer(&mcp.Implementation{Name: ServerName, Title: "Agora (sub-agent)", Version: buildinfo.Version()}, &mcp.ServerOptions{
		Instructions: "You run unattended under Agora. When only the operator can decide, call require_input with your question and your analysis so far, then stop.",
	})
	// partial_state is any JSON, kept byte for byte: a json.RawMessage,
	// whose inferred schema would be a byte array, so it is declared.
	in, err := jsonschema.For[RequireInputArgs](&jsonschema.ForOptions{TypeSchemas: map[reflect.Type]*jsonschema.Schema{
		reflect.TypeFor[json.RawMessage](): {Description: "your analysis so far (any JSON): options considered, what you ruled out and why, tentative conclusions, next steps; you get it back when resumed"},
	}})
	if err != nil {
		panic(err) // a static type: cannot fail
	}
	mcp.AddTool(srv, &mcp.Tool{Name: "require_input", Title: "Ask the operator", Description: requireInputDesc, InputSchema: in},
		func(_ context.Context, _ *mcp.CallToolRequest, in RequireInputArgs) (*mcp.CallToolResult, *RequireInputResult, error) {
			ws, err := Workspace()
			if err != nil {
				return nil, nil, err
			}
			r := sentinel.Request{Question: in.Question, Options: in.Options, Kind: sentinel.Kind(in.Kind), Context: in.Context,
				DedupeKey: in.DedupeKey, Reuse: in.Reuse}
			if len(in.PartialState) > 0 && string(in.PartialState) != "null" {
				r.PartialState = in.PartialState
			}
			replaced, err := RequireInput(ws, r)
			if err != nil {
				return nil, nil, fmt.Errorf("%v: nothing was written; fix the call and try again", err)
			}
			next := StopMessage
			if replaced {
				next = "This replaced your earlier question: only this one is asked. " + next
			}
			return nil, &RequireInputResult{Written: sentinel.Path(ws), Replaced: replaced, Next: next}, nil
		})
	addReportProgress(srv)
	return srv
}

// Serve runs the sub-agent's MCP server on t until the client disconnects.
func Serve(ctx context.Context, t mcp.Transport) error {
	return Server().Run(ctx, t)
}

// Config returns the JSON of an MCP client configuration (Claude Code's
// --mcp-config) that starts exe as this server.
func Config(exe string) []byte {
	b, _ := json.Marshal(map[string]any{"mcpServers": map[string]any{ServerName: map[string]any{
		"type": "stdio", "command": exe, "args": []string{}, "env": map[string]string{EnvServe: "serve"},
	}}})
	return b
}

// ReportProgress appends one progress line to the dispatch's
// .agora/progress.jsonl (lifecycle.ProgressFile), which the worker tails
// and publishes (docs/progress.md). The line is checked as the worker will
// read it; a bad one is refused and nothing is written.
func ReportProgress(workspace string, p ProgressArgs) error {
	line, err := json.Marshal(p)
	if err != nil {
		return err
	}
	if _, _, _, err := lifecycle.ParseProgressLine(line); err != nil {
		return fmt.Errorf("progress: %v", err)
	}
	root, err := os.OpenRoot(workspace)
	if err != nil {
		return err
	}
	defer root.Close()
	f, err := root.OpenFile(lifecycle.ProgressFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("progress: %w", err)
	}
	// One write of one line: appends from concurrent writers do not
	// interleave within it.
	if _, err := f.Write(append(line, '\n')); err != nil {
		f.Close()
		return fmt.Errorf("progress: %w", err)
	}
	return f.Close()
}

// ProgressArgs are a progress line: the report_progress tool's arguments.
type ProgressArgs struct {
	Message string                   `json:"message,omitempty" jsonschema:"what you are doing now, in one line"`
	Percent *float64                 `json:"percent,omitempty" jsonschema:"how far along you are, 0 to 100"`
	Todo    []lifecycle.ProgressTodo `json:"todo,omitempty" jsonschema:"your to-do list, each item with done true or false"`
}

const reportProgressDesc = `Tell the operator how your work goes while you run: what you are doing (message), how far along you are (percent, 0-100), and your to-do list. Call it at milestones, not for every small step; it never stops or slows your work. Reports are shown live to whoever follows the dispatch.`

func addReportProgress(srv *mcp.Server) {
	mcp.AddTool(srv, &mcp.Tool{Name: "report_progress", Title: "Report progress", Description: reportProgressDesc},
		func(_ context.Context, _ *mcp.CallToolRequest, in ProgressArgs) (*mcp.CallToolResult, *struct {
			Recorded bool `json:"recorded"`
		}, error) {
			ws, err := Workspace()
			if err != nil {
				return nil, nil, err
			}
			if err := ReportProgress(ws, in); err != nil {
				return nil, nil, fmt.Errorf("%v: nothing was recorded", err)
			}
			return nil, &struct {
				Recorded bool `json:"recorded"`
			}{true}, nil
		})
}
