package client_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/services/worker"
)

// startWorker runs a real worker on the env's server.
func (e *env) startWorker(t *testing.T, concurrency int) {
	t.Helper()
	w, err := worker.New(worker.Config{WorkspaceRoot: t.TempDir(), Concurrency: concurrency, PullExpiry: 500 * time.Millisecond, ShutdownTimeout: 5 * time.Second},
		worker.Deps{Conn: e.srv.Conn(t), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Go(t, "worker", w.Run)
}

// TestRoundTripWithRealWorker runs the shell example sub-agent through the
// dispatcher and a real worker: round 0 asks, round 1 finishes with the
// answer. Round 1 is dispatched by the test the way the router will send
// it (services/router does not exist yet); every event comes from the
// dispatcher and the worker.
func TestRoundTripWithRealWorker(t *testing.T) {
	e := newEnv(t)
	script, err := filepath.Abs("../../examples/shell/agent.sh")
	if err != nil {
		t.Fatal(err)
	}
	e.define(t, subagent.Definition{Name: "deployer", Runtime: subagent.RuntimeExec, Command: []string{"sh", script}})
	e.startWorker(t, 2)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()

	d := e.dispatch(ctx, t, lifecycle.Request{Subagent: "deployer", Input: json.RawMessage(`{"task":"demo"}`)})
	it, err := d.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ni, ok := it.Data.(*lifecycle.NeedsInput)
	if !ok || len(ni.Options) != 2 || ni.PartialState == nil {
		t.Fatalf("round 0 ended %s: %+v", it.Kind(), it.Data)
	}

	in, _ := json.Marshal(map[string]any{"task": "demo", "answer": ni.Options[0], "partial_state": ni.PartialState})
	d1 := e.dispatch(ctx, t, lifecycle.Request{Subagent: "deployer", Input: in, ThreadID: d.ThreadID, ParentID: d.DispatchID, Round: 1, QuestionID: ni.QuestionID})
	var kinds []string
	final, err := e.c.Follow(ctx, d.ThreadID, func(it client.Item) {
		kinds = append(kinds, string(it.Kind()))
	})
	if err != nil {
		t.Fatal(err)
	}
	fin, ok := final.Data.(*lifecycle.Finished)
	var out struct {
		DeployedTo string `json:"deployed_to"`
	}
	if !ok || fin.DispatchID != d1.DispatchID || json.Unmarshal(fin.Output, &out) != nil || out.DeployedTo != "staging" {
		t.Fatalf("thread ended %s: %+v", final.Kind(), final.Data)
	}
	if got := strings.Join(kinds, ","); got != "accepted,started,needs_input,accepted,started,finished" {
		t.Errorf("thread events: %s", got)
	}
	// The finished thread's typed result, from the handle and the client.
	var res struct {
		DeployedTo string `json:"deployed_to"`
	}
	if err := d.Result(ctx, &res); err != nil || res.DeployedTo != "staging" {
		t.Errorf("Result = %+v, %v", res, err)
	}
	if d.DispatchID != d.DispatchID || d1.DispatchID != fin.DispatchID {
		t.Errorf("DispatchID %q, ID %q", d.DispatchID, d.DispatchID)
	}
	var items []string
	if _, err := e.c.Follow(ctx, d.ThreadID, func(it client.Item) { items = append(items, string(it.Kind())) }); err != nil || strings.Join(items, ",") != strings.Join(kinds, ",") {
		t.Errorf("Follow items = %v, %v", items, err)
	}

	// The projection caught up with the worker's events.
	var th *client.Thread
	testkit.Eventually(t, 10*time.Second, "the thread's status to read finished", func() bool {
		th, err = e.c.Thread(ctx, d.ThreadID)
		return err == nil && th.Status == lifecycle.KindFinished
	})
	r0, r1 := th.Rounds[0].Record, th.Rounds[1].Record
	if r0.Status != lifecycle.KindNeedsInput || r0.Result.QuestionID != ni.QuestionID || r0.Attempt != 1 || r0.WorkerID == "" {
		t.Errorf("round 0 record: %+v %+v", r0, r0.Result)
	}
	if r1.Status != lifecycle.KindFinished || r1.Result == nil || !strings.Contains(string(r1.Result.Output), "staging") || r1.StartedAt == nil || r1.EndedAt == nil {
		t.Errorf("round 1 record: %+v", r1)
	}
}

// TestCancelStopsARunningWorker cancels a dispatch a real worker is
// running: the worker kills the process and its slot is free long before
// the sub-agent would have ended.
func TestCancelStopsARunningWorker(t *testing.T) {
	e := newEnv(t)
	e.define(t,
		subagent.Definition{Name: "sleeper", Runtime: subagent.RuntimeExec, Command: []string{"sleep", "60"}},
		subagent.Definition{Name: "quick", Runtime: subagent.RuntimeExec, Command: []string{"true"}},
	)
	e.startWorker(t, 1)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	d := e.dispatch(ctx, t, lifecycle.Request{Subagent: "sleeper"})
	for it, err := range e.c.Watch(ctx, client.Filter{DispatchID: d.DispatchID, Kind: lifecycle.KindStarted, FromStart: true}) {
		if err != nil {
			t.Fatal(err)
		}
		_ = it
		break
	}
	rec, err := e.c.Cancel(ctx, d.DispatchID, client.CancelBy("ops", "taking too long"))
	if err != nil || rec.Status != lifecycle.KindCancelled {
		t.Fatalf("cancel: %+v %v", rec, err)
	}
	it, err := d.Wait(ctx)
	if err != nil || it.Data.(*lifecycle.Cancelled).By != "ops" {
		t.Fatalf("wait: %+v %v", it.Data, err)
	}
	start := time.Now()
	q := e.dispatch(ctx, t, lifecycle.Request{Subagent: "quick"})
	if it, err := q.Wait(ctx); err != nil || it.Kind() != lifecycle.KindFinished {
		t.Fatalf("the next dispatch: %v %v", it.Kind(), err)
	}
	if waited := time.Since(start); waited > 20*time.Second {
		t.Errorf("the worker's only slot stayed busy for %s after the cancel", waited)
	}
}

// Watch with Progress yields a run's progress reports among its lifecycle
// events.
func TestWatchYieldsProgress(t *testing.T) {
	e := newEnv(t)
	e.define(t, subagent.Definition{Name: "reporter", Runtime: subagent.RuntimeExec,
		Command: []string{"sh", "-c", `echo '{"message":"half way","percent":50}' >> "$AGORA_PROGRESS_FILE"; sleep 0.6`}})
	e.startWorker(t, 1)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	d := e.dispatch(ctx, t, lifecycle.Request{Subagent: "reporter"})
	var kinds []string
	var progress []string
	for it, err := range e.c.Watch(ctx, client.Filter{ThreadID: d.ThreadID, FromStart: true, Progress: true}) {
		if err != nil {
			t.Fatal(err)
		}
		if it.Progress != nil {
			progress = append(progress, client.ProgressLine(it.Progress))
			continue
		}
		kinds = append(kinds, string(it.Kind()))
		if it.Kind() == lifecycle.KindFinished {
			break
		}
	}
	if strings.Join(kinds, ",") != "accepted,started,finished" || len(progress) == 0 || progress[0] != "50% half way" {
		t.Errorf("kinds %v, progress %v", kinds, progress)
	}
}
