package bench_test

import (
	"compress/gzip"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/harness/bench"
)

// The history scenario runs, and after the retention the buckets hold no
// record of the finished threads.
func TestHistoryScenario(t *testing.T) {
	if testing.Short() {
		t.Skip("a 40-second scenario")
	}
	profiles := t.TempDir()
	rep, err := bench.History(t.Context(), bench.HistoryConfig{Threads: 40, Retention: 15 * time.Second, InFlight: 8, Slots: 4, HeapProfiles: profiles}, t.Output())
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Points) != 3 {
		t.Fatalf("points %+v", rep.Points)
	}
	peak, after := rep.Points[1], rep.Points[2]
	if peak.DispatchKeys != 120 || peak.QuestionKeys != 40 {
		t.Errorf("at the peak: %d dispatch keys, %d question keys; want 120 (2 records + 1 index per thread) and 40", peak.DispatchKeys, peak.QuestionKeys)
	}
	if after.DispatchKeys != 0 || after.QuestionKeys != 0 {
		t.Errorf("after the retention: %d dispatch keys, %d question keys; want none", after.DispatchKeys, after.QuestionKeys)
	}
	// Nor any marker: the buckets' streams hold what they held at the
	// start (the streams' events are kept for the duplicate window).
	start := rep.Points[0]
	for _, s := range []string{"KV_agora_dispatches", "KV_agora_questions", "KV_agora_decisions", "OBJ_agora_state"} {
		if peak.Messages[s] == 0 && s != "OBJ_agora_state" {
			t.Errorf("%s held nothing at the peak: the scenario wrote nothing there", s)
		}
		if after.Messages[s] != start.Messages[s] {
			t.Errorf("%s holds %d messages after the retention, %d at the start", s, after.Messages[s], start.Messages[s])
		}
	}
	// The capacity figures: every thread left records, events and
	// questions behind, read with all of them ended and none expired.
	if rep.StorageThreads != 40 {
		t.Errorf("storage sampled after %d threads, want all 40", rep.StorageThreads)
	}
	perThread := map[string]float64{}
	for _, s := range rep.Storage {
		perThread[s.Stream] = s.PerThread
	}
	for _, stream := range []string{"KV_agora_dispatches", "KV_agora_questions", "AGORA_LIFECYCLE", "AGORA_QUESTIONS"} {
		if perThread[stream] <= 0 {
			t.Errorf("storage of %s at the peak: %v bytes per thread (all: %+v)", stream, perThread[stream], rep.Storage)
		}
	}
	if rep.ThreadsPerSecond <= 0 || after.RSSMiB <= 0 || after.HeapMiB <= 0 || after.LiveMiB <= 0 || after.LiveMiB > after.HeapMiB {
		t.Errorf("report %+v", rep)
	}
	// A heap profile of each point, for `go tool pprof -base`.
	for _, p := range rep.Points {
		f, err := os.Open(filepath.Join(profiles, p.Point+".pb.gz"))
		if err != nil {
			t.Fatal(err)
		}
		zr, err := gzip.NewReader(f)
		if err != nil {
			t.Fatalf("the heap profile of %s: %v", p.Point, err)
		}
		if n, err := io.Copy(io.Discard, zr); err != nil || n == 0 {
			t.Errorf("the heap profile of %s: %d bytes, %v", p.Point, n, err)
		}
		f.Close()
	}
}

// The pending scenario leaves every question waiting, lists them through
// the SDK and the inbox, and times answers at that size.
func TestPendingScenario(t *testing.T) {
	if testing.Short() {
		t.Skip("a 20-second scenario")
	}
	rep, err := bench.Pending(t.Context(), bench.PendingConfig{Questions: 40, InFlight: 8, Slots: 4, Samples: 5}, t.Output())
	if err != nil {
		t.Fatal(err)
	}
	if rep.InboxPending != 40 || rep.ClientListCount != 40 || rep.ClientPageCount != 40 {
		t.Errorf("the inbox counts %d, the SDK lists %d and the router counts %d waiting questions, want 40", rep.InboxPending, rep.ClientListCount, rep.ClientPageCount)
	}
	if rep.AnswerSamples != 5 || rep.AnswerP50MS <= 0 || rep.AnswerP99MS < rep.AnswerP50MS {
		t.Errorf("answers: %d samples, p50 %v, p99 %v", rep.AnswerSamples, rep.AnswerP50MS, rep.AnswerP99MS)
	}
	if rep.ClientListMS <= 0 || rep.ClientPageMS <= 0 || rep.InboxPageMS <= 0 || rep.InboxAllMS <= 0 || rep.RSSMiB <= 0 || rep.HeapMiB <= 0 {
		t.Errorf("report %+v", rep)
	}
}

// The depth scenario takes one thread through its rounds and reads its
// status and thread view as it grows; the view lists every round so far.
func TestDepthScenario(t *testing.T) {
	if testing.Short() {
		t.Skip("a thread of 12 rounds")
	}
	rep, err := bench.Depth(t.Context(), bench.DepthConfig{Rounds: 12}, t.Output())
	if err != nil {
		t.Fatal(err)
	}
	var rounds []int
	for _, p := range rep.Points {
		rounds = append(rounds, p.Round)
		if p.Rounds != p.Round+1 || p.StatusMS <= 0 || p.ThreadMS <= 0 {
			t.Errorf("at round %d: %+v, want the view to list %d rounds", p.Round, p, p.Round+1)
		}
	}
	if want := []int{0, 9, 10}; !slices.Equal(rounds, want) {
		t.Errorf("points at rounds %v, want %v", rounds, want)
	}
}

// The long-runs scenario holds every dispatch running past a heartbeat
// period on separate worker processes, sees the workers' in-progress acks,
// the server's traffic and each run's own processes, and finds none of
// them left once the workers are killed.
func TestLongScenario(t *testing.T) {
	if testing.Short() {
		t.Skip("holds runs for 12 seconds")
	}
	dir := t.TempDir()
	out, err := exec.Command("go", "build", "-o", dir+"/", "github.com/agora-dispatch/agora/cmd/agora", "github.com/agora-dispatch/agora/cmd/agora-sandbox").CombinedOutput()
	if err != nil {
		t.Fatalf("build agora: %v\n%s", err, out)
	}
	const running = 40
	rep, err := bench.Long(t.Context(), bench.LongConfig{Running: running, Workers: 2, Window: 12 * time.Second, Exe: filepath.Join(dir, "agora")}, t.Output())
	if err != nil {
		t.Fatal(err)
	}
	// 40 runs, one in-progress ack every 10 s each (AckWait 30 s / 3).
	if rep.HeartbeatPeriod != "10s" || rep.HeartbeatsPerSec < 2 || rep.HeartbeatsPerSec > 8 {
		t.Errorf("heartbeats: %.1f/s every %s, want about 4/s", rep.HeartbeatsPerSec, rep.HeartbeatPeriod)
	}
	// Each run is at least its sub-agent's process (and its launcher's).
	if rep.RunProcesses < running || rep.RunRSSKiBPerRun <= 0 || rep.RunPSSKiBPerRun <= 0 {
		t.Errorf("the runs' own processes: %d, %.1f KiB RSS, %.1f KiB PSS per run", rep.RunProcesses, rep.RunRSSKiBPerRun, rep.RunPSSKiBPerRun)
	}
	if rep.WorkerRSSMiB <= 0 || rep.ServerMsgsInPerS <= 0 || rep.RSSMiB <= 0 {
		t.Errorf("report %+v", rep)
	}
	if rep.LeftBehind != 0 {
		t.Errorf("%d sub-agent processes outlived their killed workers", rep.LeftBehind)
	}
	if rep.MountsAfterSweep != 0 {
		t.Errorf("%d of the %d workspace filesystems the killed workers left are still mounted after a sweep", rep.MountsAfterSweep, rep.MountsLeft)
	}
}
