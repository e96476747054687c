package main_test

import (
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agora-dispatch/agora/internal/mcptest"
)

// mcpCall calls a tool and returns its structured content.
func mcpCall(t *testing.T, cs *mcp.ClientSession, tool string, args map[string]any) map[string]any {
	t.Helper()
	return mcptest.Structured(t, mcptest.Call(t, cs, tool, args))
}

// `agora mcp` over stdio, as `claude mcp add agora -- agora mcp` runs it:
// a client without elicitation gets the demo's question, answers it with
// agora_answer (recorded as mcp:local: the server takes anyone, and $USER proves nothing) and follows the thread to its end.
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
	if len(qs) != 1 || qs[0]["answered_by"] != "mcp:local" {
		t.Errorf("question = %v, want answered by mcp:local (USER=tester proves nothing)", qs)
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

// The sub-agent's two ways to ask — the agora needs-input verb and the
// require_input MCP tool served by the worker's own binary — each write a
// sentinel that the worker turns into needs_input with the same fields,
// the dedupe key and the opt-out of reuse among them; a bad key is refused
// naming the rule.
func TestSubagentAsksWithTheVerbAndTheTool(t *testing.T) {
	t.Parallel()
	devServer(t)
	verb, _ := json.Marshal(map[string]any{"name": "ask-verb", "runtime": "exec", "command": []string{agoraBin, "needs-input",
		"--question", "Ship it?", "--kind", "approval", "--context", "via the verb", "--partial-state", `{"k":"v","n":[1,2]}`, "--dedupe-key", "ship-decision", "--no-reuse"}})
	// A shell speaking MCP's JSON-RPC to `agora` started as the server.
	rpc := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"sh","version":"1"}}}
{"jsonrpc":"2.0","method":"notifications/initialized"}
{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"require_input","arguments":{"question":"Ship it?","kind":"approval","context":"via the tool","partial_state":{"k":"v","n":[1,2]},"dedupe_key":"ship-decision","reuse":false}}}`
	tool, _ := json.Marshal(map[string]any{"name": "ask-tool", "runtime": "exec", "command": []string{"sh", "-c",
		`{ printf '%s\n' "$1"; sleep 2; } | AGORA_SUBAGENT_MCP=serve "$0"`, agoraBin, rpc}})
	mustAgora(t, "subagent", "apply", "-f", writeFile(t, "ask-verb.json", string(verb)), "-f", writeFile(t, "ask-tool.json", string(tool)))
	for _, c := range []struct{ name, via string }{{"ask-verb", "via the verb"}, {"ask-tool", "via the tool"}} {
		r := agora(t, "dispatch", c.name, "--round", "--json")
		if r.code != 4 {
			t.Fatalf("%s: %s", c.name, r)
		}
		lines := jsonLines(t, r.stdout)
		data := lines[len(lines)-1]["data"].(map[string]any)
		ps, _ := json.Marshal(data["partial_state"])
		if data["question"] != "Ship it?" || data["kind"] != "approval" || data["context"] != c.via || string(ps) != `{"k":"v","n":[1,2]}` ||
			data["dedupe_key"] != "ship-decision" || data["reuse"] != false {
			t.Errorf("%s: needs_input = %v", c.name, data)
		}
	}
	// Outside a dispatch, or with a bad question, nothing is written.
	r := agoraWith(t, cleanEnv(), "needs-input", "--question", "q")
	if r.code != 1 || !strings.Contains(r.stderr, "not inside an Agora dispatch") {
		t.Errorf("needs-input outside a dispatch: %s", r)
	}
	ws := t.TempDir()
	r = agoraWith(t, append(cleanEnv(), "AGORA_WORKSPACE="+ws), "needs-input", "--question", " ", "--kind", "decision")
	if r.code != 1 || !strings.Contains(r.stderr, "--question") || !strings.Contains(r.stderr, "nothing was written") {
		t.Errorf("needs-input with an empty question: %s", r)
	}
	r = agoraWith(t, append(cleanEnv(), "AGORA_WORKSPACE="+ws), "needs-input", "--question", "q", "--partial-state", "{not json")
	if r.code != 1 || !strings.Contains(r.stderr, "--partial-state: not valid JSON") {
		t.Errorf("needs-input with bad state: %s", r)
	}
	r = agoraWith(t, append(cleanEnv(), "AGORA_WORKSPACE="+ws), "needs-input", "--question", "q", "--dedupe-key", "a\tb")
	if r.code != 1 || !strings.Contains(r.stderr, "--dedupe-key: must not hold control characters") || !strings.Contains(r.stderr, "without control characters, e.g.") {
		t.Errorf("needs-input with a bad dedupe key: %s", r)
	}
	r = agoraWith(t, append(cleanEnv(), "AGORA_WORKSPACE="+ws), "needs-input", "--question", "q", "--dedupe-key", strings.Repeat("k", 257))
	if r.code != 1 || !strings.Contains(r.stderr, "--dedupe-key: longer than 256 bytes") {
		t.Errorf("needs-input with a long dedupe key: %s", r)
	}
	if _, err := exec.Command("test", "-e", ws+"/.agora/needs_input.json").CombinedOutput(); err == nil {
		t.Error("a refused needs-input wrote the sentinel")
	}
	r = agoraWith(t, append(cleanEnv(), "AGORA_WORKSPACE="+ws), "needs-input", "--question", "q", "--option", "a", "--option", "b")
	r2 := agoraWith(t, append(cleanEnv(), "AGORA_WORKSPACE="+ws), "needs-input", "--question", "q2")
	if r.code != 0 || !strings.Contains(r.stdout, "Stop now") || r2.code != 0 || !strings.Contains(r2.stdout, "Replaced the earlier question") {
		t.Errorf("needs-input twice: %s\n%s", r, r2)
	}
}
