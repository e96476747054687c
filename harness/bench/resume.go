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

	"github.com/agora-dispatch/agora/pkg/audit"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/sentinel"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/services/auditlog"
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
// dispatch's runtime started, through router, dispatcher and worker; with
// audit, the decision log's writer runs beside them, caught up before the
// warm-up, and each sample waits until the answer's entry is in the log
// too (the figure is still the runtime's start: the entry is derived off
// that path, docs/audit.md "Cost").
func resume(ctx context.Context, url string, js jetstream.JetStream, dir string, samples int, phase func(string), audit bool) (Row, error) {
	var auditCfg *auditlog.Config
	id := "bench-resume"
	if audit {
		auditCfg, id = &auditlog.Config{}, "bench-resume-audit"
	}
	def := subagent.Definition{Name: "bench-ask", Runtime: subagent.RuntimeExec, Command: []string{"in-process"}}
	rt := &askRuntime{started: map[string]chan time.Time{}}
	st, err := stack.Start(ctx, stack.Options{
		URL:        url,
		Subagents:  []subagent.Definition{def},
		Workers:    []worker.Config{{Concurrency: 4, WorkspaceRoot: dir + "/ws-" + id, ID: id, PullExpiry: 500 * time.Millisecond}},
		Dispatcher: &dispatcher.Config{ID: id, ReconcileLookback: reconcileLookback},
		Router:     &router.Config{ID: id},
		Audit:      auditCfg,
		InProcess:  map[string]worker.InProcess{subagent.RuntimeExec: rt},
	})
	if err != nil {
		return Row{}, err
	}
	defer st.Close()
	if err := projectionCaughtUp(ctx, js, 60*time.Second); err != nil {
		return Row{}, err
	}
	if audit {
		// The writer first reads what earlier scenarios asked.
		if err := auditCaughtUp(ctx, js, 5*time.Minute); err != nil {
			return Row{}, err
		}
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
		var t1 time.Time
		select {
		case t1 = <-started:
		case <-time.After(30 * time.Second):
			return 0, fmt.Errorf("resumed run of %s not started within 30s", disp.ThreadID)
		}
		if audit {
			// Not timed: the next sample starts with the log caught up.
			if err := auditCaughtUp(ctx, js, 30*time.Second); err != nil {
				return 0, err
			}
		}
		return t1.Sub(t0), nil
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
	name := "agora resume: answer submitted → resumed runtime started"
	if audit {
		name += ", decision log written"
	}
	return Row{Scenario: name, P50MS: pct(0.5), P99MS: pct(0.99), Serial: samples}, nil
}

// auditCaughtUp waits until the decision log's last entry has consumed
// every question event published so far.
func auditCaughtUp(ctx context.Context, js jetstream.JetStream, within time.Duration) error {
	qs, err := js.Stream(ctx, lifecycle.StreamQuestions)
	if err != nil {
		return err
	}
	want := qs.CachedInfo().State.LastSeq
	as, err := js.Stream(ctx, audit.Stream)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(within)
	for {
		m, err := as.GetLastMsgForSubject(ctx, audit.Subject)
		if err == nil {
			if e, err := audit.Parse(m.Data); err == nil && uint64(e.CursorQuestions) >= want {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the decision log did not reach question event %d within %s", want, within)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}
