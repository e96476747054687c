package worker_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/services/worker"
)

// Terminal events fit (docs/worker.md, "Events fit"): lists are bounded
// with a count of what they leave out, an event too large for the server
// shrinks or ends the dispatch failed once, and a publish that can never
// succeed is never retried: the sub-agent runs exactly once.

// runCounter returns a file outside every workspace that a sub-agent
// appends one line to per run, and a function that counts the lines.
func runCounter(t *testing.T) (string, func() int) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "runs")
	return p, func() int {
		t.Helper()
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatalf("runs: %v", err)
		}
		return strings.Count(string(b), "\n")
	}
}

// assertRanOnce checks that the dispatch ended with one terminal event
// after one `started` (attempt 1), that its work message was acknowledged
// without a redelivery, and that the sub-agent ran exactly once.
func (h *harness) assertRanOnce(id string, runs func() int) {
	h.t.Helper()
	h.waitWorkEmpty() // acknowledged: nothing can run it again
	h.assertOneTerminal(id)
	var started []int
	for _, r := range h.events(id) {
		if st, ok := r.Data.(*lifecycle.Started); ok {
			started = append(started, st.Attempt)
		}
	}
	if len(started) != 1 || started[0] != 1 {
		h.t.Errorf("started events of attempts %v, want one of attempt 1", started)
	}
	c, err := h.js.Consumer(h.t.Context(), lifecycle.StreamDispatch, lifecycle.ConsumerWorkers)
	if err != nil {
		h.t.Fatal(err)
	}
	info, err := c.Info(h.t.Context())
	if err != nil {
		h.t.Fatal(err)
	}
	if info.NumRedelivered != 0 || info.NumAckPending != 0 {
		h.t.Errorf("workers consumer: %d redelivered, %d pending acks; want none", info.NumRedelivered, info.NumAckPending)
	}
	if n := runs(); n != 1 {
		h.t.Errorf("the sub-agent ran %d times, want once", n)
	}
}

// Attack 6 of the containment issue: 6,000 files with long names. Listed
// whole, the terminal event would pass the 1 MiB payload limit. It ends
// finished once; the uploads stop where the listing is full; every object
// stored is listed; the skipped list is capped and counts the rest.
func TestArtifactFloodEndsOnce(t *testing.T) {
	h := newHarness(t, provision.Config{})
	h.startWorker(h.workerConfig(), worker.Deps{})
	runsFile, runs := runCounter(t)
	h.shell("flood", `echo run >> '`+runsFile+`'
cd "$AGORA_ARTIFACTS_DIR"
long=$(printf '%0200d' 0)
i=0
while [ $i -lt 6000 ]; do : > "$long-$i"; i=$((i+1)); done`)
	id := h.dispatch(lifecycle.Request{Subagent: "flood"})
	r := h.terminal(id)
	f, ok := r.Data.(*lifecycle.Finished)
	if !ok {
		t.Fatalf("terminal = %T %+v, want finished", r.Data, r.Data)
	}
	h.assertRanOnce(id, runs)

	listed, _ := json.Marshal(f.Artifacts)
	skipped, _ := json.Marshal(f.ArtifactsSkipped)
	t.Logf("artifacts: %d listed (%d bytes), %d omitted; skipped: %d listed (%d bytes), %d omitted",
		len(f.Artifacts), len(listed), f.ArtifactsOmitted, len(f.ArtifactsSkipped), len(skipped), f.ArtifactsSkippedOmitted)
	if len(f.Artifacts) == 0 || len(listed) > lifecycle.MaxArtifactsListBytes || f.ArtifactsOmitted != 0 {
		t.Errorf("artifacts: %d listed in %d bytes, %d omitted; want some, at most %d bytes, none omitted (uploads stop where the listing is full)",
			len(f.Artifacts), len(listed), f.ArtifactsOmitted, lifecycle.MaxArtifactsListBytes)
	}
	if len(f.ArtifactsSkipped) == 0 || len(f.ArtifactsSkipped) > lifecycle.MaxSkippedListed || len(skipped) > lifecycle.MaxSkippedListBytes {
		t.Errorf("artifacts_skipped: %d entries in %d bytes, want 1 to %d in at most %d bytes",
			len(f.ArtifactsSkipped), len(skipped), lifecycle.MaxSkippedListed, lifecycle.MaxSkippedListBytes)
	}
	if total := len(f.Artifacts) + f.ArtifactsOmitted + len(f.ArtifactsSkipped) + f.ArtifactsSkippedOmitted; total != 6000 {
		t.Errorf("the event accounts for %d files, want 6000", total)
	}
	if !strings.Contains(f.ArtifactsSkipped[0].Reason, "listing cap") {
		t.Errorf("first skip reason %q, want the listing cap named", f.ArtifactsSkipped[0].Reason)
	}
	if objs := h.objects(id); len(objs) != len(f.Artifacts) {
		t.Errorf("%d objects stored, %d listed: want every stored object listed", len(objs), len(f.Artifacts))
	}
}

// A needs_input whose question is about 1 MiB (the sentinel's own limit)
// cannot fit the server's 1 MiB max payload whatever is given up: the
// dispatch fails once, worker-failed, saying why, with the run's artifact
// listed; it is not redelivered and the sub-agent runs once.
func TestTerminalEventTooLargeFailsOnce(t *testing.T) {
	h := newHarness(t, provision.Config{})
	h.startWorker(h.workerConfig(), worker.Deps{})
	runsFile, runs := runCounter(t)
	h.shell("huge-question", `echo run >> '`+runsFile+`'
echo notes > "$AGORA_ARTIFACTS_DIR/notes.txt"
{ printf '{"question":"Which one?","context":"'; head -c 1048400 /dev/zero | tr '\0' x; printf '"}'; } > "$AGORA_NEEDS_INPUT_FILE"`)
	id := h.dispatch(lifecycle.Request{Subagent: "huge-question"})
	r := h.terminal(id)
	f, ok := r.Data.(*lifecycle.Failed)
	if !ok {
		t.Fatalf("terminal = %T, want failed", r.Data)
	}
	h.assertRanOnce(id, runs)
	t.Logf("detail: %s", f.Detail)
	if f.Reason != lifecycle.ReasonWorkerFailed || !strings.Contains(f.Detail, "needs_input event of") ||
		!strings.Contains(f.Detail, "exceeds the server's max payload of") || !strings.Contains(f.Detail, "context 10484") {
		t.Errorf("failed %s: %q; want worker-failed naming the size, the max payload and the context", f.Reason, f.Detail)
	}
	if f.Attempt != 1 || f.ExitCode == nil || *f.ExitCode != 0 {
		t.Errorf("failed by attempt %d, exit code %v; want attempt 1 and the run's exit code 0", f.Attempt, f.ExitCode)
	}
	if len(f.Artifacts) != 1 || f.Artifacts[0].Name != "notes.txt" {
		t.Errorf("artifacts = %+v, want notes.txt", f.Artifacts)
	}
}

// The lifecycle stream's own max message size bounds events too. Known at
// the worker's start, it is fitted: a finished event drops its output with
// a note. Set while the worker runs, it makes the stream refuse the event
// (JetStream error 10054): that publish is not retried; the dispatch fails
// once, saying why.
func TestStreamMaxMessageSize(t *testing.T) {
	h := newHarness(t, provision.Config{})
	setMax := func(n int32) {
		t.Helper()
		s, err := h.js.Stream(t.Context(), lifecycle.StreamLifecycle)
		if err != nil {
			t.Fatal(err)
		}
		cfg := s.CachedInfo().Config
		cfg.MaxMsgSize = n
		if _, err := h.js.UpdateStream(t.Context(), cfg); err != nil {
			t.Fatal(err)
		}
	}
	setMax(16 << 10)
	h.startWorker(h.workerConfig(), worker.Deps{})
	runsFile, runs := runCounter(t)
	// 24 KiB of output (valid JSON, under the 64 KiB output cap).
	h.shell("wordy", `echo run >> '`+runsFile+`'
{ printf '"'; head -c 24576 /dev/zero | tr '\0' x; printf '"'; } > "$AGORA_OUTPUT_FILE"
echo done`)

	id := h.dispatch(lifecycle.Request{Subagent: "wordy"})
	fin, ok := h.terminal(id).Data.(*lifecycle.Finished)
	if !ok {
		t.Fatalf("terminal = %T, want finished (its output dropped)", h.terminal(id).Data)
	}
	h.assertRanOnce(id, runs)
	if (len(fin.Output) != 0 && string(fin.Output) != "null") || !strings.Contains(fin.OutputDropped, "24578 bytes of output.json dropped") || fin.StdoutTail != "done\n" {
		t.Errorf("finished: output %.40s, output_dropped %q, stdout_tail %q; want the output dropped with a note, the tail kept", fin.Output, fin.OutputDropped, fin.StdoutTail)
	}

	// The stream now takes less than the worker knows of.
	setMax(4 << 10)
	runsFile2, runs2 := runCounter(t)
	h.shell("wordy2", `echo run >> '`+runsFile2+`'
{ printf '"'; head -c 8192 /dev/zero | tr '\0' x; printf '"'; } > "$AGORA_OUTPUT_FILE"`)
	id2 := h.dispatch(lifecycle.Request{Subagent: "wordy2"})
	fl, ok := h.terminal(id2).Data.(*lifecycle.Failed)
	if !ok {
		t.Fatalf("terminal = %T, want failed", h.terminal(id2).Data)
	}
	h.assertRanOnce(id2, runs2)
	t.Logf("detail: %s", fl.Detail)
	if fl.Reason != lifecycle.ReasonWorkerFailed || !strings.Contains(fl.Detail, "can never be published") || !strings.Contains(fl.Detail, "exceeds maximum") {
		t.Errorf("failed %s: %q; want worker-failed saying the event can never be published", fl.Reason, fl.Detail)
	}
}

// A question whose event fits but whose record in agora_questions would
// not (10,000 options just under the sentinel's 1 MiB: the record holds
// them with the request to resume with) fails once, saying why, instead
// of leaving the router to retry it forever.
func TestQuestionTooLargeForItsRecord(t *testing.T) {
	h := newHarness(t, provision.Config{})
	h.startWorker(h.workerConfig(), worker.Deps{})
	runsFile, runs := runCounter(t)
	// Options of about 100 bytes each: the needs_input event is about 1,030,000
	// bytes, under the max payload; the record adds the request's input.
	h.shell("many-options", `echo run >> '`+runsFile+`'
opt=$(head -c 96 /dev/zero | tr '\0' o)
{ printf '{"question":"Which one?","options":['; i=0; while [ $i -lt 10000 ]; do [ $i -gt 0 ] && printf ','; printf '"%s%d"' "$opt" $i; i=$((i+1)); done; printf ']}'; } > "$AGORA_NEEDS_INPUT_FILE"`)
	id := h.dispatch(lifecycle.Request{Subagent: "many-options", Input: json.RawMessage(`{"notes":"` + strings.Repeat("n", 60<<10) + `"}`)})
	r := h.terminal(id)
	f, ok := r.Data.(*lifecycle.Failed)
	if !ok || f.Reason != lifecycle.ReasonWorkerFailed || !strings.Contains(f.Detail, "would make a record of about") || !strings.Contains(f.Detail, "10000 options") {
		t.Fatalf("terminal %T %+v, want failed worker-failed saying the question would not fit its record", r.Data, r.Data)
	}
	h.assertRanOnce(id, runs)
	h.assertOneTerminal(id)
}
