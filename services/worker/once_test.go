package worker_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/services/worker"
)

// TestRunOnce: RunOnce handles exactly one dispatch of the two queued,
// returns its Outcome, and leaves the other on the work queue untouched.
func TestRunOnce(t *testing.T) {
	h := newHarness(t, provision.Config{})
	h.shell("once", `echo '{"ok":true}' > "$AGORA_OUTPUT_FILE"`)
	first := h.dispatch(lifecycle.Request{Subagent: "once", Input: json.RawMessage(`{}`)})
	second := h.dispatch(lifecycle.Request{Subagent: "once", Input: json.RawMessage(`{}`)})

	runOnce := func() worker.Outcome {
		t.Helper()
		svc, err := worker.New(h.workerConfig(), worker.Deps{Conn: h.srv.Conn(t), Logger: quietLogger()})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel()
		out, err := svc.RunOnce(ctx)
		if err != nil {
			t.Fatalf("RunOnce: %v", err)
		}
		return out
	}

	out := runOnce()
	want := worker.Outcome{DispatchID: first, Kind: lifecycle.KindFinished, ExitCode: 0}
	if out != want {
		t.Errorf("RunOnce = %+v, want %+v", out, want)
	}
	if got := kinds(h.events(first)); len(got) != 2 || got[1] != lifecycle.KindFinished {
		t.Errorf("events of the first dispatch = %v, want [started finished]", got)
	}
	if got := h.events(second); len(got) != 0 {
		t.Errorf("the second dispatch has events %v; RunOnce must not touch it", kinds(got))
	}
	if n := h.workPending(); n != 1 {
		t.Errorf("work queue holds %d messages, want the second one only", n)
	}
	if info := natstest.ConsumerInfo(t, h.js, lifecycle.StreamDispatch, lifecycle.ConsumerWorkers); info.NumPending != 1 || info.NumAckPending != 0 {
		t.Errorf("consumer: %d pending, %d awaiting ack; want 1 and 0 (the second dispatch not taken)", info.NumPending, info.NumAckPending)
	}

	// The next one-shot worker takes the second.
	if out := runOnce(); out.DispatchID != second || out.Kind != lifecycle.KindFinished {
		t.Errorf("second RunOnce = %+v, want the second dispatch finished", out)
	}
	h.waitWorkEmpty()

	// A delivery of an already-terminal dispatch is acked and reported
	// as skipped, which a one-shot worker treats as success.
	third := h.dispatch(lifecycle.Request{Subagent: "once", Input: json.RawMessage(`{}`)})
	h.publishEvent(&lifecycle.Cancelled{Common: lifecycle.Common{DispatchID: third, ThreadID: third, Subagent: "once"}, By: "test"})
	out = runOnce()
	if !out.Skipped || out.DispatchID != third || out.Kind != lifecycle.KindCancelled || worker.ExitCode(out) != 0 {
		t.Errorf("RunOnce on a terminal dispatch = %+v (exit %d), want skipped cancelled, exit 0", out, worker.ExitCode(out))
	}
	h.waitWorkEmpty()
}

func TestExitCode(t *testing.T) {
	cases := []struct {
		name string
		out  worker.Outcome
		want int
	}{
		{"finished", worker.Outcome{Kind: lifecycle.KindFinished, ExitCode: 0}, 0},
		{"needs_input", worker.Outcome{Kind: lifecycle.KindNeedsInput, ExitCode: 7}, 0},
		{"needs_input killed", worker.Outcome{Kind: lifecycle.KindNeedsInput, ExitCode: -1}, 0},
		{"skipped", worker.Outcome{Kind: lifecycle.KindFailed, Reason: lifecycle.ReasonProviderFailed, ExitCode: -1, Skipped: true}, 0},
		{"provider-failed exit 3", worker.Outcome{Kind: lifecycle.KindFailed, Reason: lifecycle.ReasonProviderFailed, ExitCode: 3}, 3},
		{"provider-failed exit 1", worker.Outcome{Kind: lifecycle.KindFailed, Reason: lifecycle.ReasonProviderFailed, ExitCode: 1}, 1},
		{"provider-failed exit 125", worker.Outcome{Kind: lifecycle.KindFailed, Reason: lifecycle.ReasonProviderFailed, ExitCode: 125}, 125},
		{"provider-failed without a code", worker.Outcome{Kind: lifecycle.KindFailed, Reason: lifecycle.ReasonProviderFailed, ExitCode: -1}, 1},
		{"worker-failed", worker.Outcome{Kind: lifecycle.KindFailed, Reason: lifecycle.ReasonWorkerFailed, ExitCode: -1}, 1},
		{"worker-failed with a runtime code", worker.Outcome{Kind: lifecycle.KindFailed, Reason: lifecycle.ReasonWorkerFailed, ExitCode: 4}, 1},
		{"timeout", worker.Outcome{Kind: lifecycle.KindFailed, Reason: lifecycle.ReasonTimeout, ExitCode: -1}, 1},
		{"cancelled", worker.Outcome{Kind: lifecycle.KindCancelled, ExitCode: -1}, 1},
		{"nothing handled", worker.Outcome{ExitCode: -1}, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := worker.ExitCode(c.out); got != c.want {
				t.Errorf("ExitCode(%+v) = %d, want %d", c.out, got, c.want)
			}
		})
	}
}

// TestWorkerBinaryOnce builds the real worker command and runs it as a
// Kubernetes Job would: `worker --once`, configured only by environment.
func TestWorkerBinaryOnce(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to build the worker binary")
	}
	bin := filepath.Join(t.TempDir(), "worker")
	bctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	build := exec.CommandContext(bctx, gobin, "build", "-o", bin, "./cmd/worker")
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}

	h := newHarness(t, provision.Config{})
	// env is the test's environment without any AGORA_* setting, plus vars.
	env := func(vars ...string) []string {
		var out []string
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "AGORA_") {
				out = append(out, kv)
			}
		}
		return append(out, vars...)
	}
	run := func(vars ...string) (int, string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, "--once")
		cmd.Env = env(vars...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		switch {
		case err == nil:
			return 0, stderr.String()
		case errors.As(err, &ee) && ee.ExitCode() >= 0:
			return ee.ExitCode(), stderr.String()
		}
		t.Fatalf("worker --once: %v\n%s", err, stderr.String())
		return 0, ""
	}
	good := []string{"AGORA_NATS_URL=" + h.srv.URL, "AGORA_WORKSPACE_ROOT=" + h.root, "AGORA_WORKER_PULL_EXPIRY=500ms", "AGORA_SANDBOX_UID=-1"}

	t.Run("provider-failed exits with the runtime's code", func(t *testing.T) {
		h.shell("exit3", `echo failing >&2; exit 3`)
		id := h.dispatch(lifecycle.Request{Subagent: "exit3", Input: json.RawMessage(`{}`)})
		code, stderr := run(good...)
		if code != 3 {
			t.Errorf("exit code = %d, want 3\n%s", code, stderr)
		}
		f := failedEvent(t, h.terminal(id))
		if f.Reason != lifecycle.ReasonProviderFailed || f.ExitCode == nil || *f.ExitCode != 3 {
			t.Errorf("failed = %s exit %v, want provider-failed exit 3", f.Reason, f.ExitCode)
		}
	})
	t.Run("finished exits 0", func(t *testing.T) {
		h.shell("ok", `true`)
		id := h.dispatch(lifecycle.Request{Subagent: "ok", Input: json.RawMessage(`{}`)})
		if code, stderr := run(good...); code != 0 {
			t.Errorf("exit code = %d, want 0\n%s", code, stderr)
		}
		if k := h.terminal(id).Data.(lifecycle.Lifecycle).LifecycleKind(); k != lifecycle.KindFinished {
			t.Errorf("terminal = %s, want finished", k)
		}
	})
	t.Run("worker-failed exits 1", func(t *testing.T) {
		id := h.dispatch(lifecycle.Request{Subagent: "ok", Input: json.RawMessage(`[1,2]`)})
		if code, stderr := run(good...); code != 1 {
			t.Errorf("exit code = %d, want 1\n%s", code, stderr)
		}
		if f := failedEvent(t, h.terminal(id)); f.Reason != lifecycle.ReasonWorkerFailed {
			t.Errorf("reason = %s, want worker-failed", f.Reason)
		}
	})
	t.Run("bad config exits 1 naming the variable", func(t *testing.T) {
		code, stderr := run(append(good, "AGORA_WORKER_CONCURRENCY=abc")...)
		if code != 1 {
			t.Errorf("exit code = %d, want 1", code)
		}
		if !strings.Contains(stderr, "AGORA_WORKER_CONCURRENCY") {
			t.Errorf("stderr does not name AGORA_WORKER_CONCURRENCY:\n%s", stderr)
		}
	})
	h.waitWorkEmpty()
}
