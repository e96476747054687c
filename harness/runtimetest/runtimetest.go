// Package runtimetest is the contract every Agora runtime passes
// (docs/subagents.md, "Writing a runtime"), as a suite a runtime's own
// test runs: Run starts the whole of Agora on a real JetStream (the
// dispatcher, a worker with the runtime, the router) and checks, through
// the client, what a sub-agent of that runtime can rely on — the
// convention taught (or not, with the helpers off), a question through
// the sentinel, the resume with the answer and the partial state, output,
// artifacts, progress, the time limit's SIGTERM then SIGKILL, a cancel
// mid-run, the default-deny environment and env_allow, the resolution of
// a non-zero exit with and without a sentinel, and that the run is
// contained: no capability, no way into the worker's process, no route to
// the worker's NATS.
//
// A runtime makes the sub-agent's behaviour out of a definition; the
// suite asks for a definition whose run executes a shell script in the
// workspace (Subject.Define). For exec that is the command itself; a CLI
// runtime passes the script through its prompt to a stand-in of its CLI
// that runs it, since the real CLI needs a model and a network.
package runtimetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/harness/systemtest"
	"github.com/agora-dispatch/agora/internal/subagentmcp"
	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/runtime"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/services/worker"
)

// Subject is a runtime under test.
type Subject struct {
	// Name is the runtime's name in a definition.
	Name string
	// Runtime is the runtime; nil for a built-in one.
	Runtime runtime.Runtime
	// Define returns a definition of this runtime named name whose run
	// executes script with /bin/sh in the workspace (script never holds
	// "{{"). The suite sets its timeout and env_allow.
	Define func(name, script string) subagent.Definition
	// Worker adjusts the worker's configuration (where a stand-in CLI
	// is, say).
	Worker func(*worker.Config)
	// Taught lists the workspace paths the runtime lays down to teach the
	// convention (its instruction overlay, its MCP configuration), none
	// of which is there with the helpers off.
	Taught []string
	// MCP says the runtime wires the require_input MCP tool
	// (runtime.Helper.MCPServer) into its CLI: the suite calls the tool
	// over stdio from inside a run, as the CLI would. The test binary is
	// then the tool's server: its TestMain calls
	// subagentmcp.ServeIfAskedInTest first.
	MCP bool
}

// Run checks s against the whole contract.
func Run(t *testing.T, s Subject) {
	t.Helper()
	sys := start(t, s, false)
	c := sys.Client
	define := func(t *testing.T, name, script string, mod ...func(*subagent.Definition)) {
		t.Helper()
		d := s.Define(name, script)
		d.Timeout = "1m"
		for _, f := range mod {
			f(&d)
		}
		if _, err := c.ApplySubagent(t.Context(), d); err != nil {
			t.Fatalf("apply %s: %v", name, err)
		}
	}

	t.Run("taught", func(t *testing.T) {
		define(t, "taught", `printf '{"needs_input_file":"%s","taught":"%s"}' "$AGORA_NEEDS_INPUT_FILE" "$(`+exists(s.Taught)+`)" > "$AGORA_OUTPUT_FILE"`)
		out := finish(t, c, "taught", nil)
		if out["needs_input_file"] == "" || out["taught"] != strings.Repeat("y", len(s.Taught)) {
			t.Errorf("the run saw %v: want AGORA_NEEDS_INPUT_FILE set and every one of %q laid down", out, s.Taught)
		}
	})

	t.Run("ask and resume", func(t *testing.T) {
		define(t, "asker", `if grep -q '"answered_by"' "$AGORA_INPUT_FILE"; then
  cp "$AGORA_INPUT_FILE" "$AGORA_OUTPUT_FILE"
else
  printf '%s' '{"question":"Rewrite A or B?","options":["A","B"],"context":"same signature","partial_state":{"read":["a.go","b.go"]}}' > "$AGORA_NEEDS_INPUT_FILE"
fi`)
		d := dispatch(t, c, "asker", nil)
		it := wait(t, d)
		ni, ok := it.Data.(*lifecycle.NeedsInput)
		if !ok || ni.Question != "Rewrite A or B?" || strings.Join(ni.Options, ",") != "A,B" || ni.Context != "same signature" {
			t.Fatalf("round 0 ended %+v, want the question asked", it.Data)
		}
		answer(t, c, ni.QuestionID, "B")
		end := follow(t, c, d.ThreadID)
		f, ok := end.Data.(*lifecycle.Finished)
		if !ok || f.Round != 1 {
			t.Fatalf("the thread ended %+v, want round 1 finished", end.Data)
		}
		var in struct {
			Answer       string          `json:"answer"`
			AnsweredBy   string          `json:"answered_by"`
			PartialState json.RawMessage `json:"partial_state"`
		}
		if err := json.Unmarshal(f.Output, &in); err != nil || in.Answer != "B" || in.AnsweredBy == "" || string(in.PartialState) != `{"read":["a.go","b.go"]}` {
			t.Errorf("round 1's input %s (%v): want the answer B and the partial state", f.Output, err)
		}
	})

	t.Run("require_input", func(t *testing.T) {
		if !s.MCP {
			t.Skipf("runtime %s wires no MCP tool", s.Name)
		}
		exe, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		define(t, "tool-asker", mcpCall(exe, `{"question":"Through the tool: A or B?","options":["A","B"],"partial_state":{"via":"mcp"}}`))
		ni, ok := wait(t, dispatch(t, c, "tool-asker", nil)).Data.(*lifecycle.NeedsInput)
		if !ok || ni.Question != "Through the tool: A or B?" || string(ni.PartialState) != `{"via":"mcp"}` {
			t.Fatalf("ended %+v, want the question the tool wrote", ni)
		}
	})

	t.Run("artifacts and progress", func(t *testing.T) {
		define(t, "maker", `printf '%s\n' '{"message":"half way","percent":50}' >> "$AGORA_PROGRESS_FILE"
printf 'report' > "$AGORA_ARTIFACTS_DIR/report.txt"
echo '{"ok":true}' > "$AGORA_OUTPUT_FILE"`)
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		d := dispatch(t, c, "maker", nil)
		var saw bool
		for it, err := range c.WatchProgress(ctx, client.Filter{ThreadID: d.ThreadID, FromStart: true}) {
			if err != nil {
				t.Fatal(err)
			}
			if it.Progress.Message == "half way" && it.Progress.Percent != nil && *it.Progress.Percent == 50 {
				saw = true
				break
			}
		}
		if !saw {
			t.Fatal("no progress report")
		}
		f, ok := wait(t, d).Data.(*lifecycle.Finished)
		if !ok || len(f.Artifacts) != 1 || f.Artifacts[0].Name != "report.txt" || f.Artifacts[0].Size != 6 {
			t.Fatalf("ended %+v, want finished with the artifact report.txt", f)
		}
	})

	t.Run("time limit", func(t *testing.T) {
		define(t, "stubborn", `trap '' TERM; while :; do sleep 0.1; done`, func(d *subagent.Definition) { d.Timeout = "2s" })
		start := time.Now()
		d := dispatch(t, c, "stubborn", nil)
		fl, ok := wait(t, d).Data.(*lifecycle.Failed)
		if !ok || fl.Reason != lifecycle.ReasonTimeout {
			t.Fatalf("ended %+v, want failed timeout", fl)
		}
		if took := time.Since(start); took > 30*time.Second {
			t.Errorf("a run ignoring SIGTERM ended %s after its 2s limit: the SIGKILL did not follow", took)
		}
	})

	t.Run("cancel mid-run", func(t *testing.T) {
		define(t, "runner", `printf '%s\n' '{"message":"running"}' >> "$AGORA_PROGRESS_FILE"; while :; do sleep 0.1; done`)
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		d := dispatch(t, c, "runner", nil)
		for it, err := range c.WatchProgress(ctx, client.Filter{ThreadID: d.ThreadID, FromStart: true}) {
			if err != nil {
				t.Fatal(err)
			}
			if it.Progress.Message == "running" {
				break
			}
		}
		if _, err := c.Cancel(t.Context(), d.DispatchID, client.CancelBy("runtimetest", "the suite cancels")); err != nil {
			t.Fatal(err)
		}
		if it := wait(t, d); it.Kind() != lifecycle.KindCancelled {
			t.Fatalf("ended %+v, want cancelled", it.Data)
		}
	})

	t.Run("environment", func(t *testing.T) {
		t.Setenv("RUNTIMETEST_WORKER_SECRET", "from the worker") // read by the worker's runs
		define(t, "env", `printf '{"secret":"%s","nats":"%s","allowed":"%s"}' "$RUNTIMETEST_WORKER_SECRET" "$AGORA_NATS_URL$NATS_URL" "$RUNTIMETEST_ALLOWED" > "$AGORA_OUTPUT_FILE"`,
			func(d *subagent.Definition) { d.EnvAllow = []string{"RUNTIMETEST_ALLOWED"} })
		out := finish(t, c, "env", nil, func(r *lifecycle.Request) { r.Env = map[string]string{"RUNTIMETEST_ALLOWED": "by env_allow"} })
		if out["secret"] != "" || out["nats"] != "" || out["allowed"] != "by env_allow" {
			t.Errorf("the run's environment gave %v: want nothing of the worker's, and the allowed variable", out)
		}
		_, err := c.Dispatch(t.Context(), lifecycle.Request{Subagent: "env", Env: map[string]string{"NOT_ALLOWED": "x"}})
		if err == nil || !strings.Contains(err.Error(), "NOT_ALLOWED") {
			t.Errorf("a request setting a variable env_allow does not name: %v, want it refused", err)
		}
	})

	t.Run("non-zero exit", func(t *testing.T) {
		define(t, "crasher", `echo boom >&2; exit 3`)
		fl, ok := wait(t, dispatch(t, c, "crasher", nil)).Data.(*lifecycle.Failed)
		if !ok || fl.Reason != lifecycle.ReasonProviderFailed || fl.ExitCode == nil || *fl.ExitCode != 3 {
			t.Errorf("exit 3 without a sentinel ended %+v, want failed provider-failed with exit code 3", fl)
		}
		define(t, "crash-asker", `printf '%s' '{"question":"Which one?"}' > "$AGORA_NEEDS_INPUT_FILE"; exit 3`)
		if ni, ok := wait(t, dispatch(t, c, "crash-asker", nil)).Data.(*lifecycle.NeedsInput); !ok || ni.Question != "Which one?" {
			t.Errorf("exit 3 with a sentinel ended %+v, want needs_input (the sentinel wins)", ni)
		}
	})

	t.Run("contained", func(t *testing.T) {
		host, port, err := net.SplitHostPort(strings.TrimPrefix(sys.Server.URL, "nats://"))
		if err != nil {
			t.Fatal(err)
		}
		define(t, "prober", `caps=$(awk '/^CapEff/ {print $2}' /proc/self/status)
if cat /proc/1/environ >/dev/null 2>&1; then init=readable; else init=refused; fi
if timeout 3 bash -c 'exec 3<>/dev/tcp/`+host+`/`+port+`' 2>/dev/null; then nats=reached; else nats=refused; fi
printf '{"capeff":"%s","init_environ":"%s","nats":"%s","uid":"%s"}' "$caps" "$init" "$nats" "$(id -u)" > "$AGORA_OUTPUT_FILE"`)
		out := finish(t, c, "prober", nil)
		if out["capeff"] != "0000000000000000" || out["init_environ"] != "refused" || out["nats"] != "refused" {
			t.Errorf("the run saw %v: want no capability, the environment of its PID 1 refused, and no route to NATS at %s:%s", out, host, port)
		}
		if uid, _ := strconv.Atoi(out["uid"]); uid == 0 {
			t.Errorf("the run is uid 0 (%v)", out)
		}
	})

	t.Run("helpers off", func(t *testing.T) {
		off := start(t, s, true)
		d := s.Define("untaught", `printf '{"taught":"%s"}' "$(`+exists(s.Taught)+`)" > "$AGORA_OUTPUT_FILE"`)
		d.Timeout = "1m"
		if _, err := off.Client.ApplySubagent(t.Context(), d); err != nil {
			t.Fatal(err)
		}
		if out := finish(t, off.Client, "untaught", nil); out["taught"] != strings.Repeat("n", len(s.Taught)) {
			t.Errorf("with AGORA_DISABLE_NEEDS_INPUT_HELPER=true the run found %v of %q", out, s.Taught)
		}
	})
}

// start runs Agora with s's runtime, its helpers off when off says so.
func start(t *testing.T, s Subject, off bool) *systemtest.System {
	o := systemtest.Options{Worker: func(c *worker.Config) {
		if s.Worker != nil {
			s.Worker(c)
		}
		if off {
			c.DisableNeedsInputHelper = "true"
		}
	}}
	if s.Runtime != nil {
		o.Runtimes = map[string]runtime.Runtime{s.Name: s.Runtime}
	}
	return systemtest.Start(t, o)
}

// mcpCall is a script that calls require_input with args (a JSON
// object) on the MCP server exe over stdio, as a CLI does: initialize,
// initialized, the call, and stdin held open until the call's answer.
func mcpCall(exe, args string) string {
	lines := []string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"runtimetest","version":"1"}}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"require_input","arguments":` + args + `}}`,
	}
	return `in="$TMPDIR/mcp.in"; out="$TMPDIR/mcp.out"; mkfifo "$in"
` + subagentmcp.EnvServe + `=serve ` + shellQuote(exe) + ` < "$in" > "$out" & 
exec 3> "$in"
printf '%s\n' ` + shellQuote(lines[0]) + ` ` + shellQuote(lines[1]) + ` ` + shellQuote(lines[2]) + ` >&3
n=0; while ! grep -q '"id":2' "$out"; do n=$((n+1)); [ $n -gt 600 ] && exit 9; sleep 0.05; done
exec 3>&-; wait`
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// exists is a shell command printing y or n for each of paths.
func exists(paths []string) string {
	var b strings.Builder
	for _, p := range paths {
		fmt.Fprintf(&b, "[ -e %q ] && printf y || printf n; ", p)
	}
	return b.String() + "true"
}

func dispatch(t *testing.T, c *client.Client, name string, input map[string]any, mod ...func(*lifecycle.Request)) *client.Dispatch {
	t.Helper()
	req := lifecycle.Request{Subagent: name}
	if input != nil {
		b, _ := json.Marshal(input)
		req.Input = b
	}
	for _, f := range mod {
		f(&req)
	}
	d, err := c.Dispatch(t.Context(), req)
	if err != nil {
		t.Fatalf("dispatch %s: %v", name, err)
	}
	return d
}

// answer answers question id with a, again while the router says to
// retry (it has not recorded the question yet).
func answer(t *testing.T, c *client.Client, id, a string) {
	t.Helper()
	var err error
	testkit.Eventually(t, 30*time.Second, "the router to take the answer to "+id, func() bool {
		_, err = c.Answer(t.Context(), id, lifecycle.Answer{Answer: a})
		return !errors.Is(err, client.ErrUnavailable)
	})
	if err != nil {
		t.Fatalf("answer %s: %v", id, err)
	}
}

func wait(t *testing.T, d *client.Dispatch) client.Item {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	it, err := d.Wait(ctx)
	if err != nil {
		t.Fatalf("wait for %s: %v", d.DispatchID, err)
	}
	return it
}

func follow(t *testing.T, c *client.Client, thread string) client.Item {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	it, err := c.Follow(ctx, thread, nil)
	if err != nil {
		t.Fatalf("follow %s: %v", thread, err)
	}
	return it
}

// finish dispatches name and returns its output, a JSON object of strings.
func finish(t *testing.T, c *client.Client, name string, input map[string]any, mod ...func(*lifecycle.Request)) map[string]string {
	t.Helper()
	it := wait(t, dispatch(t, c, name, input, mod...))
	f, ok := it.Data.(*lifecycle.Finished)
	if !ok {
		t.Fatalf("%s ended %+v, want finished", name, it.Data)
	}
	var out map[string]string
	if err := json.Unmarshal(f.Output, &out); err != nil {
		t.Fatalf("%s's output %s: %v", name, f.Output, err)
	}
	return out
}
