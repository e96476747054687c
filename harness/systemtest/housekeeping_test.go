package systemtest_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/agora-dispatch/agora/harness/systemtest"
	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
)

// passNames are the counters of every periodic pass.
var passNames = []string{"agora_worker_workspace_sweeps_total", "agora_dispatcher_reconcile_passes_total",
	"agora_router_scans_total", "agora_router_cancel_sweeps_total"}

// passes reads the counters of every periodic pass from reg.
func passes(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, name := range passNames {
		out[name] = testkit.RegisteredCounter(t, reg, name)
	}
	return out
}

// waitPasses waits until every periodic pass has run at least n more
// times than in from.
func waitPasses(t *testing.T, reg *prometheus.Registry, from map[string]float64, n float64, what string) {
	t.Helper()
	testkit.Eventually(t, time.Minute, what, func() bool {
		for k, v := range passes(t, reg) {
			if v < from[k]+n {
				return false
			}
		}
		return true
	})
}

// TestLiveThreadOutlivesEveryHousekeepingPass runs a two-round thread
// across every periodic pass of the system, each several times, with the
// intervals shortened through their settings (systemtest.Options
// Housekeeping) and a retention shorter than the thread: the question
// waits while the router's scans and cancel sweeps, the dispatcher's
// reconciler and the worker's workspace sweeps run and the retention
// passes; then the resumed round runs across them all again. The thread
// must finish with its own output, each dispatch with exactly the ends it
// should have.
func TestLiveThreadOutlivesEveryHousekeepingPass(t *testing.T) {
	const retention = time.Second
	reg := prometheus.NewRegistry()
	sys := systemtest.Start(t, systemtest.Options{
		Retention: retention, Housekeeping: 100 * time.Millisecond, Registerer: reg,
		Routes: "routes:\n  - name: team\n    answerer: agent\n",
	})
	// The run's host uid is an unprivileged one of its own: it may write
	// its mark here and see the gate.
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	mark, gate, nonce := filepath.Join(dir, "up"), filepath.Join(dir, "gate"), lifecycle.NewID()
	script := fmt.Sprintf(`if [ "$AGORA_ROUND" -lt 1 ]; then
  printf '{"question":"A or B?","options":["A","B"],"partial_state":{"nonce":"%[1]s"}}' > "$AGORA_NEEDS_INPUT_FILE"
else
  echo up > %[2]s
  while [ ! -e %[3]s ]; do sleep 0.05; done
  printf '{"nonce":"%[1]s","answer":%%s}' "$(cat .agora/input.json | sed 's/.*"answer":\("[^"]*"\).*/\1/')" > "$AGORA_OUTPUT_FILE"
fi`, nonce, mark, gate)
	def := subagent.Definition{Name: "long", Runtime: subagent.RuntimeExec, Command: []string{"sh", "-c", script}, Timeout: "5m",
		Sandbox: subagent.Sandbox{WritePaths: []string{dir}}}
	if _, err := sys.Client.ApplySubagent(t.Context(), def); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	answerWith(sys, "team", "B", release)

	began := time.Now()
	d, err := sys.Client.Dispatch(t.Context(), lifecycle.Request{Subagent: "long"})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, "round 0 to ask", func() bool {
		r, err := sys.Client.Status(t.Context(), d.DispatchID)
		return err == nil && r.Status == lifecycle.KindNeedsInput
	})
	// The question waits across every pass and past the retention.
	waitPasses(t, reg, passes(t, reg), 5, "every periodic pass five times while the question waits")
	testkit.Eventually(t, 30*time.Second, "twice the retention since the dispatch", func() bool { return time.Since(began) > 2*retention })
	close(release)

	testkit.Eventually(t, 30*time.Second, "round 1 to run", func() bool { _, err := os.Stat(mark); return err == nil })
	// The resumed round runs across every pass and past the retention.
	running := time.Now()
	waitPasses(t, reg, passes(t, reg), 5, "every periodic pass five times while round 1 runs")
	testkit.Eventually(t, 30*time.Second, "twice the retention since round 1 began", func() bool { return time.Since(running) > 2*retention })
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}

	fin := waitFinished(t, sys, d.ThreadID)
	var out struct{ Nonce, Answer string }
	if err := json.Unmarshal(fin.Output, &out); err != nil || out.Nonce != nonce || out.Answer != "B" {
		t.Fatalf("finished with output %s, want nonce %s and answer B", fin.Output, nonce)
	}
	th, err := sys.Client.Thread(t.Context(), d.ThreadID)
	if err != nil {
		t.Fatal(err)
	}
	if len(th.Rounds) != 2 || th.Rounds[0].Status != lifecycle.KindNeedsInput || th.Rounds[1].Status != lifecycle.KindFinished {
		t.Fatalf("thread rounds %+v, want needs_input then finished", th.Rounds)
	}
	for _, r := range th.Rounds {
		var ends []lifecycle.Kind
		for _, e := range r.Events {
			if d, err := lifecycle.Parse(e); err == nil {
				if l, ok := d.(lifecycle.Lifecycle); ok && l.LifecycleKind().Terminal() {
					ends = append(ends, l.LifecycleKind())
				}
			}
		}
		if len(ends) != 1 {
			t.Errorf("dispatch %s has the terminal events %v, want exactly 1", r.DispatchID, ends)
		}
	}
}
