package chaos_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agora-dispatch/agora/harness/chaos"
	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// The ask-once audit passes a group whose asked question lists every
// joined thread, each answered once and resumed once, and reports each way
// a group can go wrong.
func TestAuditAskOnce(t *testing.T) {
	// q1 was asked by thread t1; q2 and q3 (threads t2, t3) joined it; q4
	// (thread t4) was asked on its own.
	question := func(n, status, joinedTo string) lifecycle.Question {
		return lifecycle.Question{Common: lifecycle.Common{DispatchID: "d" + n, ThreadID: "t" + n, Subagent: "chaos"},
			QuestionID: "q" + n, Status: status, JoinedTo: joinedTo, Route: "default", Question: "go on?"}
	}
	waiting := func(ns ...string) []lifecycle.WaitingThread {
		var out []lifecycle.WaitingThread
		for _, n := range ns {
			out = append(out, lifecycle.WaitingThread{QuestionID: "q" + n, DispatchID: "d" + n, ThreadID: "t" + n})
		}
		return out
	}
	good := func() []lifecycle.Question {
		q1 := question("1", "answered", "")
		q1.WaitingThreads = waiting("1", "2", "3")
		return []lifecycle.Question{q1, question("2", "answered", "q1"), question("3", "answered", "q1"), question("4", "answered", "")}
	}
	once := func() map[string]int { return map[string]int{"d1": 1, "d2": 1, "d3": 1, "d4": 1} }
	answeredOnce := func() map[string]int { return map[string]int{"q1": 1, "q2": 1, "q3": 1, "q4": 1} }
	cases := []struct {
		name     string
		edit     func(qs []lifecycle.Question, children, answered map[string]int)
		anomaly  string // "" when none
		coalesce int    // questions joined
		byKey    int    // groups joined by dedupe_key
		history  string // a history entry written into q1's record
	}{
		{name: "every thread resumed once", edit: func([]lifecycle.Question, map[string]int, map[string]int) {}, coalesce: 2},
		{name: "a group joined by its dedupe_key", edit: func(qs []lifecycle.Question, _, _ map[string]int) { qs[1].Question = "go on? (t2)" },
			coalesce: 2, byKey: 1},
		{name: "a joined thread resumed twice", edit: func(_ []lifecycle.Question, c, _ map[string]int) { c["d2"] = 2 },
			anomaly: "dispatch d2 resumed 2 times", coalesce: 2},
		{name: "a joined thread never resumed", edit: func(_ []lifecycle.Question, c, _ map[string]int) { delete(c, "d3") },
			anomaly: "2 of its 3 waiting threads resumed once", coalesce: 2},
		{name: "a joined question without its answered event", edit: func(_ []lifecycle.Question, _, a map[string]int) { delete(a, "q2") },
			anomaly: "question q2 (joined to \"q1\") was answered with 0 answered events", coalesce: 2},
		{name: "a joined question left joined", edit: func(qs []lifecycle.Question, _, _ map[string]int) { qs[2].Status = lifecycle.StatusJoined },
			anomaly: "question q3 (joined to \"q1\") ended joined", coalesce: 2},
		{name: "a joined question not listed", edit: func(qs []lifecycle.Question, _, _ map[string]int) { qs[0].WaitingThreads = waiting("1", "2") },
			anomaly: "question q3 joined q1, which does not list it", coalesce: 2},
		{name: "a listed thread that joined nothing", edit: func(qs []lifecycle.Question, _, _ map[string]int) {
			qs[0].WaitingThreads = waiting("1", "2", "3", "4")
		}, anomaly: "lists waiting question q4, which joined \"\"", coalesce: 2},
		{name: "a thread unlisted after it was asked on its own", edit: func([]lifecycle.Question, map[string]int, map[string]int) {},
			history: `{"at":"2026-01-01T00:00:00Z","via":"join","result":"unlisted","reason":"question q9 was listed on this one but did not wait on it"}`,
			anomaly: "question q1 unlisted a thread that was asked on its own", coalesce: 2},
		{name: "an asked question never resumed", edit: func(_ []lifecycle.Question, c, _ map[string]int) { delete(c, "d4") },
			anomaly: "question q4 (joined to \"\") was answered and its dispatch d4 resumed 0 times", coalesce: 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := natstest.StartProvisioned(t, provision.Config{})
			js := srv.JetStream(t)
			qs, children, answered := good(), once(), answeredOnce()
			tc.edit(qs, children, answered)
			natstest.PutQuestions(t, js, qs...)
			if tc.history != "" {
				kv := natstest.KeyValue(t, js, lifecycle.BucketQuestions)
				en, err := kv.Get(t.Context(), "q1")
				if err != nil {
					t.Fatal(err)
				}
				var rec map[string]json.RawMessage
				if err := json.Unmarshal(en.Value(), &rec); err != nil {
					t.Fatal(err)
				}
				rec["history"] = json.RawMessage("[" + tc.history + "]")
				b, _ := json.Marshal(rec)
				if _, err := kv.Put(t.Context(), "q1", b); err != nil {
					t.Fatal(err)
				}
			}
			rep := chaos.AuditAskOnce(t.Context(), js, children, answered)
			if rep.Coalesced != tc.coalesce || rep.Groups != 1 || rep.DedupeGroups != tc.byKey {
				t.Errorf("%d questions joined in %d groups, %d by dedupe_key; want %d in 1, %d", rep.Coalesced, rep.Groups, rep.DedupeGroups, tc.coalesce, tc.byKey)
			}
			switch {
			case tc.anomaly == "" && len(rep.Anomalies) > 0:
				t.Errorf("anomalies: %q", rep.Anomalies)
			case tc.anomaly == "":
				if !slices.Equal(rep.GroupSizes, []int{3}) || rep.Resumes != 4 {
					t.Errorf("groups %v, %d resumes checked; want [3] and 4", rep.GroupSizes, rep.Resumes)
				}
			case !slices.ContainsFunc(rep.Anomalies, func(a string) bool { return strings.Contains(a, tc.anomaly) }):
				t.Errorf("anomalies %q, want one with %q (children %v)", rep.Anomalies, tc.anomaly, children)
			}
		})
	}
}

// The audit counts every end by kind and reason and reports each end the
// soak did not cause on purpose, read from real events on a real
// JetStream: a failed of any reason, a cancelled (the soak cancels
// nothing), a finished with a null output or with another attempt's, and
// a dispatch with no end at all.
func TestAuditReportsUnexpectedEnds(t *testing.T) {
	common := lifecycle.Common{DispatchID: "d1", ThreadID: "t1", Subagent: "chaos"}
	by := func(attempt int) lifecycle.Producer {
		return lifecycle.Producer{WorkerID: "chaos-w1", Attempt: attempt}
	}
	long := "workspace: " + strings.Repeat("x", 2000)
	cases := []struct {
		name    string
		end     lifecycle.Lifecycle // nil: none
		ends    []chaos.End
		anomaly string // "" when none
	}{
		{name: "a finished with its attempt's nonce", end: &lifecycle.Finished{Common: common, Producer: by(1), Output: json.RawMessage(`{"nonce":"n1","attempt":1}`)},
			ends: []chaos.End{{Kind: lifecycle.KindFinished, Count: 1}}},
		{name: "a failed", end: &lifecycle.Failed{Common: common, Producer: by(1), Reason: lifecycle.ReasonWorkerFailed, Detail: long},
			ends:    []chaos.End{{Kind: lifecycle.KindFailed, Reason: "worker-failed", Count: 1}},
			anomaly: `dispatch d1 (thread t1) failed worker-failed on worker "chaos-w1", attempt 1: workspace: xxx`},
		{name: "a cancelled", end: &lifecycle.Cancelled{Common: common, Producer: by(1), By: "someone", Reason: "stop"},
			ends:    []chaos.End{{Kind: lifecycle.KindCancelled, Reason: "stop", Count: 1}},
			anomaly: `dispatch d1 (thread t1) was cancelled by "someone" ("stop") on worker "chaos-w1", attempt 1`},
		{name: "a finished with a null output", end: &lifecycle.Finished{Common: common, Producer: by(1)},
			ends:    []chaos.End{{Kind: lifecycle.KindFinished, Count: 1}},
			anomaly: `dispatch d1 (thread t1) finished on worker "chaos-w1", attempt 1, with a null output`},
		{name: "a finished with another attempt's output", end: &lifecycle.Finished{Common: common, Producer: by(1), Output: json.RawMessage(`{"nonce":"n0","attempt":1}`)},
			ends:    []chaos.End{{Kind: lifecycle.KindFinished, Count: 1}},
			anomaly: `but attempt 1 wrote "n1"`},
		{name: "no end", anomaly: `dispatch d1 (thread t1) has no terminal event; its last: started by worker "chaos-w1", attempt 1`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := natstest.StartProvisioned(t, provision.Config{})
			js := srv.JetStream(t)
			side := t.TempDir()
			if err := os.WriteFile(filepath.Join(side, "d1.1"), []byte("n1"), 0o600); err != nil {
				t.Fatal(err)
			}
			events := []lifecycle.Lifecycle{&lifecycle.Started{Common: common, WorkerID: "chaos-w1", Attempt: 1}}
			if tc.end != nil {
				events = append(events, tc.end)
			}
			for _, e := range events {
				_, m, err := lifecycle.Message(lifecycle.Source("worker", "chaos-w1"), e)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := js.PublishMsg(t.Context(), m); err != nil {
					t.Fatal(err)
				}
			}
			rep := chaos.Audit(t.Context(), js, []string{"t1"}, side)
			if !slices.Equal(rep.Ends, tc.ends) {
				t.Errorf("ends %+v, want %+v", rep.Ends, tc.ends)
			}
			switch {
			case tc.anomaly == "" && len(rep.Anomalies) > 0:
				t.Errorf("anomalies: %q", rep.Anomalies)
			case tc.anomaly != "" && !slices.ContainsFunc(rep.Anomalies, func(a string) bool { return strings.Contains(a, tc.anomaly) }):
				t.Errorf("anomalies %q, want one with %q", rep.Anomalies, tc.anomaly)
			}
			for _, a := range rep.Anomalies {
				if len(a) > 600 {
					t.Errorf("anomaly of %d bytes, want its detail clipped: %.100s…", len(a), a)
				}
			}
			var out strings.Builder
			chaos.Print(&out, rep)
			for _, e := range tc.ends {
				if want := "ends: " + string(e.Kind); !strings.Contains(out.String(), want) || (e.Reason != "" && !strings.Contains(out.String(), "("+e.Reason+")")) {
					t.Errorf("the printed report does not count %+v:\n%s", e, out.String())
				}
			}
		})
	}
}
