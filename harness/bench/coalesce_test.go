package bench_test

import (
	"testing"

	"github.com/agora-dispatch/agora/harness/bench"
)

// Threads asking the same question make one waiting question that lists
// every one of them; the one answer resumes each thread once. Nothing here
// asserts a timing.
func TestCoalesceScenario(t *testing.T) {
	if testing.Short() {
		t.Skip("40 threads through ask once")
	}
	const threads = 40
	rep, err := bench.Coalesce(t.Context(), bench.CoalesceConfig{Threads: threads, InFlight: 16, Slots: 8}, t.Output())
	if err != nil {
		t.Fatal(err)
	}
	if rep.Waiting != 1 || rep.WaitingThreads != threads || rep.InboxPending != 1 {
		t.Errorf("%d waiting questions listing %d threads, the inbox shows %d; want 1 listing %d, and 1", rep.Waiting, rep.WaitingThreads, rep.InboxPending, threads)
	}
	if rep.ExtraResumes != 0 || rep.ExtraFinishes != 0 {
		t.Errorf("threads resumed more than once: %+v", rep)
	}
	if rep.AnswerReplyMS <= 0 || rep.FirstStartedMS <= 0 || rep.LastStartedMS < rep.FirstStartedMS || rep.LastFinishedMS <= 0 {
		t.Errorf("timings: %+v", rep)
	}
	// The router holds the question and its threads: some heap of its own.
	if rep.HeapMiB <= 0 || rep.RSSMiB <= 0 || rep.RouterHeapMiB <= 0 {
		t.Errorf("memory: %+v", rep)
	}
}
