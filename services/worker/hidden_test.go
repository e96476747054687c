package worker_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/services/worker"
)

// TestFailureNamesAPathTheSandboxHides: a run that dies on a path of the
// host its root does not show fails with a detail naming the path and the
// read_paths line that would show it (docs/sandbox.md).
func TestFailureNamesAPathTheSandboxHides(t *testing.T) {
	h := newHarness(t, provision.Config{})
	svc := h.startWorker(h.workerConfig(), worker.Deps{})
	requireSandbox(t, svc, "namespaces")
	tool := filepath.Join(t.TempDir(), "tools", "lib.sh")
	if err := os.MkdirAll(filepath.Dir(tool), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tool, []byte("echo loaded\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	h.define(subagent.Definition{Name: "hidden", Runtime: subagent.RuntimeExec, Command: []string{"/bin/sh", "-c", `. "$TOOL"`},
		EnvAllow: []string{"TOOL"}})
	id := h.dispatch(lifecycle.Request{Subagent: "hidden", Input: json.RawMessage(`{}`), Env: map[string]string{"TOOL": tool}})
	f, ok := h.terminal(id).Data.(*lifecycle.Failed)
	if !ok || f.Reason != lifecycle.ReasonProviderFailed {
		t.Fatalf("terminal = %+v, want failed provider-failed", h.terminal(id).Data)
	}
	for _, want := range []string{"the sandbox does not show " + tool, "sandbox.read_paths: [" + filepath.Dir(tool) + "]"} {
		if !strings.Contains(f.Detail, want) {
			t.Errorf("detail %q lacks %q", f.Detail, want)
		}
	}
}
