package worker_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/services/worker"
)

// gatedScript is a sub-agent that marks its start, works until the test
// opens its gate (however long that takes: the test decides when the
// housekeeping it waits for has crossed the run), then writes nonce as
// its output and exits 0.
func gatedScript(mark, gate, nonce string) string {
	return fmt.Sprintf(`echo up > %s; while [ ! -e %s ]; do sleep 0.05; done; printf '{"nonce":"%s"}' > "$AGORA_OUTPUT_FILE" 2>/dev/null; exit 0`, mark, gate, nonce)
}

// startedSandbox returns the sandbox report of the dispatch's started
// event.
func (h *harness) startedSandbox(id string) *lifecycle.Sandbox {
	h.t.Helper()
	for _, r := range h.events(id) {
		if s, ok := r.Data.(*lifecycle.Started); ok {
			return s.Sandbox
		}
	}
	h.t.Fatalf("dispatch %s has no started event", id)
	return nil
}

// TestSweepsNeverTouchLiveRuns runs a sub-agent on a root worker (so its
// workspace is a filesystem of its own, mounted on the folder) while every
// workspace sweep that can reach it runs, several times each: its own
// worker's periodic sweep (shortened through AGORA_WORKER_SWEEP_INTERVAL),
// a second worker of the fleet starting on the same root mid-run, a
// worker of another deployment on the same host (another `agora dev`: its
// own NATS server, the same root) and SweepWorkspaces as tooling calls it.
// The run must finish with its own output and no sweep may remove
// anything.
func TestSweepsNeverTouchLiveRuns(t *testing.T) {
	h := newHarness(t, provision.Config{})
	dir := t.TempDir()
	mark, gate, nonce := filepath.Join(dir, "up"), filepath.Join(dir, "gate"), lifecycle.NewID()
	h.shell("long", gatedScript(mark, gate, nonce))

	const sweeps, swept = "agora_worker_workspace_sweeps_total", "agora_worker_workspaces_swept_total"
	cfg := h.workerConfig()
	cfg.SweepInterval = 100 * time.Millisecond
	start := func(h *harness, id string) *prometheus.Registry {
		reg := prometheus.NewRegistry()
		c := cfg
		c.ID = id
		h.startWorker(c, worker.Deps{Registerer: reg})
		return reg
	}
	regA := start(h, "a")
	id := h.dispatch(lifecycle.Request{Subagent: "long"})
	testkit.Eventually(t, 30*time.Second, "the run to start", func() bool { _, err := os.Stat(mark); return err == nil })
	ws := h.workspaceOf(id, 1)
	if os.Geteuid() == 0 {
		if sb := h.startedSandbox(id); sb == nil || sb.WorkspaceFS != "tmpfs" {
			t.Fatalf("a root worker's run has sandbox %+v, want workspace_fs tmpfs (the filesystem mounted on the folder)", sb)
		}
	}

	// The run's own worker sweeps the root again and again meanwhile.
	n := testkit.RegisteredCounter(t, regA, sweeps)
	testkit.Eventually(t, 30*time.Second, "three periodic sweeps of the run's worker", func() bool { return testkit.RegisteredCounter(t, regA, sweeps) >= n+3 })
	// A second worker of the fleet starts on the same root: its start
	// sweep, then its periodic ones.
	regB := start(h, "b")
	testkit.Eventually(t, 30*time.Second, "the second worker's start sweep and a periodic one", func() bool { return testkit.RegisteredCounter(t, regB, sweeps) >= 2 })
	// Another deployment on the same host shares the root.
	other := newHarness(t, provision.Config{})
	other.root = h.root
	regC := start(other, "c")
	testkit.Eventually(t, 30*time.Second, "the other deployment's worker's sweeps", func() bool { return testkit.RegisteredCounter(t, regC, sweeps) >= 2 })
	if n := worker.SweepWorkspaces(h.root, quietLogger()); n != 0 {
		t.Errorf("SweepWorkspaces removed %d workspaces during a live run, want 0", n)
	}
	if got := h.workspaceOf(id, 1); got != ws {
		t.Fatalf("the run's workspace is %s now, was %s", got, ws)
	}

	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	r := h.terminal(id)
	fin, ok := r.Data.(*lifecycle.Finished)
	if !ok {
		t.Fatalf("the run ended %s, want finished with its output: %+v", r.Event.Type(), r.Data)
	}
	var out struct{ Nonce string }
	if err := json.Unmarshal(fin.Output, &out); err != nil || out.Nonce != nonce {
		t.Fatalf("finished with output %s, want the nonce %s the run wrote", fin.Output, nonce)
	}
	h.assertOneTerminal(id)
	for name, reg := range map[string]*prometheus.Registry{"a": regA, "b": regB, "c": regC} {
		if k := testkit.RegisteredCounter(t, reg, swept); k != 0 {
			t.Errorf("worker %s's sweeps removed %v workspaces, want none", name, k)
		}
	}
}

// TestWorkspaceLostIsNeverSuccess takes a live run's workspace away from
// it — its own filesystem unmounted from the folder, or the folder
// removed — and checks that the dispatch fails workspace-lost saying what
// was missing, never finished: the run wrote its output where the worker
// can no longer tell it is the run's.
func TestWorkspaceLostIsNeverSuccess(t *testing.T) {
	cases := []struct {
		name     string
		mode     string // AGORA_SANDBOX_WORKSPACE
		rootOnly bool
		take     func(t *testing.T, ws string)
		detail   string
	}{
		{"own filesystem unmounted", "tmpfs", true, func(t *testing.T, ws string) {
			if err := unix.Unmount(ws, unix.MNT_DETACH); err != nil {
				t.Fatalf("unmount the run's workspace filesystem: %v", err)
			}
		}, "no longer leads to the run's own filesystem"},
		{"folder removed", "watch", false, func(t *testing.T, ws string) {
			if err := os.RemoveAll(ws); err != nil {
				t.Fatal(err)
			}
		}, "is gone"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.rootOnly && os.Geteuid() != 0 {
				t.Skip("only a root worker mounts a run's workspace filesystem")
			}
			h := newHarness(t, provision.Config{})
			dir := t.TempDir()
			mark, gate := filepath.Join(dir, "up"), filepath.Join(dir, "gate")
			h.shell("taken", gatedScript(mark, gate, "x"), func(d *subagent.Definition) {})
			cfg := h.workerConfig()
			cfg.SandboxWorkspace = c.mode
			h.startWorker(cfg, worker.Deps{})
			id := h.dispatch(lifecycle.Request{Subagent: "taken"})
			testkit.Eventually(t, 30*time.Second, "the run to start", func() bool { _, err := os.Stat(mark); return err == nil })
			c.take(t, h.workspaceOf(id, 1))
			if err := os.WriteFile(gate, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			r := h.terminal(id)
			f, ok := r.Data.(*lifecycle.Failed)
			if !ok || f.Reason != lifecycle.ReasonWorkspaceLost || !strings.Contains(f.Detail, c.detail) {
				t.Fatalf("the run ended %s %+v, want failed workspace-lost with a detail saying %q", r.Event.Type(), r.Data, c.detail)
			}
		})
	}
}

// TestCgroupCleanupSparesLiveRuns runs a sub-agent in its worker's cgroups
// (a worker process of its own) while another worker process starts on
// the host, which removes the cgroups that workers no longer alive left:
// a cgroup of a dead worker's pid goes, the live run's stays, and the run
// finishes with its own output.
func TestCgroupCleanupSparesLiveRuns(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("per-run cgroups need a root worker")
	}
	if _, err := os.Stat("/sys/fs/cgroup/pids/cgroup.clone_children"); err != nil {
		t.Skip("no cgroup v1 pids hierarchy on this host")
	}
	h := newHarness(t, provision.Config{})
	dir := t.TempDir()
	mark, gate, nonce := filepath.Join(dir, "up"), filepath.Join(dir, "gate"), lifecycle.NewID()
	h.shell("caged", gatedScript(mark, gate, nonce))
	a, _ := h.startWorkerProcess("caged-a")
	id := h.dispatch(lifecycle.Request{Subagent: "caged"})
	testkit.Eventually(t, 30*time.Second, "the run to start", func() bool { _, err := os.Stat(mark); return err == nil })
	if sb := h.startedSandbox(id); sb == nil || !sb.Cgroup {
		t.Fatalf("the run's sandbox %+v has no cgroup: the test would show nothing", sb)
	}
	// The run's processes are in a cgroup named for its worker's pid.
	live := func() []string {
		m, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/pids/agora", fmt.Sprintf("%d-*", a.Process.Pid)))
		var busy []string
		for _, d := range m {
			if b, err := os.ReadFile(filepath.Join(d, "cgroup.procs")); err == nil && len(strings.TrimSpace(string(b))) > 0 {
				busy = append(busy, d)
			}
		}
		return busy
	}
	if len(live()) == 0 {
		t.Fatalf("no cgroup of worker %d holds the run's processes", a.Process.Pid)
	}
	// A cgroup a dead worker left (a pid no process has).
	dead := filepath.Join("/sys/fs/cgroup/pids/agora", "999999999-dead-1")
	if err := os.Mkdir(dead, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Rmdir(dead) })

	h.startWorkerProcess("caged-b")
	// The second worker's clean-up at its start removes the dead one's.
	testkit.Eventually(t, 30*time.Second, "the dead worker's cgroup removed by the second worker's start", func() bool {
		_, err := os.Stat(dead)
		return os.IsNotExist(err)
	})
	if len(live()) == 0 {
		t.Fatalf("the live run's cgroup was removed by the second worker's clean-up")
	}
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	r := h.terminal(id)
	fin, ok := r.Data.(*lifecycle.Finished)
	var out struct{ Nonce string }
	if !ok || json.Unmarshal(fin.Output, &out) != nil || out.Nonce != nonce {
		t.Fatalf("the run ended %s %+v, want finished with its nonce", r.Event.Type(), r.Data)
	}
	h.assertOneTerminal(id)
}

// TestRunCannotReleaseItsWorkspaceLock attacks the workspace's locks from
// inside the run, on a root worker whose runs have an unprivileged host
// uid: the sub-agent reopens its workspace, its cwd and every descriptor
// of its launcher (PID 1 of its namespace) and unlocks and try-locks
// each, then waits while the test sweeps the root. A new descriptor is a
// lock of its own, so nothing the run does lets a sweep take its
// workspace: the sweep removes nothing and the run finishes with its
// output.
func TestRunCannotReleaseItsWorkspaceLock(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the root worker's case")
	}
	h := newHarness(t, provision.Config{})
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	mark, gate, nonce := filepath.Join(dir, "up"), filepath.Join(dir, "gate"), lifecycle.NewID()
	report := filepath.Join(dir, "attack.txt")
	attack := `perl -e 'use Fcntl qw(:flock); for my $f (".", "/proc/self/cwd", glob("/proc/1/fd/*")) { opendir(my $h, $f) or next; print "tried $f\n"; flock($h, LOCK_UN); print "locked $f\n" if flock($h, LOCK_EX|LOCK_NB) }' > ` + report + ` 2>&1; `
	h.define(subagent.Definition{Name: "unlocker", Runtime: subagent.RuntimeExec, Command: []string{"sh", "-c", attack + gatedScript(mark, gate, nonce)},
		Sandbox: subagent.Sandbox{WritePaths: []string{dir}}})
	cfg := h.workerConfig()
	cfg.SandboxUID = 0 // the default: an unprivileged host uid of the runs' own
	h.startWorker(cfg, worker.Deps{})
	id := h.dispatch(lifecycle.Request{Subagent: "unlocker"})
	testkit.Eventually(t, 30*time.Second, "the run to attack and wait", func() bool { _, err := os.Stat(mark); return err == nil })
	b, err := os.ReadFile(report)
	if err != nil || !strings.Contains(string(b), "tried .\n") {
		t.Fatalf("the attack did not run: %v\n%s", err, b)
	}
	t.Logf("the run's attack:\n%s", b)
	for range 3 {
		if n := worker.SweepWorkspaces(h.root, quietLogger()); n != 0 {
			t.Fatalf("a sweep removed %d workspaces after the run attacked its locks", n)
		}
	}
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	r := h.terminal(id)
	fin, ok := r.Data.(*lifecycle.Finished)
	var out struct{ Nonce string }
	if !ok || json.Unmarshal(fin.Output, &out) != nil || out.Nonce != nonce {
		t.Fatalf("the run ended %s %+v, want finished with its nonce", r.Event.Type(), r.Data)
	}
}

// TestSweepDetachesAnEmptyFilesystemACrashLeft lays out on disk what a
// root worker killed while it gave a run its own filesystem leaves — the
// tmpfs mounted on the run's folder, empty because the worker died before
// it made .agora there, the folder under it holding its .agora and no lock
// on either — beside the same mount of a live worker caught at that moment
// (the folder's lock held) and a foreign mount. The sweep detaches and
// removes the first, and touches neither of the others.
func TestSweepDetachesAnEmptyFilesystemACrashLeft(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("only a root worker mounts a run's workspace filesystem")
	}
	cases := []struct {
		name    string
		live    bool   // the folder's lock is held, as a live worker holds it
		content string // a file on the mounted filesystem
		removed bool
	}{
		{"abandoned mid-mount", false, "", true},
		{"live worker between its mount and its lock", true, "", false},
		{"foreign filesystem on a workspace folder", false, "notes", false},
	}
	root := t.TempDir()
	for i, c := range cases {
		ws := filepath.Join(root, fmt.Sprintf("crash%d.1.%d", i, 100+i))
		if err := os.MkdirAll(filepath.Join(ws, ".agora", "artifacts"), 0o700); err != nil {
			t.Fatal(err)
		}
		if c.live {
			holdLock(t, ws) // before the mount, as prepareWorkspace locks it
		}
		if err := unix.Mount("tmpfs", ws, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=1m,mode=0700"); err != nil {
			t.Fatalf("mount a tmpfs on %s: %v", ws, err)
		}
		t.Cleanup(func() { _ = unix.Unmount(ws, unix.MNT_DETACH) })
		if c.content != "" {
			if err := os.WriteFile(filepath.Join(ws, c.content), []byte("x"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n := worker.SweepWorkspaces(root, quietLogger()); n != 1 {
		t.Errorf("the sweep removed %d workspaces, want 1 (the abandoned one)", n)
	}
	for i, c := range cases {
		ws := filepath.Join(root, fmt.Sprintf("crash%d.1.%d", i, 100+i))
		_, err := os.Lstat(ws)
		gone := os.IsNotExist(err)
		if gone != c.removed {
			t.Errorf("%s: workspace removed %t, want %t (%v)", c.name, gone, c.removed, err)
		}
		if mounted := mountedAt(t, ws); mounted == c.removed {
			t.Errorf("%s: a filesystem is mounted on the workspace: %t, want %t", c.name, mounted, !c.removed)
		}
	}
}

// mountedAt reports whether a mount point of this process's mount
// namespace is path.
func mountedAt(t *testing.T, path string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == path {
			return true
		}
	}
	return false
}
