package worker_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/internal/proclist"
	"github.com/agora-dispatch/agora/internal/testkit"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/services/worker"
)

// startWorkerProcess runs a real worker in a child process (this test
// binary in worker mode) and returns it.
func (h *harness) startWorkerProcess(id string) (*exec.Cmd, *bytes.Buffer) {
	h.t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "WORKER_TEST_MAIN=1", "AGORA_NATS_URL="+h.srv.URL, "AGORA_WORKSPACE_ROOT="+h.root,
		"AGORA_WORKER_ID="+id, "AGORA_WORKER_CONCURRENCY=1", "AGORA_WORKER_PULL_EXPIRY=500ms", "AGORA_SANDBOX_UID=-1")
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd, &logs
}

// A worker process killed with SIGKILL mid-run: the message is redelivered
// after AckWait, another worker runs it as attempt 2, and the dispatch has
// exactly one terminal event. The killed worker's sub-agent dies with it.
func TestWorkerKilledMidRunIsCompletedByAnother(t *testing.T) {
	h := newHarness(t, provision.Config{WorkAckWait: 2 * time.Second})
	marks := t.TempDir()
	// Attempt 1 leaves a daemonised grandchild that would write into the
	// next attempt's output if it outlived its worker.
	h.shell("flaky", `if [ -e "$MARKS/first" ]; then echo '{"ok":true}' > "$AGORA_OUTPUT_FILE"; sleep 1; exit 0; fi
out="$AGORA_OUTPUT_FILE"
setsid sh -c 'sleep 3; echo "{\"from\":\"attempt 1\"}" > "$1"' "grandchild-$AGORA_DISPATCH_ID" "$out" </dev/null >/dev/null 2>&1 &
touch "$MARKS/first"; exec sh -c 'sleep 60; :' "flaky-$AGORA_DISPATCH_ID"`)

	victim, logs := h.startWorkerProcess("victim")
	id := h.dispatch(lifecycle.Request{Subagent: "flaky", Env: map[string]string{"MARKS": marks}})
	waitFile(t, filepath.Join(marks, "first"))
	if err := victim.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = victim.Wait()
	t.Logf("victim worker output:\n%s", logs)
	assertNoProcess(t, "flaky-"+id)
	assertNoProcess(t, "grandchild-"+id)

	h.startWorker(h.workerConfig(), worker.Deps{})
	r := h.terminal(id)
	f, ok := r.Data.(*lifecycle.Finished)
	if !ok {
		t.Fatalf("terminal = %T %+v, want finished", r.Data, r.Data)
	}
	if string(f.Output) != `{"ok":true}` || f.Attempt != 2 || f.WorkerID == "victim" {
		t.Fatalf("finished = output %s by attempt %d of %q, want attempt 2's own output", f.Output, f.Attempt, f.WorkerID)
	}
	h.assertOneTerminal(id)
	evs := h.events(id)
	var attempts []int
	var workers []string
	for _, e := range evs {
		if s, ok := e.Data.(*lifecycle.Started); ok {
			attempts = append(attempts, s.Attempt)
			workers = append(workers, s.WorkerID)
		}
	}
	if len(attempts) != 2 || attempts[0] != 1 || attempts[1] != 2 || workers[0] != "victim" || workers[1] == "victim" {
		t.Fatalf("started attempts %v by %v, want [1 2] by victim then another worker", attempts, workers)
	}
	h.waitWorkEmpty()
}

// When every delivery dies (MaxDeliver reached), the JetStream advisory
// makes a worker end the dispatch `failed` redelivery-exhausted and remove
// the dead message from the work queue.
func TestRedeliveryExhausted(t *testing.T) {
	h := newHarness(t, provision.Config{WorkAckWait: time.Second, WorkMaxDeliver: 2})
	h.shell("never", `exit 0`)
	id := h.dispatch(lifecycle.Request{Subagent: "never"})

	// Two workers that take the message and die before acknowledging it.
	cons, err := h.js.Consumer(t.Context(), lifecycle.StreamDispatch, lifecycle.ConsumerWorkers)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		m, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
		if err != nil {
			t.Fatalf("delivery %d: %v", i+1, err)
		}
		md, _ := m.Metadata()
		if int(md.NumDelivered) != i+1 {
			t.Fatalf("delivery count %d, want %d", md.NumDelivered, i+1)
		}
	}
	// A healthy worker is up when the last delivery's AckWait runs out.
	h.startWorker(h.workerConfig(), worker.Deps{})
	r := h.terminal(id)
	f, ok := r.Data.(*lifecycle.Failed)
	if !ok || f.Reason != lifecycle.ReasonRedeliveryExhausted {
		t.Fatalf("terminal = %+v, want failed redelivery-exhausted", r.Data)
	}
	h.assertOneTerminal(id)
	h.waitWorkEmpty()
}

// Shutdown: a stop lets in-flight runs finish within the shutdown timeout;
// past it they are stopped and end cancelled.
func TestShutdown(t *testing.T) {
	cases := []struct {
		name, script string
		timeout      time.Duration
		want         lifecycle.Kind
	}{
		{"finishes-in-time", `touch "$MARKS/started"; sleep 1; echo '{"done":true}' > "$AGORA_OUTPUT_FILE"`, 20 * time.Second, lifecycle.KindFinished},
		{"cancelled-after-timeout", `touch "$MARKS/started"; exec sleep 60`, 300 * time.Millisecond, lifecycle.KindCancelled},
		// A run that ignores the stop and leaves a double-forked child
		// behind: it is killed all the same, and so is the child.
		{"hostile-after-timeout", `trap '' TERM INT HUP; (sh -c 'trap "" TERM INT HUP; sleep 60; :' agora-shutdown-survivor &) ; touch "$MARKS/started"; while :; do sleep 1; done`, 300 * time.Millisecond, lifecycle.KindCancelled},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, provision.Config{})
			marks := t.TempDir()
			h.shell("job", c.script)
			cfg := h.workerConfig()
			cfg.ShutdownTimeout = c.timeout
			svc, err := worker.New(cfg, worker.Deps{Conn: h.srv.Conn(t), Logger: quietLogger()})
			if err != nil {
				t.Fatal(err)
			}
			ctx, stop := context.WithCancel(context.Background())
			defer stop()
			done := make(chan error, 1)
			go func() { done <- svc.Run(ctx) }()
			id := h.dispatch(lifecycle.Request{Subagent: "job", Env: map[string]string{"MARKS": marks}})
			waitFile(t, filepath.Join(marks, "started"))
			if c.name == "hostile-after-timeout" {
				// The survivor runs before the stop, or the check after it
				// would prove nothing.
				testkit.Eventually(t, 10*time.Second, "the double-forked child to run", func() bool {
					return len(proclist.WithMarker("agora-shutdown-survivor")) > 0
				})
			}
			stop()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("Run: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("Run did not return after stop")
			}
			// Run returned: the terminal event is already stored.
			r := h.terminal(id)
			if k := r.Data.(lifecycle.Lifecycle).LifecycleKind(); k != c.want {
				t.Fatalf("terminal = %s %+v, want %s", k, r.Data, c.want)
			}
			if cc, ok := r.Data.(*lifecycle.Cancelled); ok && cc.By != "worker:"+svc.ID() {
				t.Errorf("cancelled by %q, want worker:%s", cc.By, svc.ID())
			}
			h.waitWorkEmpty()
			if c.name == "hostile-after-timeout" {
				assertNoProcess(t, "agora-shutdown-survivor")
			}
		})
	}
}
