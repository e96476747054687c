package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/sentinel"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/services/dispatcher"
	"github.com/agora-dispatch/agora/services/router"
	"github.com/agora-dispatch/agora/services/worker"
	"github.com/agora-dispatch/agora/stack"
)

// askRuntime asks on round 0 and, on a resumed round, reports the moment
// it started.
type askRuntime struct {
	mu      sync.Mutex
	started map[string]chan time.Time // by thread id
}

func (a *askRuntime) expect(thread string) chan time.Time {
	ch := make(chan time.Time, 1)
	a.mu.Lock()
	a.started[thread] = ch
	a.mu.Unlock()
	return ch
}

func (a *askRuntime) Run(_ context.Context, inv worker.Invocation) worker.Result {
	if inv.Request.Round == 0 {
		err := sentinel.Write(inv.Workspace, sentinel.Request{Question: "A or B?", Options: []string{"A", "B"}, Kind: sentinel.KindDecision,
			PartialState: json.RawMessage(`{"analysis":"done once"}`)})
		if err != nil {
			return worker.Result{ExitCode: -1, Err: err}
		}
		return worker.Result{}
	}
	now := time.Now()
	a.mu.Lock()
	ch := a.started[inv.Request.ThreadID]
	delete(a.started, inv.Request.ThreadID)
	a.mu.Unlock()
	if ch != nil {
		ch <- now
	}
	return worker.Result{}
}

// resume measures answer submitted (agora.api.answer) → the resumed
// dispatch's runtime started, through router, dispatcher and worker.
func resume(ctx context.Context, url string, js jetstream.JetStream, dir string, samples int, phase func(string)) (Row, error) {
	def := subagent.Definition{Name: "bench-ask", Runtime: subagent.RuntimeExec, Command: []string{"in-process"}}
	rt := &askRuntime{started: map[string]chan time.Time{}}
	st, err := stack.Start(ctx, stack.Options{
		URL:        url,
		Subagents:  []subagent.Definition{def},
		Workers:    []worker.Config{{Concurrency: 4, WorkspaceRoot: dir + "/ws-resume", ID: "bench-resume", PullExpiry: 500 * time.Millisecond}},
		Dispatcher: &dispatcher.Config{ID: "bench-resume", ReconcileLookback: reconcileLookback},
		Router:     &router.Config{ID: "bench-resume"},
		InProcess:  map[string]worker.InProcess{subagent.RuntimeExec: rt},
	})
	if err != nil {
		return Row{}, err
	}
	defer st.Close()
	if err := projectionCaughtUp(ctx, js, 60*time.Second); err != nil {
		return Row{}, err
	}
	cnc, c := st.Conn(), st.Client()
	asked := map[string]chan struct{}{}
	var mu sync.Mutex
	askedCh := func(qid string) chan struct{} {
		mu.Lock()
		defer mu.Unlock()
		ch, ok := asked[qid]
		if !ok {
			ch = make(chan struct{})
			asked[qid] = ch
		}
		return ch
	}
	sub, err := cnc.Subscribe("agora.questions.*.*.asked", func(m *nats.Msg) {
		if a, err := lifecycle.ParseQuestionSubject(m.Subject); err == nil {
			close(askedCh(a.QuestionID))
		}
	})
	if err != nil {
		return Row{}, err
	}
	defer sub.Unsubscribe()

	one := func() (time.Duration, error) {
		disp, err := c.Dispatch(ctx, lifecycle.Request{Subagent: def.Name, Input: json.RawMessage(`{}`)})
		if err != nil {
			return 0, err
		}
		qid := lifecycle.QuestionID(disp.DispatchID)
		select {
		case <-askedCh(qid):
		case <-time.After(30 * time.Second):
			return 0, fmt.Errorf("question %s not asked within 30s", qid)
		}
		started := rt.expect(disp.ThreadID)
		t0 := time.Now()
		if _, err := c.Answer(ctx, qid, lifecycle.Answer{Answer: "B", AnsweredBy: "bench"}); err != nil {
			return 0, err
		}
		select {
		case t1 := <-started:
			return t1.Sub(t0), nil
		case <-time.After(30 * time.Second):
			return 0, fmt.Errorf("resumed run of %s not started within 30s", disp.ThreadID)
		}
	}
	for range 10 {
		if _, err := one(); err != nil {
			return Row{}, fmt.Errorf("resume warm-up: %w", err)
		}
	}
	lat := make([]time.Duration, 0, samples)
	if phase != nil {
		phase(phaseSerial)
	}
	for range samples {
		l, err := one()
		if err != nil {
			return Row{}, fmt.Errorf("resume: %w", err)
		}
		lat = append(lat, l)
	}
	if phase != nil {
		phase(phaseThroughput) // the measured answers are done
	}
	slices.Sort(lat)
	pct := func(p float64) float64 { return percentileMS(lat, p) }
	return Row{Scenario: "agora resume: answer submitted → resumed runtime started", P50MS: pct(0.5), P99MS: pct(0.99), Serial: samples}, nil
}
