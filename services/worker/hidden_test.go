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

// A start that fails on what the error does not name — a script whose #!
// interpreter the sandbox hides, a command whose symbolic link points
// into a hidden folder — fails with a detail naming the hidden path and
// the read_paths line that shows it, as `agora subagent check` resolves
// the command: the interpreter, the link's target.
func TestStartFailureNamesWhatTheCommandNeeds(t *testing.T) {
	h := newHarness(t, provision.Config{})
	svc := h.startWorker(h.workerConfig(), worker.Deps{})
	requireSandbox(t, svc, "namespaces")
	mkdir := func(p string) string {
		t.Helper()
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		name      string
		command   func(shown, hidden string) []string
		wantShown string // the folder the detail must suggest, under hidden
	}{
		{"a hidden #! interpreter", func(shown, hidden string) []string {
			interp := filepath.Join(mkdir(filepath.Join(hidden, "bin")), "myinterp")
			if err := os.Symlink("/bin/sh", interp); err != nil {
				t.Fatal(err)
			}
			tool := filepath.Join(shown, "tool.py")
			if err := os.WriteFile(tool, []byte("#!"+interp+"\nexit 0\n"), 0o755); err != nil {
				t.Fatal(err)
			}
			return []string{tool}
		}, "bin"},
		{"a link into a hidden folder", func(shown, hidden string) []string {
			real := filepath.Join(mkdir(filepath.Join(hidden, "versions", "3.12", "bin")), "python3")
			sh, err := os.ReadFile("/bin/sh")
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(real, sh, 0o755); err != nil {
				t.Fatal(err)
			}
			link := filepath.Join(mkdir(filepath.Join(shown, "venv", "bin")), "python")
			if err := os.Symlink(real, link); err != nil {
				t.Fatal(err)
			}
			return []string{link, "-c", "exit 0"}
		}, filepath.Join("versions", "3.12", "bin")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			shown, hidden := t.TempDir(), t.TempDir()
			name := strings.ReplaceAll(strings.ReplaceAll(tc.name, " ", "-"), "#!", "shebang")
			def := subagent.Definition{Name: name, Runtime: subagent.RuntimeExec, Command: tc.command(shown, hidden)}
			def.Sandbox.ReadPaths = []string{shown}
			h.define(def)
			id := h.dispatch(lifecycle.Request{Subagent: def.Name, Input: json.RawMessage(`{}`)})
			f, ok := h.terminal(id).Data.(*lifecycle.Failed)
			if !ok {
				t.Fatalf("terminal = %+v, want failed", h.terminal(id).Data)
			}
			t.Logf("detail: %s", f.Detail)
			want := filepath.Join(hidden, tc.wantShown)
			for _, w := range []string{"the sandbox does not show " + want, "add sandbox.read_paths: [" + want + "]", "agora subagent check " + def.Name} {
				if !strings.Contains(f.Detail, w) {
					t.Errorf("detail lacks %q", w)
				}
			}
		})
	}
}
