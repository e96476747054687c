//go:build linux

package worker_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/internal/sandbox"
	"github.com/agora-dispatch/agora/internal/sandbox/launcher"
	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/services/worker"
)

// The housekeeping of the sandbox's launchers (docs/sandbox.md, "Started
// ahead" and "The spawner") crossing a live run at the worker's level: a
// long run works until the test opens its gate while spares are taken and
// refilled, killed from outside and forked again, and while spawners
// start, die and are let go around it. Every run writes an output made of
// its own dispatch id and a nonce of its own request, and must finish
// with exactly that.

// ownScript writes the run's own output: its dispatch id and the nonce
// its request carries.
const ownScript = `printf '{"dispatch":"%s","nonce":"%s"}' "$AGORA_DISPATCH_ID" "$NONCE" > "$AGORA_OUTPUT_FILE"`

// liveScript marks its start in $MARK, works until $GATE exists (as long
// as the test's housekeeping takes), then writes its own output.
const liveScript = `echo up > "$MARK"; while [ ! -e "$GATE" ]; do sleep 0.05; done; ` + ownScript

// liveRun is the long run a test keeps in flight.
type liveRun struct {
	id, nonce, mark, gate string
}

// startLive dispatches the long run and waits until it works.
func (h *harness) startLive() liveRun {
	h.t.Helper()
	dir := h.t.TempDir()
	r := liveRun{nonce: lifecycle.NewID(), mark: filepath.Join(dir, "up"), gate: filepath.Join(dir, "gate")}
	r.id = h.dispatch(lifecycle.Request{Subagent: "live", Env: map[string]string{"NONCE": r.nonce, "MARK": r.mark, "GATE": r.gate}})
	testkit.Eventually(h.t, 30*time.Second, "the live run to start", func() bool { _, err := os.Stat(r.mark); return err == nil })
	return r
}

// assertLive fails unless the live run still works: no terminal event.
func (h *harness) assertLive(r liveRun) {
	h.t.Helper()
	for _, k := range kinds(h.events(r.id)) {
		if k.Terminal() {
			h.t.Fatalf("the live run %s ended %s before its gate opened: %v", r.id, k, kinds(h.events(r.id)))
		}
	}
}

// finish opens the live run's gate and checks it finishes with its own
// output, on worker.
func (h *harness) finish(r liveRun, worker string) {
	h.t.Helper()
	h.assertLive(r)
	if err := os.WriteFile(r.gate, nil, 0o600); err != nil {
		h.t.Fatal(err)
	}
	h.assertOwnOutput(r.id, r.nonce, worker)
}

// shortRuns dispatches n short runs at once and checks each finishes with
// its own output, on worker.
func (h *harness) shortRuns(n int, worker string) {
	h.t.Helper()
	ids, nonces := make([]string, n), make([]string, n)
	for i := range n {
		nonces[i] = lifecycle.NewID()
		ids[i] = h.dispatch(lifecycle.Request{Subagent: "short", Env: map[string]string{"NONCE": nonces[i]}})
	}
	for i := range n {
		h.assertOwnOutput(ids[i], nonces[i], worker)
	}
}

// assertOwnOutput waits for the dispatch's end and checks it is one
// finished, by worker, whose output is the run's own: its dispatch id
// and its request's nonce.
func (h *harness) assertOwnOutput(id, nonce, worker string) {
	h.t.Helper()
	r := h.terminal(id)
	fin, ok := r.Data.(*lifecycle.Finished)
	if !ok {
		h.t.Fatalf("dispatch %s ended %s %+v, want finished with its own output", id, r.Event.Type(), r.Data)
	}
	var out struct{ Dispatch, Nonce string }
	if err := json.Unmarshal(fin.Output, &out); err != nil || out.Dispatch != id || out.Nonce != nonce {
		h.t.Fatalf("dispatch %s finished with output %s, want its own (dispatch %s, nonce %s)", id, fin.Output, id, nonce)
	}
	if fin.WorkerID != worker || fin.Attempt != 1 {
		h.t.Fatalf("dispatch %s finished by %q attempt %d, want %q attempt 1", id, fin.WorkerID, fin.Attempt, worker)
	}
	h.assertOneTerminal(id)
}

// defineSpares stores the live and the short sub-agents. Once the test's
// worker processes are killed (their cleanups run first), the root is
// swept as tooling would: a run a killed worker leaves keeps its
// filesystem mounted until a sweep.
func (h *harness) defineSpares() {
	h.t.Helper()
	h.shell("live", liveScript)
	h.shell("short", ownScript)
	h.t.Cleanup(func() {
		testkit.Eventually(h.t, 15*time.Second, "the killed workers' workspaces swept", func() bool {
			worker.SweepWorkspaces(h.root, quietLogger())
			return !mountedUnder(h.t, h.root)
		})
	})
}

// mountedUnder reports whether a mount point of this process's mount
// namespace is below root.
func mountedUnder(t *testing.T, root string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], root+"/") {
			return true
		}
	}
	return false
}

// workerProc is a worker in a process of its own (this test binary in
// worker mode), so that its launchers and spawner are its own children.
type workerProc struct {
	id   string
	cmd  *exec.Cmd
	logs *testkit.Buffer
	done chan struct{} // closed once the process has ended; err is its exit
	err  error
}

// startWorkerProc starts a worker process of id with concurrency slots
// and extra settings; it is killed when the test ends.
func (h *harness) startWorkerProc(id string, concurrency int, extra ...string) *workerProc {
	h.t.Helper()
	w := &workerProc{id: id, logs: &testkit.Buffer{}, done: make(chan struct{})}
	w.cmd = exec.Command(os.Args[0])
	w.cmd.Env = append(append(os.Environ(), "WORKER_TEST_MAIN=1", "AGORA_NATS_URL="+h.srv.URL, "AGORA_WORKSPACE_ROOT="+h.root,
		"AGORA_WORKER_ID="+id, "AGORA_WORKER_CONCURRENCY="+strconv.Itoa(concurrency), "AGORA_WORKER_PULL_EXPIRY=500ms",
		"AGORA_WORKER_KILL_GRACE=500ms", "AGORA_SANDBOX_UID=-1"), extra...)
	w.cmd.Stdout, w.cmd.Stderr = w.logs, w.logs
	if err := w.cmd.Start(); err != nil {
		h.t.Fatal(err)
	}
	go func() { w.err = w.cmd.Wait(); close(w.done) }()
	h.t.Cleanup(func() {
		_ = w.cmd.Process.Kill()
		<-w.done
		if h.t.Failed() {
			h.t.Logf("worker %s's log:\n%s", id, w.logs)
		}
	})
	testkit.Eventually(h.t, 30*time.Second, "worker "+id+" to start", func() bool { return strings.Contains(w.logs.String(), "worker started") })
	return w
}

// stop asks the worker to stop (SIGTERM) and waits for its clean exit.
func (w *workerProc) stop(t *testing.T) {
	t.Helper()
	if err := w.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	w.waitExit(t)
}

// waitExit waits for the worker to exit 0.
func (w *workerProc) waitExit(t *testing.T) {
	t.Helper()
	select {
	case <-w.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("worker %s did not exit within 60s", w.id)
	}
	if w.err != nil {
		t.Fatalf("worker %s exited with %v", w.id, w.err)
	}
}

// running reports whether the worker process has not ended.
func (w *workerProc) running() bool {
	select {
	case <-w.done:
		return false
	default:
		return true
	}
}

// pid is the worker's process id.
func (w *workerProc) pid() int { return w.cmd.Process.Pid }

// launchers lists the worker's launchers — its own children and its
// spawner's — split into spares (waiting for a run: the launcher has no
// child yet) and busy ones (a run's runtime is their child).
func (w *workerProc) launchers() (spares, busy []int) {
	cands := childrenOf(w.pid())
	for _, sp := range w.spawners() {
		cands = append(cands, childrenOf(sp)...)
	}
	for _, c := range cands {
		if !procIs(c, launcher.Name) {
			continue
		}
		if len(childrenOf(c)) == 0 {
			spares = append(spares, c)
		} else {
			busy = append(busy, c)
		}
	}
	return spares, busy
}

// spawners lists the worker's spawners (at most one lives).
func (w *workerProc) spawners() []int {
	var out []int
	for _, c := range childrenOf(w.pid()) {
		if procIs(c, launcher.SpawnerName) {
			out = append(out, c)
		}
	}
	return out
}

// waitSpares waits until the worker has n spare launchers and returns
// them.
func (w *workerProc) waitSpares(t *testing.T, n int) []int {
	t.Helper()
	var s []int
	testkit.Eventually(t, 15*time.Second, fmt.Sprintf("worker %s to have %d spare launchers", w.id, n), func() bool {
		s, _ = w.launchers()
		return len(s) == n
	})
	return s
}

// busyLauncher returns the one launcher running a run on the worker.
func (w *workerProc) busyLauncher(t *testing.T) int {
	t.Helper()
	var busy []int
	testkit.Eventually(t, 15*time.Second, "one launcher running a run on worker "+w.id, func() bool {
		_, busy = w.launchers()
		return len(busy) == 1
	})
	return busy[0]
}

// childrenOf lists the children of pid.
func childrenOf(pid int) []int {
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	var out []int
	for _, task := range tasks {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, task.Name()))
		for _, f := range strings.Fields(string(b)) {
			if c, err := strconv.Atoi(f); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}

// procIs reports whether pid lives (not a zombie) with argv exactly name,
// the launcher protocol.
func procIs(pid int, name string) bool {
	argv, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return string(argv) == name+"\x00"+launcher.Protocol+"\x00" && procAlive(pid)
}

// procAlive reports whether pid lives; a zombie is dead.
func procAlive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return len(f) > 0 && f[0] != "Z"
}

// waitProcsGone waits until none of pids lives.
func waitProcsGone(t *testing.T, what string, pids ...int) {
	t.Helper()
	testkit.Eventually(t, 15*time.Second, what+" to end", func() bool {
		return !slices.ContainsFunc(pids, procAlive)
	})
}

// TestSparesRefillBesideALiveRun keeps a long run in flight on a worker
// while many short runs on the same worker take its spare launchers and
// refill them (two at once, beside the long run's slot). The spares the
// worker had before are used (a run takes the oldest) and others wait
// after; the long run's launcher is the same process throughout, and
// every run, long and short, finishes with its own output.
func TestSparesRefillBesideALiveRun(t *testing.T) {
	h := newHarness(t, provision.Config{})
	h.defineSpares()
	w := h.startWorkerProc("spares", 3)
	// Spares are started when a run ends: the first run's end makes two,
	// and the live run takes one of them (its refill may be starting the
	// second meanwhile, and then starts another).
	h.shortRuns(1, w.id)
	w.waitSpares(t, 2)
	live := h.startLive()
	own := w.busyLauncher(t)
	var before []int
	testkit.Eventually(t, 15*time.Second, "a spare launcher beside the live run", func() bool {
		before, _ = w.launchers()
		return len(before) > 0
	})

	h.shortRuns(16, w.id)

	after := w.waitSpares(t, 2)
	if reused := slices.DeleteFunc(slices.Clone(after), func(p int) bool { return !slices.Contains(before, p) }); len(reused) > 0 {
		t.Fatalf("spare launchers %v from before the short runs still wait (before %v, after %v): the short runs did not take them", reused, before, after)
	}
	if _, busy := w.launchers(); !slices.Equal(busy, []int{own}) {
		t.Fatalf("launchers running a run: %v, want only the live run's %d", busy, own)
	}
	t.Logf("the live run's launcher %d; spares %v before the short runs, %v after", own, before, after)
	h.finish(live, w.id)
}

// TestSparesKilledBesideALiveRun keeps a long run in flight on a worker
// while its spare launchers are SIGKILLed from outside, again and again,
// each time followed by short runs on the same worker: the runs find the
// dead spares, start launchers of their own and refill the spares; the
// killed ones never come back, the long run's launcher is untouched, and
// every run finishes with its own output.
func TestSparesKilledBesideALiveRun(t *testing.T) {
	h := newHarness(t, provision.Config{})
	h.defineSpares()
	w := h.startWorkerProc("killed-spares", 3)
	h.shortRuns(1, w.id) // the spares come with a run's end
	w.waitSpares(t, 2)
	live := h.startLive()
	own := w.busyLauncher(t)
	h.shortRuns(1, w.id) // the live run took a spare: two again
	var killed []int
	for round := range 4 {
		spares := w.waitSpares(t, 2)
		if back := slices.DeleteFunc(slices.Clone(spares), func(p int) bool { return !slices.Contains(killed, p) }); len(back) > 0 {
			t.Fatalf("round %d: killed spares %v wait again", round, back)
		}
		for _, p := range spares {
			if err := syscall.Kill(p, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
				t.Fatal(err)
			}
		}
		waitProcsGone(t, "the killed spares", spares...)
		killed = append(killed, spares...)
		h.assertLive(live)
		h.shortRuns(2, w.id)
	}
	if _, busy := w.launchers(); !slices.Equal(busy, []int{own}) {
		t.Fatalf("launchers running a run: %v, want only the live run's %d", busy, own)
	}
	t.Logf("the live run's launcher %d; spares killed: %v", own, killed)
	h.finish(live, w.id)
}

// TestSpawnerEventsBesideALiveRun keeps a long run in flight on worker A,
// whose launchers come from its spawner, while every event of a spawner
// that does not concern the run happens on the same host: worker B starts
// its own spawner and runs short runs; B's spawner is SIGKILLed (its
// spares die with it) and B's next runs work, their launchers forked by B
// itself; B is stopped and started again with a new spawner; then A itself
// is asked to stop while the run lasts. Killing A's own spawner would take
// the run's launcher with it, by design (docs/sandbox.md, "The spawner"),
// so that is not done here. What is promised: A keeps its spawner, the
// run's launcher and the run until the run ends, the run finishes with its
// own output, and only then does A exit and its spawner go.
func TestSpawnerEventsBesideALiveRun(t *testing.T) {
	l, err := sandbox.New(sandbox.Options{RunUID: sandbox.OwnUID})
	if err != nil {
		t.Fatal(err)
	}
	mode := l.Mode()
	l.Close()
	if mode != sandbox.ModeNamespaces && (mode != sandbox.ModePIDNamespace || os.Geteuid() == 0) {
		t.Skipf("runs here are contained in mode %s, whose launchers start without a user namespace: the worker forks them itself and has no spawner", mode)
	}
	h := newHarness(t, provision.Config{})
	h.defineSpares()
	shutdown := "AGORA_WORKER_SHUTDOWN_TIMEOUT=2m"
	a := h.startWorkerProc("spawner-a", 1, shutdown)
	spawnerOf := func(w *workerProc) int {
		t.Helper()
		var sp []int
		testkit.Eventually(t, 15*time.Second, "worker "+w.id+"'s spawner, or its warning that it has none", func() bool {
			sp = w.spawners()
			return len(sp) == 1 || strings.Contains(w.logs.String(), "sandbox: no spawner")
		})
		if len(sp) != 1 {
			t.Skipf("worker %s has no spawner on this host: %s", w.id, w.logs)
		}
		return sp[0]
	}
	spA := spawnerOf(a)
	live := h.startLive()
	own := a.busyLauncher(t)
	if !slices.Contains(childrenOf(spA), own) {
		t.Fatalf("the live run's launcher %d is not a child of worker A's spawner %d: the test would show nothing", own, spA)
	}

	// B starts its spawner and runs short runs (A's one slot is the live
	// run's).
	b := h.startWorkerProc("spawner-b", 2)
	spB := spawnerOf(b)
	h.shortRuns(4, b.id)
	sparesB := b.waitSpares(t, 2)

	// B's spawner dies; its spares go with it; B's next runs work.
	if err := syscall.Kill(spB, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitProcsGone(t, "B's spawner and its spares", append(sparesB, spB)...)
	h.assertLive(live)
	h.shortRuns(4, b.id)
	testkit.Eventually(t, 15*time.Second, "spares forked by worker B itself once its spawner died", func() bool {
		return slices.ContainsFunc(childrenOf(b.pid()), func(c int) bool { return procIs(c, launcher.Name) })
	})

	// B is stopped and started again: a spawner let go, a new one, the
	// new worker's sweep of the shared root at its start.
	b.stop(t)
	b2 := h.startWorkerProc("spawner-b2", 2)
	spawnerOf(b2)
	h.shortRuns(4, b2.id)

	// A is asked to stop while the live run lasts: it takes no more work
	// (B2 runs the next short runs) and keeps what the run needs.
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 15*time.Second, "worker A to stop taking work", func() bool { return strings.Contains(a.logs.String(), "worker stopping") })
	h.shortRuns(4, b2.id)
	if !a.running() || !procAlive(spA) || !procIs(own, launcher.Name) {
		t.Fatalf("while its run lasts, stopping worker A: running %t, its spawner %d alive %t, the run's launcher %d alive %t; want all",
			a.running(), spA, procAlive(spA), own, procIs(own, launcher.Name))
	}
	h.finish(live, a.id)
	a.waitExit(t)
	waitProcsGone(t, "worker A's spawner and the run's launcher", spA, own)
}
