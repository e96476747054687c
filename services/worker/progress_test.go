package worker_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/services/worker"
)

// progressReports reads every progress report of a dispatch.
func (h *harness) progressReports(id string) []*lifecycle.Progress {
	h.t.Helper()
	var out []*lifecycle.Progress
	for _, m := range natstest.Stored(h.t, h.js, lifecycle.StreamProgress, lifecycle.ProgressFilter("", id)) {
		_, d := natstest.Lifecycle(h.t, m.Headers(), m.Data())
		out = append(out, d.(*lifecycle.Progress))
	}
	return out
}

// A sub-agent writes progress lines, then 10,000 in a burst, with
// malformed and oversized ones among them: the worker publishes a bounded
// number of coalesced reports, the last one carrying the last line and the
// counts, before the terminal event.
func TestProgressReportsAreCoalescedAndBounded(t *testing.T) {
	h := newHarness(t, provision.Config{})
	h.startWorker(h.workerConfig(), worker.Deps{})
	h.shell("reporter", `set -e
echo '{"message":"reading the code","percent":5,"todo":[{"text":"read","done":false},{"text":"fix","done":false}]}' >> "$AGORA_PROGRESS_FILE"
sleep 0.6
echo '{"percent":20}' >> "$AGORA_PROGRESS_FILE"
echo 'not json' >> "$AGORA_PROGRESS_FILE"
echo '{"percent":400}' >> "$AGORA_PROGRESS_FILE"
head -c 5000 /dev/zero | tr '\0' a >> "$AGORA_PROGRESS_FILE"; echo >> "$AGORA_PROGRESS_FILE"
sleep 0.6
seq 1 10000 | awk '{printf "{\"message\":\"step %d\",\"percent\":%.2f}\n", $1, $1/100}' >> "$AGORA_PROGRESS_FILE"
echo '"all done"' >> "$AGORA_PROGRESS_FILE"
sleep 0.3`)
	start := time.Now()
	id := h.dispatch(lifecycle.Request{Subagent: "reporter"})
	if _, ok := h.terminal(id).Data.(*lifecycle.Finished); !ok {
		t.Fatalf("terminal = %+v", h.terminal(id).Data)
	}
	took := time.Since(start)
	reps := h.progressReports(id)
	if len(reps) < 3 {
		t.Fatalf("%d reports, want one for each pause and the last", len(reps))
	}
	// At most one per interval, plus the last.
	if max := int(took/worker.ProgressInterval) + 2; len(reps) > max {
		t.Errorf("%d reports in %s, want at most %d", len(reps), took, max)
	}
	first, last := reps[0], reps[len(reps)-1]
	if first.Message != "reading the code" || first.Percent == nil || *first.Percent != 5 || len(first.Todo) != 2 {
		t.Errorf("first report = %+v", first)
	}
	if last.Message != "all done" || last.Percent == nil || *last.Percent != 100 || last.Lines != 10003 || last.Skipped != 3 {
		t.Errorf("last report = message %q percent %v lines %d skipped %d, want the last line, 10003 lines and 3 skipped", last.Message, last.Percent, last.Lines, last.Skipped)
	}
	for i, r := range reps {
		if r.Seq != i+1 || r.Attempt != 1 || r.DispatchID != id {
			t.Errorf("report %d = seq %d attempt %d dispatch %s", i, r.Seq, r.Attempt, r.DispatchID)
		}
	}
}

// A progress file that is a symlink to a file outside the workspace is not
// read: the worker publishes nothing from it.
func TestProgressFileSymlinkIsNotFollowed(t *testing.T) {
	h := newHarness(t, provision.Config{})
	h.startWorker(h.workerConfig(), worker.Deps{})
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte(`{"message":"s3cret-value"}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	h.shell("sneaky", `ln -s "$SECRET" "$AGORA_PROGRESS_FILE"; sleep 0.6`, func(d *subagent.Definition) { d.EnvAllow = []string{"SECRET"} })
	id := h.dispatch(lifecycle.Request{Subagent: "sneaky", Env: map[string]string{"SECRET": secret}})
	h.terminal(id)
	for _, r := range h.progressReports(id) {
		if strings.Contains(r.Message, "s3cret") {
			t.Fatalf("the worker followed the symlink and published %q", r.Message)
		}
	}
}
