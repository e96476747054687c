package bench_test

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/harness/bench"
)

// TestCommitScenario runs the acceptance-commit scenario small: each setup
// measures the five ways, every publish acknowledged (a batch that did
// not commit both messages fails the run, so does a fence read that finds
// no accepted event).
func TestCommitScenario(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := bench.Commit(ctx, bench.CommitConfig{Serial: 20, Throughput: 40, Concurrency: 4}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Setups) != 2 {
		t.Fatalf("setups: %+v", rep.Setups)
	}
	for _, st := range rep.Setups {
		if len(st.Rows) != 5 {
			t.Fatalf("%s: rows %+v", st.Setup, st.Rows)
		}
		for i, r := range st.Rows {
			if r.P50MS <= 0 || r.PerSecond <= 0 || r.CPUMS <= 0 || r.Serial != 20 || r.Throughput != 40 {
				t.Errorf("%s: row %q: %+v", st.Setup, r.Scenario, r)
			}
			if (i > 0) != (r.Baseline != "") {
				t.Errorf("%s: row %q: baseline %q", st.Setup, r.Scenario, r.Baseline)
			}
		}
	}
}
