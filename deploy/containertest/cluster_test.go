package containertest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	agora "github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
)

// demo runs the agora binary's demo-agent verb inside the worker image: it
// asks which function to rename on round 0 and renames the answer on
// round 1.
var demo = subagent.Definition{
	Name: "demo", Runtime: subagent.RuntimeExec, Command: []string{"/agora", "demo-agent"},
	Timeout: "2m", MaxRounds: 5,
}

// sleeper runs testagent, which sleeps and then finishes.
func sleeper(name string, d time.Duration) subagent.Definition {
	return subagent.Definition{
		Name: name, Runtime: subagent.RuntimeExec, Command: []string{"/testagent", "sleep", d.String()},
		Timeout: "2m",
	}
}

// workerIDs are the ids the worker containers put in their started events.
var workerIDs = []string{"worker-1", "worker-2"}

// demoResult checks the demo's round-1 output: it renamed the answer and
// reused its round-0 analysis (the partial state crossed the question).
func demoResult(t *testing.T, end agora.Item, d *agora.Dispatch, answer string) {
	t.Helper()
	fin, ok := end.Data.(*lifecycle.Finished)
	if !ok {
		t.Fatalf("thread %s ended %s %+v, want finished", d.ThreadID, end.Kind(), end.Data)
	}
	if fin.Round != 1 || fin.ParentID != d.DispatchID || fin.ThreadID != d.ThreadID {
		t.Errorf("finished round %d parent %q thread %q, want round 1 parent %q thread %q", fin.Round, fin.ParentID, fin.ThreadID, d.DispatchID, d.ThreadID)
	}
	var out struct {
		Renamed        string `json:"renamed"`
		ReusedAnalysis bool   `json:"reused_analysis"`
	}
	if err := json.Unmarshal(fin.Output, &out); err != nil || out.Renamed != answer || !out.ReusedAnalysis {
		t.Errorf("round 1 output %s (%v), want renamed %q with the round-0 analysis", fin.Output, err, answer)
	}
}

// TestRoundTrip: a client on the host dispatches the demo; a worker
// container runs it and it asks; the router container records the
// question; the client answers through the router; the router re-dispatches
// and a worker container finishes the thread with the answer — every hop
// across containers and the 3-node cluster, each service as its own NATS
// user.
func TestRoundTrip(t *testing.T) {
	e := newEnv(t)
	e.register(demo)
	c := e.client()
	ctx := t.Context()

	start := time.Now()
	d := retry(ctx, t, "dispatch", time.Minute, func(ctx context.Context) (*agora.Dispatch, error) {
		return c.Dispatch(ctx, lifecycle.Request{DispatchID: "rt-1", Subagent: "demo", Input: json.RawMessage(`{"task":"rename the config loader to loadConfig"}`)})
	})
	q := question(ctx, t, c, d.ThreadID)
	if q.Route != "human" || q.DispatchID != d.DispatchID || !slices.Equal(q.Options, []string{"parseConfig", "readConfig"}) {
		t.Fatalf("question %+v, want route human for %s with the demo's options", q, d.DispatchID)
	}
	retry(ctx, t, "answer", time.Minute, func(ctx context.Context) (*agora.AnswerReply, error) {
		return c.Answer(ctx, q.QuestionID, lifecycle.Answer{Answer: "readConfig", AnsweredBy: "container-test"})
	})
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var started []*lifecycle.Started
	end, err := c.Follow(wctx, d.ThreadID, func(it agora.Item) {
		if s, ok := it.Data.(*lifecycle.Started); ok {
			started = append(started, s)
		}
	})
	if err != nil {
		t.Fatalf("wait thread: %v", err)
	}
	demoResult(t, end, d, "readConfig")
	t.Logf("dispatch → needs_input → answer → finished in %s", time.Since(start).Round(time.Millisecond))
	if len(started) != 2 {
		t.Errorf("%d started events, want 2 (round 0 and round 1)", len(started))
	}
	for _, s := range started {
		if !slices.Contains(workerIDs, s.WorkerID) {
			t.Errorf("round %d started by %q, want a worker container", s.Round, s.WorkerID)
		}
		// Both rounds ran sandboxed in the FROM scratch worker image, as
		// its non-root user.
		if s.Sandbox == nil || s.Sandbox.Mode != "standard" || !s.Sandbox.Filesystem {
			t.Errorf("round %d sandbox %+v, want the standard mode with Landlock filesystem rules", s.Round, s.Sandbox)
		} else {
			t.Logf("round %d sandbox: %+v", s.Round, *s.Sandbox)
		}
	}
	e.assertOneEnd(d.ThreadID, 1)
	// The dispatcher's status projection follows the events.
	retry(ctx, t, "status", 30*time.Second, func(ctx context.Context) (*agora.Record, error) {
		r, err := c.Status(ctx, end.Data.(*lifecycle.Finished).DispatchID)
		if err == nil && r.Status != lifecycle.KindFinished {
			err = fmt.Errorf("status %s", r.Status)
		}
		return r, err
	})
	e.waitWorkEmpty()
}

// TestWorkerKilledMidDispatch: the worker container running a dispatch
// gets SIGKILL; the work message is redelivered after the workers
// consumer's AckWait (30 s as provisioned) and the other worker container
// completes it, as attempt 2; the thread has exactly one terminal event.
func TestWorkerKilledMidDispatch(t *testing.T) {
	e := newEnv(t)
	e.register(sleeper("sleeper", 5*time.Second))
	c := e.client()
	ctx := t.Context()

	d := retry(ctx, t, "dispatch", time.Minute, func(ctx context.Context) (*agora.Dispatch, error) {
		return c.Dispatch(ctx, lifecycle.Request{DispatchID: "kill-1", Subagent: "sleeper"})
	})
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	var started []*lifecycle.Started
	victim := ""
	var killErr error
	end, err := c.Follow(wctx, d.ThreadID, func(it agora.Item) {
		s, ok := it.Data.(*lifecycle.Started)
		if !ok {
			return
		}
		started = append(started, s)
		if victim == "" {
			victim = s.WorkerID
			w, ok := e.svc[victim]
			if !ok {
				killErr = fmt.Errorf("started by %q, not a worker container", victim)
				return
			}
			killErr = kill(ctx, w)
			t.Logf("SIGKILL %s while it runs %s (attempt %d)", victim, s.DispatchID, s.Attempt)
		}
	})
	if killErr != nil {
		t.Fatalf("kill: %v", killErr)
	}
	if err != nil {
		t.Fatalf("wait thread: %v", err)
	}
	if _, ok := end.Data.(*lifecycle.Finished); !ok {
		t.Fatalf("thread ended %s %+v, want finished", end.Kind(), end.Data)
	}
	if st, err := e.svc[victim].State(ctx); err != nil || st.Running || st.ExitCode != 137 {
		t.Errorf("victim %s state %+v (%v), want killed (exit 137)", victim, st, err)
	}
	var attempts []int
	var by []string
	for _, s := range started {
		attempts = append(attempts, s.Attempt)
		by = append(by, s.WorkerID)
	}
	if len(started) != 2 || attempts[0] != 1 || attempts[1] != 2 || by[1] == victim || !slices.Contains(workerIDs, by[1]) {
		t.Fatalf("started attempts %v by %v, want [1 2] by %s then the other worker", attempts, by, victim)
	}
	if fin := end.Data.(*lifecycle.Finished); !strings.Contains(string(fin.Output), `"slept":"5s"`) {
		t.Errorf("output %s", fin.Output)
	}
	e.assertOneEnd(d.ThreadID, 0)
	e.waitWorkEmpty()
}

// TestNATSNodeRestart: dispatches run while the node leading the work
// queue stream is stopped and started again (a new host port; the services
// reconnect to the other nodes and the node catches up). Dispatches are
// made before, during and after the outage with client-chosen ids
// (idempotent retries): none is lost, and every thread ends finished with
// exactly one terminal event.
func TestNATSNodeRestart(t *testing.T) {
	e := newEnv(t)
	e.register(sleeper("sleeper", 2*time.Second))
	c := e.client()
	ctx := t.Context()

	info, err := e.stream(lifecycle.StreamDispatch).Info(ctx)
	if err != nil || info.Cluster == nil {
		t.Fatalf("stream info: %+v %v", info, err)
	}
	idx := slices.Index(nodeNames[:], info.Cluster.Leader)
	if idx < 0 {
		t.Fatalf("leader %q is not a node", info.Cluster.Leader)
	}
	node := e.nodes[idx]

	var mu sync.Mutex
	var threads []string
	dispatch := func(prefix string, n int) {
		for i := range n {
			id := fmt.Sprintf("%s-%d", prefix, i)
			d := retry(ctx, t, "dispatch "+id, 2*time.Minute, func(ctx context.Context) (*agora.Dispatch, error) {
				return c.Dispatch(ctx, lifecycle.Request{DispatchID: id, Subagent: "sleeper"})
			})
			mu.Lock()
			threads = append(threads, d.ThreadID)
			mu.Unlock()
		}
	}
	dispatch("before", 10)
	// Mid-run: most of the first ten are still queued or running.
	lc, err := e.stream(lifecycle.StreamLifecycle).Info(ctx, jetstream.WithSubjectFilter(lifecycle.LifecycleFilter(lifecycle.KindFinished, "", "")))
	if err != nil {
		t.Fatal(err)
	}
	var finished uint64 // State.Subjects holds the filtered counts; State.Msgs does not
	for _, n := range lc.State.Subjects {
		finished += n
	}
	if finished >= 10 {
		t.Fatalf("all %d dispatches finished before the node stopped", finished)
	}
	t.Logf("stopping %s (leader of %s) with %d of 10 dispatches finished", nodeNames[idx], lifecycle.StreamDispatch, finished)
	stop := 10 * time.Second
	if err := node.Stop(ctx, &stop); err != nil {
		t.Fatalf("stop %s: %v", nodeNames[idx], err)
	}
	down := time.Now()
	dispatch("during", 10)
	time.Sleep(max(0, 5*time.Second-time.Since(down)))
	if err := node.Start(ctx); err != nil {
		t.Fatalf("start %s: %v", nodeNames[idx], err)
	}
	t.Logf("%s down for %s", nodeNames[idx], time.Since(down).Round(time.Millisecond))
	e.waitHealthy(idx)
	dispatch("after", 5)

	for _, th := range threads {
		wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		end, err := c.Follow(wctx, th, nil)
		cancel()
		if err != nil {
			t.Fatalf("thread %s: %v", th, err)
		}
		if _, ok := end.Data.(*lifecycle.Finished); !ok {
			t.Errorf("thread %s ended %s %+v, want finished", th, end.Kind(), end.Data)
		}
	}
	// Late duplicates would land after the finished events: give them a
	// moment, then count.
	e.waitWorkEmpty()
	time.Sleep(2 * time.Second)
	for _, th := range threads {
		e.assertOneEnd(th, 0)
	}
	if len(threads) != 25 {
		t.Errorf("%d threads, want 25", len(threads))
	}
	if info, err := e.stream(lifecycle.StreamDispatch).Info(ctx); err == nil {
		var rs []string
		for _, r := range info.Cluster.Replicas {
			rs = append(rs, fmt.Sprintf("%s current=%v", r.Name, r.Current))
		}
		t.Logf("%s leader now %s, replicas %v", lifecycle.StreamDispatch, info.Cluster.Leader, rs)
	}
}

// TestRouterRestartWithPendingQuestions: three threads wait on their
// question when the router container is stopped and started again; the
// answer given afterwards resumes every thread, which finishes with it.
func TestRouterRestartWithPendingQuestions(t *testing.T) {
	e := newEnv(t)
	e.register(demo)
	c := e.client()
	ctx := t.Context()

	// Three threads of the demo ask the same question: one question waits
	// for all three (ask once, docs/router.md, "Ask once"), and survives the
	// router's restart with every thread listed.
	var ds []*agora.Dispatch
	for i := range 3 {
		d := retry(ctx, t, "dispatch", time.Minute, func(ctx context.Context) (*agora.Dispatch, error) {
			return c.Dispatch(ctx, lifecycle.Request{DispatchID: fmt.Sprintf("rr-%d", i), Subagent: "demo"})
		})
		ds = append(ds, d)
	}
	q := groupQuestion(ctx, t, c, len(ds))

	router := e.svc["router"]
	stop := 10 * time.Second
	if err := router.Stop(ctx, &stop); err != nil {
		t.Fatalf("stop router: %v", err)
	}
	if err := router.Start(ctx); err != nil {
		t.Fatalf("start router: %v", err)
	}
	if after := groupQuestion(ctx, t, c, len(ds)); after.QuestionID != q.QuestionID {
		t.Fatalf("after the restart the question waiting is %s, want %s", after.QuestionID, q.QuestionID)
	}
	retry(ctx, t, "answer", time.Minute, func(ctx context.Context) (*agora.AnswerReply, error) {
		return c.Answer(ctx, q.QuestionID, lifecycle.Answer{Answer: "parseConfig", AnsweredBy: "container-test"})
	})
	for _, d := range ds {
		wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		end, err := c.Follow(wctx, d.ThreadID, nil)
		cancel()
		if err != nil {
			t.Fatalf("thread %s: %v", d.ThreadID, err)
		}
		demoResult(t, end, d, "parseConfig")
		e.assertOneEnd(d.ThreadID, 1)
	}
	e.waitWorkEmpty()
}

// groupQuestion waits until one question waits, for n threads, and
// returns it.
func groupQuestion(ctx context.Context, t *testing.T, c *agora.Client, n int) lifecycle.Question {
	t.Helper()
	return retry(ctx, t, "one question for the threads", 90*time.Second, func(ctx context.Context) (lifecycle.Question, error) {
		page, err := c.Waiting(ctx, agora.QuestionFilter{}, 0, "")
		if err != nil {
			return lifecycle.Question{}, err
		}
		if page.Count != 1 || len(page.Questions[0].WaitingThreads) != n {
			return lifecycle.Question{}, fmt.Errorf("%d waiting questions (want one, for %d threads)", page.Count, n)
		}
		return page.Questions[0], nil
	})
}
