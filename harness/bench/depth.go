package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/sentinel"
	"github.com/agora-dispatch/agora/services/worker"
)

// DepthConfig sizes `agora bench --scale depth`: one thread of Rounds
// rounds, every round but the last asking a question that is answered at
// once.
type DepthConfig struct {
	Rounds int // default 50
	// Deadline bounds the whole scenario; default a minute and 5 s a
	// round. A dispatch that ends failed or cancelled stops it sooner.
	Deadline time.Duration
}

// DepthPoint is what reading the thread costs when it has reached Round.
type DepthPoint struct {
	Round    int     `json:"round"`
	StatusMS float64 `json:"status_p50_ms"` // client.Status of the round's dispatch (GET /v1/dispatches/{id})
	ThreadMS float64 `json:"thread_p50_ms"` // client.Thread (GET /v1/threads/{id})
	Rounds   int     `json:"thread_rounds"` // rounds the thread view listed
}

// DepthReport is the scenario's result.
type DepthReport struct {
	Rounds int          `json:"rounds"`
	Points []DepthPoint `json:"points"`
}

// deepRuntime asks on every round but the last.
type deepRuntime struct{ last int }

func (r deepRuntime) Run(_ context.Context, inv worker.Invocation) worker.Result {
	if inv.Request.Round < r.last {
		if err := sentinel.Write(inv.Workspace, sentinel.Request{Question: "go on?", Options: []string{"yes"}, Kind: sentinel.KindDecision}); err != nil {
			return worker.Result{ExitCode: -1, Err: err}
		}
	}
	return worker.Result{}
}

// Depth runs the thread-depth scenario: as the thread grows, the status
// of its latest dispatch and the thread view are timed at the rounds of
// depthMarks. It returns an error naming a round that ended failed or
// cancelled.
func Depth(ctx context.Context, cfg DepthConfig, progress io.Writer) (DepthReport, error) {
	if cfg.Rounds <= 1 {
		cfg.Rounds = 50
	}
	if cfg.Deadline <= 0 {
		cfg.Deadline = time.Minute + time.Duration(cfg.Rounds)*5*time.Second
	}
	return bounded(ctx, "--scale depth", cfg.Deadline, func(ctx context.Context, l *lost) (DepthReport, error) {
		return depth(ctx, cfg, l, progress)
	})
}

func depth(ctx context.Context, cfg DepthConfig, l *lost, progress io.Writer) (DepthReport, error) {
	say := sayer(progress)
	st, err := startStack(ctx, stackConfig{Slots: 2, Runtime: deepRuntime{last: cfg.Rounds - 1}})
	if err != nil {
		return DepthReport{}, err
	}
	defer st.close()
	unwatch, err := l.watch(st.nc)
	if err != nil {
		return DepthReport{}, err
	}
	defer unwatch()
	paused := make(chan string, cfg.Rounds) // dispatch ids, as rounds pause
	ended := make(chan struct{})
	var endOnce sync.Once
	sub, err := st.nc.Subscribe(lifecycle.SubjectLifecycleAll, func(m *nats.Msg) {
		a, err := lifecycle.ParseLifecycleSubject(m.Subject)
		switch {
		case err != nil:
		case a.Kind == lifecycle.KindNeedsInput:
			paused <- a.DispatchID
		case a.Kind == lifecycle.KindFailed || a.Kind == lifecycle.KindCancelled:
			// Lost (l.watch), not the thread's end.
		case a.Kind.Terminal():
			endOnce.Do(func() { close(ended) })
		}
	})
	if err != nil {
		return DepthReport{}, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	say("one thread of %d rounds: each round asks, the bench answers", cfg.Rounds)
	d, err := st.Client().Dispatch(ctx, lifecycle.Request{Subagent: askingSubagent, MaxRounds: cfg.Rounds})
	if err != nil {
		return DepthReport{}, err
	}
	rep := DepthReport{Rounds: cfg.Rounds}
	for round := range cfg.Rounds - 1 {
		var id string
		select {
		case id = <-paused:
		case <-ended:
			return rep, fmt.Errorf("the thread ended at round %d", round)
		case <-ctx.Done():
			return rep, stopped(ctx, "round %d not paused on its question", round)
		case <-time.After(30 * time.Second):
			return rep, fmt.Errorf("round %d did not pause on its question within 30s", round)
		}
		if round == 0 || (round+1)%10 == 0 || round == cfg.Rounds-2 {
			p := DepthPoint{Round: round}
			if p.StatusMS, err = medianMS(9, func() error { _, err := st.Client().Status(ctx, id); return err }); err != nil {
				return rep, err
			}
			if p.ThreadMS, err = medianMS(9, func() error {
				th, err := st.Client().Thread(ctx, d.ThreadID)
				if err == nil {
					p.Rounds = len(th.Rounds)
				}
				return err
			}); err != nil {
				return rep, err
			}
			rep.Points = append(rep.Points, p)
			say("  round %d: status %.2f ms, thread %.2f ms (%d rounds listed)", round, p.StatusMS, p.ThreadMS, p.Rounds)
		}
		// The router records the question just after the event: an answer
		// before that is told to come again.
		for try := 0; ; try++ {
			_, err := st.Client().Answer(ctx, lifecycle.QuestionID(id), lifecycle.Answer{Answer: "yes", AnsweredBy: "bench"})
			if err == nil {
				break
			}
			if !errors.Is(err, client.ErrUnavailable) || try == 500 {
				return rep, fmt.Errorf("answer round %d: %w", round, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	select {
	case <-ended:
	case <-ctx.Done():
		return rep, stopped(ctx, "the last round not ended")
	case <-time.After(30 * time.Second):
		return rep, fmt.Errorf("the last round did not end within 30s")
	}
	return rep, nil
}

// PrintDepth writes the report as a table.
func PrintDepth(w io.Writer, r DepthReport) {
	fmt.Fprintf(w, "one thread of %d rounds\n\n", r.Rounds)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "paused at round\tstatus p50 ms\tthread view p50 ms\trounds listed\t")
	for _, p := range r.Points {
		fmt.Fprintf(tw, "%d\t%.2f\t%.2f\t%d\t\n", p.Round, p.StatusMS, p.ThreadMS, p.Rounds)
	}
	_ = tw.Flush()
}
