package main_test

import (
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// mcpCall calls a tool and returns its structured content.
func mcpCall(t *testing.T, cs *mcp.ClientSession, tool string, args map[string]any) map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	if res.IsError {
		t.Fatalf("%s: tool error: %v", tool, res.Content)
	}
	b, _ := json.Marshal(res.StructuredContent)
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// `agora mcp` over stdio, as `claude mcp add agora -- agora mcp` runs it:
// a client without elicitation gets the demo's question, answers it with
// agora_answer (recorded as mcp:$USER) and follows the thread to its end.
func TestMCPStdio(t *testing.T) {
	t.Parallel()
	d := devServer(t)
	cmd := exec.Command(agoraBin, "mcp", "--nats", d.natsURL)
	cmd.Env = append(cleanEnv(), "USER=tester")
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	cs, err := c.Connect(t.Context(), &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	out := mcpCall(t, cs, "agora_dispatch", map[string]any{"subagent": "demo", "input": map[string]any{"task": "rename the config loader"}})
	if out["status"] != "needs_input" || !strings.Contains(out["question"].(string), "Which function") {
		t.Fatalf("dispatch = %v", out)
	}
	qid, thread := out["question_id"].(string), out["thread_id"].(string)
	opts := out["options"].([]any)
	mcpCall(t, cs, "agora_answer", map[string]any{"question_id": qid, "answer": opts[1]})
	fin := mcpCall(t, cs, "agora_dispatch", map[string]any{"thread_id": thread})
	if fin["status"] != "finished" || fin["output"].(map[string]any)["renamed"] != opts[1] {
		t.Fatalf("following on = %v", fin)
	}
	qs := jsonLines(t, mustAgora(t, "questions", "--status", "all", "--thread", thread, "--json").stdout)
	if len(qs) != 1 || qs[0]["answered_by"] != "mcp:tester" {
		t.Errorf("question = %v, want answered by mcp:tester", qs)
	}
}

// agora dev serves the same tools at /mcp (streamable HTTP): a client of
// protocol 2026-07-28 is asked through an input-required result and the
// thread finishes with its answer.
func TestMCPHTTPOnDev(t *testing.T) {
	t.Parallel()
	d := devServer(t)
	asked := 0
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, &mcp.ClientOptions{
		ElicitationHandler: func(_ context.Context, r *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			asked++
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"answer": "parseConfig"}}, nil
		}})
	cs, err := c.Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: d.httpURL + "/mcp"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	out := mcpCall(t, cs, "agora_dispatch", map[string]any{"subagent": "demo", "input": map[string]any{"task": "rename the config loader"}})
	if out["status"] != "finished" || out["output"].(map[string]any)["renamed"] != "parseConfig" || asked != 1 {
		t.Fatalf("dispatch = %v (asked %d times)", out, asked)
	}
}
