package subagentmcp_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agora-dispatch/agora/internal/subagentmcp"
	"github.com/agora-dispatch/agora/pkg/sentinel"
)

func TestMain(m *testing.M) {
	subagentmcp.ServeIfAskedInTest()
	os.Exit(m.Run())
}

// connect starts this test binary as the sub-agent's MCP server
// (TestMain serves it when AGORA_SUBAGENT_MCP=serve), with env, over
// stdio, as Claude Code starts the server its --mcp-config names.
func connect(t *testing.T, env ...string) *mcp.ClientSession {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		MCPServers map[string]struct {
			Command string            `json:"command"`
			Args    []string          `json:"args"`
			Env     map[string]string `json:"env"`
		} `json:"mcpServers"`
	}
	if err := json.Unmarshal(subagentmcp.Config(exe), &cfg); err != nil {
		t.Fatal(err)
	}
	srv := cfg.MCPServers["agora"]
	cmd := exec.Command(srv.Command, srv.Args...)
	cmd.Env = env
	for k, v := range srv.Env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	c := mcp.NewClient(&mcp.Implementation{Name: "model", Version: "1"}, nil)
	cs, err := c.Connect(t.Context(), &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

func call(t *testing.T, cs *mcp.ClientSession, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "require_input", Arguments: args})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func text(res *mcp.CallToolResult) string {
	var s []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			s = append(s, tc.Text)
		}
	}
	return strings.Join(s, " ")
}

func TestRequireInputWritesTheSentinel(t *testing.T) {
	ws := t.TempDir()
	cs := connect(t, "AGORA_WORKSPACE="+ws, "AGORA_NEEDS_INPUT_FILE="+sentinel.Path(ws))
	tools, err := cs.ListTools(t.Context(), nil)
	if err != nil || len(tools.Tools) != 2 || tools.Tools[0].Name != "report_progress" || tools.Tools[1].Name != "require_input" || !strings.Contains(tools.Tools[1].Description, "STOP") {
		t.Fatalf("tools = %+v %v", tools, err)
	}
	res := call(t, cs, map[string]any{"question": "Rewrite A or B?", "options": []string{"A", "B"}, "kind": "decision",
		"context": "same signature", "partial_state": json.RawMessage(`{"analysis": "done", "n": 2.5, "steps": ["a", "b"]}`)})
	if res.IsError || !strings.Contains(text(res), "Stop now") {
		t.Fatalf("require_input: %v %s", res.IsError, text(res))
	}
	r, err := sentinel.Resolve(ws)
	if err != nil || r.Status != sentinel.Valid {
		t.Fatalf("resolve = %+v %v", r, err)
	}
	q := r.Request
	if q.Question != "Rewrite A or B?" || !slices.Equal(q.Options, []string{"A", "B"}) || q.Kind != "decision" || q.Context != "same signature" ||
		string(q.PartialState) != `{"analysis":"done","n":2.5,"steps":["a","b"]}` {
		t.Errorf("sentinel = %+v", q)
	}

	// A second call replaces the first, and says so.
	res = call(t, cs, map[string]any{"question": "Deploy now?", "kind": "approval"})
	if res.IsError || !strings.Contains(text(res), "replaced your earlier question") {
		t.Fatalf("second call: %s", text(res))
	}
	if r, _ := sentinel.Resolve(ws); r.Request.Question != "Deploy now?" || r.Request.Kind != "approval" || r.Request.Options != nil {
		t.Errorf("after the second call: %+v", r.Request)
	}
}

// dedupe_key and reuse reach the sentinel, and the tool's schema tells a
// model when to give a key.
func TestRequireInputDedupeKeyAndReuse(t *testing.T) {
	ws := t.TempDir()
	cs := connect(t, "AGORA_WORKSPACE="+ws)
	tools, err := cs.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var tool *mcp.Tool
	for _, tl := range tools.Tools {
		if tl.Name == "require_input" {
			tool = tl
		}
	}
	schema, _ := json.Marshal(tool.InputSchema)
	var in struct {
		Properties map[string]struct {
			Type        any    `json:"type"`
			Description string `json:"description"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(schema, &in); err != nil {
		t.Fatal(err)
	}
	if d := in.Properties["dedupe_key"].Description; !strings.Contains(d, "config-loader-name") || !strings.Contains(d, "sibling sub-agents") {
		t.Errorf("dedupe_key's description = %q", d)
	}
	if d := in.Properties["reuse"].Description; !strings.Contains(d, "fresh answer") {
		t.Errorf("reuse's description = %q", d)
	}
	if !strings.Contains(tool.Description, "dedupe_key") {
		t.Errorf("the tool's description does not teach dedupe_key: %q", tool.Description)
	}

	res := call(t, cs, map[string]any{"question": "Rename to readConfig or parseConfig?", "options": []string{"readConfig", "parseConfig"},
		"dedupe_key": "config-loader-name", "reuse": false})
	if res.IsError || !strings.Contains(text(res), "Stop now") {
		t.Fatalf("require_input with dedupe_key and reuse: %s", text(res))
	}
	r, err := sentinel.Resolve(ws)
	if err != nil || r.Status != sentinel.Valid {
		t.Fatalf("resolve = %+v %v", r, err)
	}
	if r.Request.DedupeKey != "config-loader-name" || r.Request.Reuse == nil || *r.Request.Reuse {
		t.Errorf("sentinel dedupe_key %q, reuse %v", r.Request.DedupeKey, r.Request.Reuse)
	}
	res = call(t, cs, map[string]any{"question": "q", "reuse": true})
	if r, _ := sentinel.Resolve(ws); res.IsError || r.Request.DedupeKey != "" || r.Request.Reuse == nil || !*r.Request.Reuse {
		t.Errorf("reuse true: %s %+v", text(res), r.Request)
	}
	res = call(t, cs, map[string]any{"question": "q"})
	if r, _ := sentinel.Resolve(ws); res.IsError || r.Request.DedupeKey != "" || r.Request.Reuse != nil {
		t.Errorf("without them: %s %+v", text(res), r.Request)
	}
}

func TestRequireInputRefusesBadCalls(t *testing.T) {
	ws := t.TempDir()
	cs := connect(t, "AGORA_WORKSPACE="+ws)
	for _, c := range []struct {
		name string
		args map[string]any
		want string
	}{
		{"empty question", map[string]any{"question": "  "}, "question"},
		{"bad kind", map[string]any{"question": "q", "kind": "vote"}, "kind"},
		{"empty option", map[string]any{"question": "q", "options": []string{"A", ""}}, "options[1]"},
		{"state over the cap", map[string]any{"question": "q", "partial_state": strings.Repeat("x", sentinel.MaxSize)}, "1048576"},
		{"dedupe key with a newline", map[string]any{"question": "q", "dedupe_key": "a\nb"}, "dedupe_key: must not hold control characters"},
		{"dedupe key too long", map[string]any{"question": "q", "dedupe_key": strings.Repeat("k", sentinel.MaxDedupeKey+1)}, "dedupe_key: longer than 256 bytes"},
	} {
		res := call(t, cs, c.args)
		if !res.IsError || !strings.Contains(text(res), c.want) || !strings.Contains(text(res), "nothing was written") {
			t.Errorf("%s: %v %s", c.name, res.IsError, text(res))
		}
		if _, err := os.Stat(sentinel.Path(ws)); !os.IsNotExist(err) {
			t.Fatalf("%s wrote a sentinel", c.name)
		}
	}
	// Outside a dispatch there is nowhere to write.
	out := connect(t)
	if res := call(t, out, map[string]any{"question": "q"}); !res.IsError || !strings.Contains(text(res), "not inside an Agora dispatch") {
		t.Errorf("outside a dispatch: %s", text(res))
	}
	// A needs-input path other than the workspace's is refused.
	other := connect(t, "AGORA_WORKSPACE="+ws, "AGORA_NEEDS_INPUT_FILE="+filepath.Join(t.TempDir(), "x.json"))
	if res := call(t, other, map[string]any{"question": "q"}); !res.IsError || !strings.Contains(text(res), "the file Agora reads") {
		t.Errorf("a foreign AGORA_NEEDS_INPUT_FILE: %s", text(res))
	}
}

// report_progress appends checked lines to the progress file the worker
// tails; a bad one is refused and nothing is written.
func TestReportProgress(t *testing.T) {
	ws := t.TempDir()
	if err := os.Mkdir(filepath.Join(ws, ".agora"), 0o700); err != nil {
		t.Fatal(err)
	}
	cs := connect(t, "AGORA_WORKSPACE="+ws)
	for _, args := range []map[string]any{
		{"message": "reading the code", "percent": 10},
		{"todo": []map[string]any{{"text": "fix", "done": true}}},
	} {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "report_progress", Arguments: args})
		if err != nil || res.IsError {
			t.Fatalf("report_progress %v: %v %s", args, err, text(res))
		}
	}
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "report_progress", Arguments: map[string]any{"percent": 250}})
	if err != nil || !res.IsError || !strings.Contains(text(res), "percent") {
		t.Errorf("percent 250: %v %s", err, text(res))
	}
	b, err := os.ReadFile(filepath.Join(ws, ".agora", "progress.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 2 || lines[0] != `{"message":"reading the code","percent":10}` || lines[1] != `{"todo":[{"text":"fix","done":true}]}` {
		t.Errorf("progress file = %q", lines)
	}
}
