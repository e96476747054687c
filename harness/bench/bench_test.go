package bench_test

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/agora-dispatch/agora/harness/bench"
)

// A small run measures every row, and the traced row's spans reach the
// in-process receiver and give the per-stage breakdown of its serial round
// trips. Nothing here asserts a timing.
func TestRunMeasuresEveryRow(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole path several times")
	}
	const serial = 30
	rep, err := bench.Run(t.Context(), bench.Config{Serial: serial, Throughput: 60, Concurrency: 4, Breakdown: true}, t.Output())
	if err != nil {
		t.Fatal(err)
	}
	// The sandbox layers: a row per layer in the mode this host gives runs
	// (the hosts, CI's included, give them namespaces).
	modes := map[string]int{}
	for _, l := range rep.Layers {
		if l.P50MS <= 0 {
			t.Errorf("sandbox layer %q: p50 %v", l.Layers, l.P50MS)
		}
		// Every run starts processes: it costs CPU here and machine-wide.
		if l.CPUMS <= 0 || l.MachineCPUMS <= 0 {
			t.Errorf("sandbox layer %q: CPU %v ms, machine CPU %v ms per run", l.Layers, l.CPUMS, l.MachineCPUMS)
		}
		modes[l.Mode]++
	}
	if modes[rep.SandboxMode] == 0 {
		t.Errorf("no sandbox layer rows for the mode in use %q: %+v", rep.SandboxMode, rep.Layers)
	}
	var traced *bench.Row
	largest := 0.0
	for _, a := range rep.Artifacts {
		if a.PeakRSSMiB <= 0 {
			t.Errorf("artifact row %q: peak RSS %v", a.Scenario, a.PeakRSSMiB)
		}
		largest = max(largest, a.PeakRSSMiB)
	}
	for i, r := range rep.Rows {
		if r.P50MS <= 0 {
			t.Errorf("row %q: p50 %v", r.Scenario, r.P50MS)
		}
		// Each row's own peak: the embedded server and every
		// service it started are in this process, so never zero.
		if r.PeakRSSMiB <= 0 {
			t.Errorf("row %q: peak RSS %v", r.Scenario, r.PeakRSSMiB)
		}
		largest = max(largest, r.PeakRSSMiB)
		// A row with a rate ran its throughput phase in this process:
		// it took CPU.
		if r.PerSecond > 0 && r.CPUMS <= 0 {
			t.Errorf("row %q: CPU per round trip %v", r.Scenario, r.CPUMS)
		}
		if strings.Contains(r.Scenario, "tracing on") {
			traced = &rep.Rows[i]
		}
	}
	// The HTTP owner check has its row, against the same door as an admin.
	if !slices.ContainsFunc(rep.Rows, func(r bench.Row) bool {
		return strings.Contains(r.Scenario, "as the principal that owns it") && strings.Contains(r.Baseline, "as an operator's token") && r.P50MS > 0
	}) {
		t.Errorf("no owner-check row against the operator's: %+v", rep.Rows)
	}
	if traced == nil || traced.PerSecond <= 0 || traced.Baseline == "" {
		t.Fatalf("no traced row with a rate and a baseline: %+v", rep.Rows)
	}
	// The run's peak is at least every row's (the traced resume, measured
	// last with --breakdown, may hold the largest).
	if rep.PeakRSSMiB < largest {
		t.Errorf("run peak RSS %.1f MiB below a row's %.1f MiB", rep.PeakRSSMiB, largest)
	}
	// Warm-up, serial and throughput dispatches each export a span per
	// stage; the breakdown counts the serial ones only (their span trees).
	if rep.TracedSpans < 8*(20+serial+60) {
		t.Errorf("%d spans exported, want at least 8 per dispatch", rep.TracedSpans)
	}
	stages := map[string]bench.Stage{}
	for _, s := range rep.Stages {
		stages[s.Span] = s
	}
	for _, name := range []string{"agora.dispatch", "agora.dispatch.validate", "agora.dispatch.record", "agora.dispatch.publish",
		"agora.queue", "agora.run", "agora.run.lookup", "agora.run.workspace", "agora.run.claim", "agora.run.process", "agora.run.publish", "agora.run.ack", "agora.run.cleanup"} {
		if s, ok := stages[name]; !ok || s.Count != serial {
			t.Errorf("stage %s: %+v, want %d serial spans (all: %+v)", name, s, serial, rep.Stages)
		}
	}
	// The projection applies accepted, started and finished of each
	// serial dispatch, under the spans that published them.
	if s := stages["agora.dispatch.project"]; s.Count != 3*serial {
		t.Errorf("stage agora.dispatch.project: %+v, want 3 per serial dispatch (%d)", s, 3*serial)
	}
	// Printed in the order a dispatch meets them.
	var got []string
	for _, s := range rep.Stages {
		got = append(got, s.Span)
	}
	if i, j := slices.Index(got, "agora.dispatch.record"), slices.Index(got, "agora.run.ack"); i < 0 || j < 0 || i > j {
		t.Errorf("stages out of path order: %v", got)
	}
	// The traced resume: each answer's tree, and nothing of the round
	// that asked (its dispatch has no parent to read).
	const answers = 20 // the resume row's samples at this size
	resumed := map[string]bench.Stage{}
	for _, s := range rep.ResumeStages {
		resumed[s.Span] = s
	}
	for _, name := range []string{"agora.question.answer", "agora.question.redispatch", "agora.dispatch", "agora.dispatch.parent", "agora.dispatch.publish",
		"agora.queue", "agora.run", "agora.run.lookup", "agora.run.claim", "agora.run.process"} {
		if s, ok := resumed[name]; !ok || s.Count != answers {
			t.Errorf("resume stage %s: %+v, want %d (all: %+v)", name, s, answers, rep.ResumeStages)
		}
	}
	if _, ok := resumed["agora.question.ask"]; ok {
		t.Errorf("the resume's stages hold the question's asking: %+v", rep.ResumeStages)
	}
	var out bytes.Buffer
	bench.Print(&out, rep)
	// The default table fits 100 columns; --wide keeps each scenario in its row.
	for _, line := range strings.Split(out.String(), "\n") {
		if n := utf8.RuneCountInString(line); n > 100 && !strings.HasPrefix(line, "launcher ") && !strings.HasPrefix(line, "workspaces under") && !strings.HasPrefix(line, "stages of") {
			t.Errorf("a line of %d columns: %q", n, line)
		}
	}
	var wide bytes.Buffer
	bench.PrintWide(&wide, rep)
	if !strings.Contains(wide.String(), rep.Rows[0].Scenario+"  ") {
		t.Errorf("the wide table does not hold the first scenario in its row:\n%s", wide.String())
	}
	if !strings.Contains(out.String(), "stages of the traced row") || !strings.Contains(out.String(), "agora.run.workspace") ||
		!strings.Contains(out.String(), "stages of a resume") || !strings.Contains(out.String(), "peak RSS MiB") {
		t.Errorf("printed report lacks the breakdown:\n%s", out.String())
	}
}
