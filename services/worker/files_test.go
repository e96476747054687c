package worker_test

import (
	"encoding/json"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/services/worker"
)

// defFiles are laid down by the worker before the sub-agent runs.
var defFiles = map[string]string{
	"a/b/c.txt":                   "nested\ncontent without a final newline",
	"top.md":                      "# top\n",
	".claude/skills/x/SKILL.md":   "---\nname: x\n---\nbody ünïcode\n",
	"scripts/run.sh":              "#!/bin/sh\necho hi\n",
	"dir with space/file (1).txt": "",
}

// inspectWorkspace is an exec sub-agent that records, from inside the
// running workspace, its mode and the laid-down files into $OUT.
const inspectWorkspace = `set -e
stat -c '%a' "$AGORA_WORKSPACE" > "$OUT/ws-mode"
stat -c '%a' .agora > "$OUT/agora-mode"
stat -c '%a' a a/b "dir with space" > "$OUT/dir-modes"
for f in a/b/c.txt top.md .claude/skills/x/SKILL.md scripts/run.sh "dir with space/file (1).txt"; do
	stat -c '%a' "$f" >> "$OUT/file-modes"
done
mkdir -p "$OUT/copy"
cp -R . "$OUT/copy/"
`

// TestDefinitionFiles: the definition's files are laid down with their
// directories, mode 0600 and exact content; the workspace is 0700 while
// the sub-agent runs and is removed after, or kept with KeepWorkspaces.
func TestDefinitionFiles(t *testing.T) {
	for _, keep := range []bool{false, true} {
		name := "removed after"
		if keep {
			name = "kept"
		}
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, provision.Config{})
			cfg := h.workerConfig()
			cfg.KeepWorkspaces = keep
			svc := h.startWorker(cfg, worker.Deps{})
			h.shell("files", inspectWorkspace, func(d *subagent.Definition) { d.Files = defFiles })
			out := t.TempDir()
			id := h.dispatch(lifecycle.Request{Subagent: "files", Input: json.RawMessage(`{"k":"v"}`), Env: map[string]string{"OUT": out}})
			r := h.terminal(id)
			if k := r.Data.(lifecycle.Lifecycle).LifecycleKind(); k != lifecycle.KindFinished {
				t.Fatalf("terminal = %s %+v, want finished", k, r.Data)
			}
			readTrim := func(name string) string {
				return strings.TrimSpace(string(must(os.ReadFile(filepath.Join(out, name)))))
			}
			if m := readTrim("ws-mode"); m != "700" {
				t.Errorf("workspace mode during the run = %s, want 700", m)
			}
			if m := readTrim("agora-mode"); m != "700" {
				t.Errorf(".agora mode during the run = %s, want 700", m)
			}
			if m := strings.Fields(readTrim("dir-modes")); strings.Join(m, " ") != "700 700 700" {
				t.Errorf("file directory modes = %v, want 700", m)
			}
			if m := strings.Fields(readTrim("file-modes")); strings.Join(m, " ") != "600 600 600 600 600" {
				t.Errorf("file modes = %v, want 600 each", m)
			}
			for p, content := range defFiles {
				got, err := os.ReadFile(filepath.Join(out, "copy", p))
				if err != nil {
					t.Errorf("file %s: %v", p, err)
					continue
				}
				if string(got) != content {
					t.Errorf("file %s = %q, want %q", p, got, content)
				}
			}
			if got := string(must(os.ReadFile(filepath.Join(out, "copy", ".agora", "input.json")))); got != `{"k":"v"}` {
				t.Errorf("input.json = %s", got)
			}

			h.waitWorkEmpty()
			if !keep {
				deadline := time.Now().Add(10 * time.Second)
				for m, _ := filepath.Glob(filepath.Join(h.root, id+".*")); len(m) > 0; m, _ = filepath.Glob(filepath.Join(h.root, id+".*")) {
					if time.Now().After(deadline) {
						t.Fatalf("workspaces %v still exist after the run", m)
					}
					time.Sleep(10 * time.Millisecond)
				}
				return
			}
			ws := h.workspaceOf(id, 1)
			// Kept: still there once the run's cleanup is over (the in-flight
			// gauge drops after it), still private.
			metrics := httptest.NewServer(svc.Handler())
			defer metrics.Close()
			waitMetrics(t, metrics.URL, map[string]float64{`agora_worker_in_flight`: 0})
			fi, err := os.Stat(ws)
			if err != nil {
				t.Fatalf("KeepWorkspaces: workspace %s: %v", ws, err)
			}
			if fi.Mode().Perm() != 0o700 {
				t.Errorf("kept workspace mode = %v, want 0700", fi.Mode().Perm())
			}
			got, err := os.ReadFile(filepath.Join(ws, "a", "b", "c.txt"))
			if err != nil || string(got) != defFiles["a/b/c.txt"] {
				t.Errorf("kept workspace file: %q, %v", got, err)
			}
		})
	}
}

// TestBadDefinitionFilePaths: a definition stored in KV without validation
// whose file path is absolute, escapes the workspace or writes into .agora
// ends failed worker-failed, and nothing is written outside the workspace.
func TestBadDefinitionFilePaths(t *testing.T) {
	h := newHarness(t, provision.Config{})
	h.startWorker(h.workerConfig(), worker.Deps{})
	outside := t.TempDir()
	abs := filepath.Join(outside, "absolute.txt")
	cases := []struct {
		name   string
		path   string
		detail string
		check  string // a path that must not exist afterwards
	}{
		{name: "absolute", path: abs, detail: "absolute", check: abs},
		{name: "dotdot", path: "../escape.txt", detail: "escapes", check: filepath.Join(h.root, "..", "escape.txt")},
		{name: "nested-dotdot", path: "a/../../escape2.txt", detail: "escapes", check: filepath.Join(h.root, "..", "escape2.txt")},
		{name: "deep-dotdot", path: "../../../../../../../../tmp/agora-escape-test.txt", detail: "escapes", check: "/tmp/agora-escape-test.txt"},
		{name: "into-agora", path: ".agora/needs_input.json", detail: ".agora"},
	}
	ids := map[string]string{}
	for _, c := range cases {
		// h.define stores the JSON as given: no Validate on the way in.
		h.define(subagent.Definition{Name: c.name, Runtime: subagent.RuntimeExec, Command: []string{"sh", "-c", "echo ran > ran.txt"},
			Files: map[string]string{c.path: "pwned", "ok.txt": "fine"}})
		ids[c.name] = h.dispatch(lifecycle.Request{Subagent: c.name, Input: json.RawMessage(`{}`)})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := failedEvent(t, h.terminal(ids[c.name]))
			if f.Reason != lifecycle.ReasonWorkerFailed {
				t.Errorf("reason = %s, want %s", f.Reason, lifecycle.ReasonWorkerFailed)
			}
			if !strings.Contains(f.Detail, c.detail) {
				t.Errorf("detail = %q, want it to say %q", f.Detail, c.detail)
			}
			if c.check != "" {
				assertNoFile(t, c.check)
			}
			h.assertOneTerminal(ids[c.name])
		})
	}
	h.waitWorkEmpty()
	// Nothing was created next to the workspaces either.
	entries, err := os.ReadDir(outside)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 0 {
		t.Errorf("files written outside the workspace: %v", entries)
	}
}

// TestUnknownSubagent: a request naming a sub-agent absent from KV ends
// failed worker-failed naming it.
func TestUnknownSubagent(t *testing.T) {
	h := newHarness(t, provision.Config{})
	h.startWorker(h.workerConfig(), worker.Deps{})
	id := h.dispatch(lifecycle.Request{Subagent: "nobody-defined-me", Input: json.RawMessage(`{}`)})
	failedWith(t, h.terminal(id), lifecycle.ReasonWorkerFailed, "nobody-defined-me")
	h.assertOneTerminal(id)
	h.waitWorkEmpty()
}

// TestSubagentRevisionPinsDefinition: the worker runs the definition
// revision recorded at acceptance, not the latest one.
func TestSubagentRevisionPinsDefinition(t *testing.T) {
	h := newHarness(t, provision.Config{})
	h.startWorker(h.workerConfig(), worker.Deps{})
	rev1 := h.shell("pinned", `echo '"v1"' > "$AGORA_OUTPUT_FILE"`)
	rev2 := h.shell("pinned", `echo '"v2"' > "$AGORA_OUTPUT_FILE"`)
	h.shell("other", `echo '"other"' > "$AGORA_OUTPUT_FILE"`)
	cases := []struct {
		name   string
		rev    uint64
		output string // "" for failed worker-failed
	}{
		{name: "rev1", rev: rev1, output: `"v1"`},
		{name: "rev2", rev: rev2, output: `"v2"`},
		{name: "latest", rev: 0, output: `"v2"`},
		{name: "unknown revision", rev: rev2 + 100},
	}
	ids := map[string]string{}
	for _, c := range cases {
		ids[c.name] = h.dispatch(lifecycle.Request{Subagent: "pinned", SubagentRevision: c.rev, Input: json.RawMessage(`{}`)})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := h.terminal(ids[c.name])
			if c.output == "" {
				failedWith(t, r, lifecycle.ReasonWorkerFailed, "pinned")
				return
			}
			fin := eventAs[*lifecycle.Finished](t, r)
			if got := strings.TrimSpace(string(fin.Output)); got != c.output {
				t.Errorf("output = %s, want %s", got, c.output)
			}
		})
	}
}

// waitGoneWithin waits until path no longer exists.
func waitGoneWithin(t *testing.T, path string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		if _, err := os.Lstat(path); os.IsNotExist(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still exists after %s", path, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestDispatchIDCannotEscapeWorkspaceRoot: the dispatcher only accepts
// plain ids, but a work message published straight onto AGORA_DISPATCH
// may carry any subject token, "/" included. Such an id must not name the
// workspace root itself or a directory inside another dispatch's
// workspace: the worker removes a workspace before and after each run.
func TestDispatchIDCannotEscapeWorkspaceRoot(t *testing.T) {
	h := newHarness(t, provision.Config{})
	h.startWorker(h.workerConfig(), worker.Deps{})
	h.shell("plain", `true`)
	marker := filepath.Join(h.root, "other-dispatch", "keep.txt")
	if err := os.MkdirAll(filepath.Dir(marker), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(marker, []byte("another dispatch's work"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"/", "//", "other-dispatch/", "other-dispatch/sub"} {
		t.Run(id, func(t *testing.T) {
			h.dispatch(lifecycle.Request{DispatchID: id, Subagent: "plain", Input: json.RawMessage(`{}`)})
			f := failedEvent(t, h.terminal(id))
			if f.Reason != lifecycle.ReasonWorkerFailed {
				t.Errorf("reason = %s, want worker-failed", f.Reason)
			}
			if _, err := os.Stat(marker); err != nil {
				t.Fatalf("dispatch id %q removed another workspace: %v", id, err)
			}
		})
	}
	h.waitWorkEmpty()
	assertNoFile(t, filepath.Join(h.root, "other-dispatch", "sub"))
}
