package worker_test

import (
	"encoding/json"
	"strconv"
	"testing"

	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/services/worker"
)

// TestConcurrentRuns: a worker with Concurrency N runs N dispatches at the
// same time. Each sub-agent leaves a marker and waits until all N markers
// exist, so they can only all finish when they overlapped.
func TestConcurrentRuns(t *testing.T) {
	const n = 4
	h := newHarness(t, provision.Config{})
	cfg := h.workerConfig()
	cfg.Concurrency = n
	h.startWorker(cfg, worker.Deps{})
	h.shell("barrier", `touch "$MARKS/$AGORA_DISPATCH_ID"
i=0
while [ "$(ls "$MARKS" | wc -l)" -lt "$N" ]; do
	i=$((i+1))
	if [ "$i" -gt 200 ]; then echo "only $(ls "$MARKS" | wc -l) of $N ran at once" >&2; exit 9; fi
	sleep 0.1
done
echo "{\"seen\":$(ls "$MARKS" | wc -l)}" > "$AGORA_OUTPUT_FILE"`)

	marks := t.TempDir()
	var ids []string
	for range n {
		ids = append(ids, h.dispatch(lifecycle.Request{Subagent: "barrier", Input: json.RawMessage(`{}`),
			Env: map[string]string{"MARKS": marks, "N": strconv.Itoa(n)}}))
	}
	for _, id := range ids {
		r := h.terminal(id)
		fin, ok := r.Data.(*lifecycle.Finished)
		if !ok {
			t.Errorf("dispatch %s ended %T %+v, want finished (the runs did not overlap)", id, r.Data, r.Data)
			continue
		}
		if string(fin.Output) != `{"seen":4}` {
			t.Errorf("output = %s", fin.Output)
		}
	}
	started := 0
	for _, id := range ids {
		for _, r := range h.events(id) {
			if s, ok := r.Data.(*lifecycle.Started); ok {
				started++
				if s.Attempt != 1 {
					t.Errorf("dispatch %s started with attempt %d, want 1", id, s.Attempt)
				}
			}
		}
		h.assertOneTerminal(id)
	}
	if started != n {
		t.Errorf("%d started events, want %d", started, n)
	}
	h.waitWorkEmpty()
}
