package systemtest_test

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/harness/systemtest"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// streamCounts reads how many messages every stream holds (the buckets'
// and object stores' streams included), by name.
func streamCounts(t *testing.T, js jetstream.JetStream) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	names := js.StreamNames(t.Context())
	for name := range names.Name() {
		s, err := js.Stream(t.Context(), name)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		out[name] = info.State.Msgs
	}
	if err := names.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func countsText(c map[string]uint64) string {
	var b strings.Builder
	for _, name := range slices.Sorted(maps.Keys(c)) {
		fmt.Fprintf(&b, " %s=%d", name, c[name])
	}
	return b.String()
}

// Nothing Agora writes outlives the retention: after threads that ask
// (with a partial state kept as an object), are answered (one from a
// remembered decision, which is then forgotten) and finish, every stream
// and bucket holds again what it held before them — the events, the
// records, the markers left in agora_decisions by questions that ended and
// a decision forgotten, and those of the deleted partial-state objects.
func TestNothingOutlivesTheRetention(t *testing.T) {
	sys := systemtest.Start(t, systemtest.Options{
		Retention: retentionFor,
		// A duplicate window short enough for the streams' age limits to
		// follow the retention (they are at least the window).
		Provision: provision.Config{WorkAckWait: time.Second, WorkMaxDeliver: 2, Duplicates: 3 * time.Second},
		Routes:    "routes:\n  - name: team\n    answerer: agent\n    remember: 1h\n",
	})
	sys.Shell("big", bigAsker) // its partial state is kept as an object
	release := make(chan struct{})
	close(release)
	answerWith(sys, "team", "A", release)
	js := sys.Server.JetStream(t)
	start := streamCounts(t, js)

	var threads []string
	for range 2 { // the second is answered from the first's decision
		d, err := sys.Client.Dispatch(t.Context(), lifecycle.Request{Subagent: "big"})
		if err != nil {
			t.Fatal(err)
		}
		waitFinished(t, sys, d.ThreadID)
		threads = append(threads, d.ThreadID)
	}
	ds, err := sys.Client.Decisions(t.Context(), "team")
	if err != nil || len(ds) != 1 {
		t.Fatalf("decisions of team: %+v %v, want the one remembered", ds, err)
	}
	if _, err := sys.Client.ForgetDecision(t.Context(), ds[0].ID); err != nil {
		t.Fatal(err)
	}
	peak := streamCounts(t, js)
	for _, s := range []string{"KV_" + lifecycle.BucketDecisions, lifecycle.StreamQuestions, lifecycle.StreamLifecycle, "KV_" + lifecycle.BucketDispatches, "KV_" + lifecycle.BucketQuestions} {
		if peak[s] <= start[s] {
			t.Errorf("%s holds %d messages after %d threads, as before them: the test writes nothing there", s, peak[s], len(threads))
		}
	}
	t.Logf("before:%s", countsText(start))
	t.Logf("after the threads:%s", countsText(peak))
	last := ""
	testkit.Eventually(t, 30*time.Second, "every stream and bucket back to what it held before the threads", func() bool {
		now := streamCounts(t, js)
		for name, n := range now {
			if n > start[name] {
				if s := countsText(now); s != last {
					t.Logf("still above the start:%s", s)
					last = s
				}
				return false
			}
		}
		return true
	})
}
