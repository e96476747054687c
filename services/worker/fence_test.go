package worker_test

import (
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/services/worker"
)

// attemptAgent is a sub-agent that marks its start per attempt, waits until
// the test lets that attempt go on, and writes output naming the attempt.
const attemptAgent = `a=$AGORA_ATTEMPT
touch "$MARKS/started.$a"
while [ ! -e "$MARKS/go.$a" ]; do sleep 0.05; done
echo "{\"attempt\":$a}" > "$AGORA_OUTPUT_FILE"`

// testkit.Buffer is a bytes.Buffer a process writes while the test reads it.

// startLoggedWorkerProcess is startWorkerProcess with logs readable while
// the worker runs.
func (h *harness) startLoggedWorkerProcess(id string) (*exec.Cmd, *testkit.Buffer) {
	h.t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "WORKER_TEST_MAIN=1", "AGORA_NATS_URL="+h.srv.URL, "AGORA_WORKSPACE_ROOT="+h.root,
		"AGORA_WORKER_ID="+id, "AGORA_WORKER_CONCURRENCY=1", "AGORA_WORKER_PULL_EXPIRY=500ms", "AGORA_SANDBOX_UID=-1")
	logs := &testkit.Buffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { _ = cmd.Process.Signal(syscall.SIGCONT); _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd, logs
}

func waitLog(t *testing.T, logs *testkit.Buffer, want string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(logs.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("log never said %q:\n%s", want, logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The soak's case: worker A is paused (SIGSTOP) past AckWait after its
// sub-agent finished; attempt 2 starts on worker B, which is then killed;
// A resumes. A must not publish its stale result — before fencing it won
// the terminal id with `finished` — and attempt 3 ends the dispatch with
// its own output.
func TestStaleWorkerIsFenced(t *testing.T) {
	h := newHarness(t, provision.Config{WorkAckWait: 2 * time.Second})
	marks := t.TempDir()
	h.shell("attempts", attemptAgent)
	if err := os.WriteFile(filepath.Join(marks, "go.3"), nil, 0o600); err != nil {
		t.Fatal(err)
	}

	a, aLogs := h.startLoggedWorkerProcess("worker-a")
	id := h.dispatch(lifecycle.Request{Subagent: "attempts", Env: map[string]string{"MARKS": marks}})
	waitFile(t, filepath.Join(marks, "started.1"))
	if err := a.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// Attempt 1's sub-agent finishes while its worker is paused.
	if err := os.WriteFile(filepath.Join(marks, "go.1"), nil, 0o600); err != nil {
		t.Fatal(err)
	}

	b, _ := h.startLoggedWorkerProcess("worker-b")
	waitFile(t, filepath.Join(marks, "started.2"))
	if err := b.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = b.Wait()

	if err := a.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitLog(t, aLogs, "fenced")
	h.startWorker(h.workerConfig(), worker.Deps{})

	r := h.terminal(id)
	f, ok := r.Data.(*lifecycle.Finished)
	if !ok {
		t.Fatalf("terminal = %T %+v, want finished", r.Data, r.Data)
	}
	if string(f.Output) != `{"attempt":3}` || f.Attempt != 3 {
		t.Fatalf("finished by attempt %d with output %s, want attempt 3 with its own output", f.Attempt, f.Output)
	}
	h.assertOneTerminal(id)
	for _, l := range strings.Split(aLogs.String(), "\n") {
		if strings.Contains(l, `msg="dispatch ended"`) && strings.Contains(l, " attempt=1 ") {
			t.Errorf("the stale worker logged an outcome the stream never accepted: %s", l)
		}
	}
	h.waitWorkEmpty()
}

// A run whose dispatch is taken over by a newer attempt while it runs is
// stopped at its next progress tick and publishes nothing; the newer
// attempt's claim stands. Here the "newer attempt" is a `started` with a
// higher attempt that never finishes, so the dispatch ends through
// redelivery-exhaustion — never with the stale run's `finished`.
func TestRunTakenOverPublishesNothing(t *testing.T) {
	h := newHarness(t, provision.Config{WorkAckWait: time.Second, WorkMaxDeliver: 2})
	marks := t.TempDir()
	h.shell("attempts", attemptAgent+`
exec sh -c 'sleep 60; :' "taken-over-$AGORA_DISPATCH_ID"`)
	h.startWorker(h.workerConfig(), worker.Deps{})
	id := h.dispatch(lifecycle.Request{Subagent: "attempts", Env: map[string]string{"MARKS": marks}})
	waitFile(t, filepath.Join(marks, "started.1"))
	h.publishEvent(&lifecycle.Started{Common: lifecycle.Common{DispatchID: id, ThreadID: id, Subagent: "attempts"}, WorkerID: "intruder", Attempt: 9})
	// The stale run's sub-agent would finish now and sleep on.
	if err := os.WriteFile(filepath.Join(marks, "go.1"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	assertNoProcess(t, "taken-over-"+id)

	r := h.terminal(id)
	f, ok := r.Data.(*lifecycle.Failed)
	if !ok || f.Reason != lifecycle.ReasonRedeliveryExhausted {
		t.Fatalf("terminal = %T %+v, want failed redelivery-exhausted", r.Data, r.Data)
	}
	h.assertOneTerminal(id)
	for _, e := range h.events(id) {
		if s, ok := e.Data.(*lifecycle.Started); ok && s.Attempt != 1 && s.Attempt != 9 {
			t.Errorf("attempt %d started although attempt 9 owns the dispatch", s.Attempt)
		}
	}
}

// A newer attempt takes over from an older attempt's `started` (the older
// worker died) and its terminal event records it.
func TestTerminalRecordsAttempt(t *testing.T) {
	h := newHarness(t, provision.Config{})
	marks := t.TempDir()
	for _, a := range []string{"go.1", "go.2"} {
		if err := os.WriteFile(filepath.Join(marks, a), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	h.shell("attempts", attemptAgent)
	svc := h.startWorker(h.workerConfig(), worker.Deps{})
	id := h.dispatch(lifecycle.Request{Subagent: "attempts", Env: map[string]string{"MARKS": marks}})
	r := h.terminal(id)
	f, ok := r.Data.(*lifecycle.Finished)
	if !ok || f.Attempt != 1 || f.WorkerID != svc.ID() || string(f.Output) != `{"attempt":1}` {
		t.Fatalf("terminal = %T %+v, want finished by attempt 1 of %s", r.Data, r.Data, svc.ID())
	}
}

// At start a worker removes workspaces that no run holds any more and
// kills what still works in them; a workspace a live run holds, and
// anything that is not a workspace, stay.
func TestSweepRemovesAbandonedWorkspaces(t *testing.T) {
	h := newHarness(t, provision.Config{})
	mk := func(name string, agora bool) string {
		dir := filepath.Join(h.root, name)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if agora {
			if err := os.Mkdir(filepath.Join(dir, ".agora"), 0o700); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	abandoned := mk("01ABANDONED.1.12345", true)
	// A bare name may be a user's folder: only <id>.<attempt>.<n> is
	// recognised as a workspace.
	bare := mk("01BARE", true)
	held := mk("01HELD.2.67890", true)
	notWorkspace := mk("01PLAIN.1.1", false)
	other := mk("my-notes", true)

	// A process a killed worker left behind, still working in its folder.
	leftover := exec.Command("sh", "-c", "sleep 60; :", "leftover-"+filepath.Base(abandoned))
	leftover.Dir = abandoned
	if err := leftover.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = leftover.Process.Kill(); _ = leftover.Wait() })

	// A live run holds its workspace's lock.
	holdLock(t, held)

	h.startWorker(h.workerConfig(), worker.Deps{})
	waitGoneWithin(t, abandoned, 10*time.Second)
	assertNoProcess(t, "leftover-"+filepath.Base(abandoned))
	for _, keep := range []string{held, notWorkspace, other, bare} {
		if _, err := os.Stat(keep); err != nil {
			t.Errorf("%s was removed: %v", keep, err)
		}
	}
}

// The run's own terminal publish is what fences it when no progress tick
// comes first (a long AckWait): a newer attempt's `started` landed while
// the sub-agent finished, so its `finished` is refused and nothing of this
// run reaches the stream.
func TestTerminalPublishIsFenced(t *testing.T) {
	h := newHarness(t, provision.Config{WorkAckWait: time.Minute})
	marks := t.TempDir()
	h.shell("attempts", attemptAgent)
	logs := &testkit.Buffer{}
	h.startWorker(h.workerConfig(), worker.Deps{Logger: slog.New(slog.NewTextHandler(logs, nil))})
	id := h.dispatch(lifecycle.Request{Subagent: "attempts", Env: map[string]string{"MARKS": marks}})
	waitFile(t, filepath.Join(marks, "started.1"))
	h.publishEvent(&lifecycle.Started{Common: lifecycle.Common{DispatchID: id, ThreadID: id, Subagent: "attempts"}, WorkerID: "intruder", Attempt: 2})
	if err := os.WriteFile(filepath.Join(marks, "go.1"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	waitLog(t, logs, "fenced")
	if strings.Contains(logs.String(), "moved on without this run") {
		t.Fatal("a progress tick fenced the run; this test is for the terminal publish")
	}
	// "fenced" is logged once the stream refused the run's terminal
	// publish and the run gave up; it publishes nothing after it, so the
	// stream already holds all this run will ever store.
	for _, e := range h.events(id) {
		if k, ok := e.Data.(lifecycle.Lifecycle); ok && k.LifecycleKind().Terminal() {
			t.Fatalf("terminal %s stored for a fenced run: %+v", k.LifecycleKind(), e.Data)
		}
	}
}
