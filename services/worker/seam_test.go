package worker_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/runtime"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/services/worker"
)

// greeter is a runtime written outside the worker: it says what to run
// and lays down a file; it never starts a process.
type greeter struct{}

func (greeter) Command(inv runtime.Invocation) (runtime.Command, error) {
	return runtime.Command{
		Args: []string{"/bin/sh", "-c", `printf '{"said":%s,"capeff":"%s","taught":%s}' "$(cat greeting.json)" "$(awk '/^CapEff/ {print $2}' /proc/self/status)" "$([ -f .agora/greeter.md ] && echo true || echo false)" > "$AGORA_OUTPUT_FILE"`},
		Files: []runtime.File{
			{Path: "greeting.json", Data: []byte(`"hello, ` + inv.Definition.Prompt + `"`)},
			{Path: ".agora/greeter.md", Data: []byte("ask through " + inv.Helper.NeedsInputFile)},
		},
	}, nil
}

func (greeter) Validate(def subagent.Definition) error {
	if def.Prompt == "" {
		return errors.New("runtime greeter needs a prompt")
	}
	return nil
}

// A runtime registered by name from outside the worker: apply refuses a
// definition naming it until a worker announces it, naming what the
// workers offer; then the worker lays down its files and runs its
// command in the sandbox (no capability, though the test runs as root),
// and the run finishes with the command's output. Its own Validate
// refuses a definition it cannot run, and a runtime no worker offers
// fails with the ones this worker does.
func TestRuntimeFromOutsideTheWorker(t *testing.T) {
	h := newHarness(t, provision.Config{})
	c, err := client.New(h.nc)
	if err != nil {
		t.Fatal(err)
	}
	def := subagent.Definition{Name: "greets", Runtime: "greeter", Prompt: "world", Timeout: "1m"}
	if _, err := c.ApplySubagent(t.Context(), def); err == nil || !strings.Contains(err.Error(), `runtime: "greeter" is offered by no worker; the workers offer claude-code, codex, exec, gemini-cli`) {
		t.Fatalf("apply before a worker announced greeter: %v", err)
	}
	h.startWorker(h.workerConfig(), worker.Deps{Runtimes: map[string]runtime.Runtime{"greeter": greeter{}}})
	testkit.Eventually(t, 10*time.Second, "the worker to announce greeter", func() bool {
		names, err := c.Runtimes(t.Context())
		return err == nil && strings.Join(names, ",") == "claude-code,codex,exec,gemini-cli,greeter"
	})
	if _, err := c.ApplySubagent(t.Context(), def); err != nil {
		t.Fatalf("apply once a worker offers greeter: %v", err)
	}
	id := h.dispatch(lifecycle.Request{Subagent: "greets"})
	f, ok := h.terminal(id).Data.(*lifecycle.Finished)
	if !ok {
		t.Fatalf("terminal %+v, want finished", h.terminal(id).Data)
	}
	var out struct {
		Said   string `json:"said"`
		CapEff string `json:"capeff"`
		Taught bool   `json:"taught"`
	}
	if err := json.Unmarshal(f.Output, &out); err != nil || out.Said != "hello, world" || out.CapEff != "0000000000000000" || !out.Taught {
		t.Fatalf("output %s (%v): want the runtime's file read, no capability, the overlay laid down", f.Output, err)
	}

	// The runtime's own check, at the worker (the definition is stored
	// directly, as a client of another version might).
	h.define(subagent.Definition{Name: "mute", Runtime: "greeter", Timeout: "1m"})
	if fl, ok := h.terminal(h.dispatch(lifecycle.Request{Subagent: "mute"})).Data.(*lifecycle.Failed); !ok || !strings.Contains(fl.Detail, "runtime greeter needs a prompt") {
		t.Errorf("a definition greeter refuses: %+v", fl)
	}
	h.define(subagent.Definition{Name: "elsewhere", Runtime: "codex-next", Prompt: "p", Timeout: "1m"})
	if fl, ok := h.terminal(h.dispatch(lifecycle.Request{Subagent: "elsewhere"})).Data.(*lifecycle.Failed); !ok || !strings.Contains(fl.Detail, `runtime "codex-next" is not available on this worker (it offers claude-code, codex, exec, gemini-cli, greeter)`) {
		t.Errorf("a runtime this worker does not offer: %+v", fl)
	}
}
