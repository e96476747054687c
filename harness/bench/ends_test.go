package bench_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/harness/bench"
	"github.com/agora-dispatch/agora/pkg/sentinel"
	"github.com/agora-dispatch/agora/services/worker"
)

// oddRuntime asks on round 0, as the scenarios' runtime does, except on
// the third dispatch it runs, which it fails (Err) or holds until block
// passes (a dispatch that never ends in time). It keeps that dispatch's id.
type oddRuntime struct {
	block time.Duration // 0: fail
	mu    sync.Mutex
	runs  int
	odd   string
}

func (r *oddRuntime) Run(ctx context.Context, inv worker.Invocation) worker.Result {
	r.mu.Lock()
	r.runs++
	odd := r.runs == 3
	if odd {
		r.odd = inv.Request.DispatchID
	}
	r.mu.Unlock()
	switch {
	case odd && r.block == 0:
		return worker.Result{ExitCode: -1, Err: errors.New("the runtime broke on purpose")}
	case odd:
		select {
		case <-ctx.Done():
		case <-time.After(r.block):
		}
		return worker.Result{}
	}
	if err := sentinel.Write(inv.Workspace, sentinel.Request{Question: "A or B? (thread " + inv.Request.ThreadID + ")", Options: []string{"A", "B"}}); err != nil {
		return worker.Result{ExitCode: -1, Err: err}
	}
	return worker.Result{}
}

func (r *oddRuntime) dispatch() string { r.mu.Lock(); defer r.mu.Unlock(); return r.odd }

// A scale scenario (pending, the smallest that asks) whose dispatch fails
// returns at once with an error naming the dispatch, the reason, the
// detail and the attempt, instead of waiting for a question that never
// comes; one whose dispatch never ends returns at its deadline, naming
// the dispatch that did not ask.
func TestPendingReportsALostDispatch(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole of Agora twice")
	}
	const deadline = 8 * time.Second
	cases := []struct {
		name  string
		block time.Duration
		want  []string // besides the dispatch id
	}{
		{name: "a dispatch fails", want: []string{"1 dispatches ended failed or cancelled", "failed worker-failed", "attempt 1", "the runtime broke on purpose"}},
		{name: "a dispatch never ends", block: deadline + 2*time.Second, want: []string{"not done within its deadline of 8s", "1 dispatched and not asked"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rt := &oddRuntime{block: tc.block}
			done := make(chan error, 1)
			go func() {
				_, err := bench.PendingWith(t.Context(), bench.PendingConfig{Questions: 6, InFlight: 2, Slots: 2, Samples: 1, Deadline: deadline}, rt, t.Output())
				done <- err
			}()
			var err error
			select {
			case err = <-done:
			case <-time.After(2 * time.Minute):
				t.Fatal("the scenario did not return within 2 minutes")
			}
			if err == nil {
				t.Fatal("the scenario returned no error")
			}
			t.Logf("the scenario's error: %v", err)
			for _, w := range append(tc.want, rt.dispatch()) {
				if rt.dispatch() == "" || !strings.Contains(err.Error(), w) {
					t.Errorf("error %q, want it to name %q (the odd dispatch %q)", err, w, rt.dispatch())
				}
			}
		})
	}
}
