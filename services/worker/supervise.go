package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/agora-dispatch/agora/internal/sandbox/contain"
	"github.com/agora-dispatch/agora/internal/telemetry"
	"github.com/agora-dispatch/agora/pkg/consume"
	"github.com/agora-dispatch/agora/pkg/subagent"
)

// ended is how a supervised run ended: the runtime's result, why the run
// was stopped (nil when it ended by itself) and, for a cancel, who asked
// and why.
type ended struct {
	res                    Result
	cause                  error
	cancelBy, cancelReason string
}

// watch is what a run is watched by while its runtime goes on.
type watch struct {
	keepAlive *time.Ticker     // in-progress acks and the fence check
	deadline  *time.Timer      // the run's time limit
	workspace <-chan time.Time // the workspace's size, when watched
	progress  *time.Ticker     // progress lines into reports (progress.go)
	stops     []func()
}

// newWatch starts the run's tickers and timer; stop ends them.
func (s *Service) newWatch(j *job, timeout time.Duration) *watch {
	w := &watch{
		keepAlive: time.NewTicker(consume.KeepAliveEvery(s.ackWait)),
		deadline:  time.NewTimer(timeout),
		progress:  time.NewTicker(ProgressInterval),
	}
	w.stops = []func(){w.keepAlive.Stop, func() { w.deadline.Stop() }, w.progress.Stop}
	if j.box.WorkspaceFS() == contain.WorkspaceWatched {
		t := time.NewTicker(workspaceWatch)
		w.workspace, w.stops = t.C, append(w.stops, t.Stop)
	}
	return w
}

func (w *watch) stop() {
	for _, f := range w.stops {
		f()
	}
}

// supervise starts the runtime and watches it to its end: it keeps the
// work message in progress, stops the runtime when the dispatch moves on
// without this run, when the workspace passes its size limit, at the
// time limit and on a cancel, and turns progress lines into reports.
func (s *Service) supervise(ctx context.Context, j *job, def subagent.Definition, inv Invocation, timeout time.Duration, cancelCh <-chan *nats.Msg) ended {
	_, procSpan := telemetry.Tracer().Start(ctx, "agora.run.process", trace.WithAttributes(attribute.String("agora.runtime", string(def.Runtime))))
	runCtx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	resCh := make(chan Result, 1)
	run := s.runner(j, def, inv)
	go func() { resCh <- run(runCtx) }()
	j.log.Info("running", "runtime", def.Runtime, "timeout", timeout)

	w := s.newWatch(j, timeout)
	defer w.stop()
	prog := s.newProgressTail(j, inv.Workspace, j.fs.viewOr)
	var e ended
wait:
	for {
		select {
		case e.res = <-resCh:
			break wait
		case <-w.progress.C:
			prog.poll(progressReadPerPoll)
			prog.flush(false)
		case <-w.workspace:
			if s.overSize(j, inv.Workspace) {
				stop(errLimit)
				w.workspace = nil
			}
		case <-w.keepAlive.C:
			if s.movedOn(ctx, j) {
				stop(errFenced)
			}
		case <-w.deadline.C:
			j.log.Warn("timeout: stopping the runtime", "timeout", timeout)
			stop(errTimeout)
		case m := <-cancelCh:
			e.cancelBy, e.cancelReason = parseCancel(m.Data)
			j.log.Info("cancel received: stopping the runtime", "by", e.cancelBy)
			stop(errCancelled)
		}
	}
	prog.finish()
	procSpan.SetAttributes(attribute.Int("process.exit.code", e.res.ExitCode))
	procSpan.End()
	e.cause = stopCause(ctx, runCtx)
	return e
}

// runner is how the run's runtime is run: in process when the worker
// offers it so, otherwise as a command in the run's box.
func (s *Service) runner(j *job, def subagent.Definition, inv Invocation) func(context.Context) Result {
	if ip, ok := s.inProcess[def.Runtime]; ok {
		return func(ctx context.Context) Result {
			res := ip.Run(ctx, inv)
			res.exceeded = j.box.Exceeded(res.Signal)
			return res
		}
	}
	return func(ctx context.Context) Result { return runCommand(ctx, inv, inv.args) }
}

// overSize reports whether the watched workspace holds more than its
// limit, and notes the limit the run passed.
func (s *Service) overSize(j *job, ws string) bool {
	n, l := workspaceSize(ws), j.box.Limits().WorkspaceSize
	if n <= l {
		return false
	}
	j.over = fmt.Sprintf("workspace_size (%d bytes; the workspace held %d)", l, n)
	j.log.Warn("workspace over its size limit: stopping the runtime", "limit", l, "size", n)
	return true
}

// movedOn keeps the work message in progress and reports whether the
// dispatch moved on without this run: a newer attempt, or a terminal
// event from elsewhere, ends this run's claim on it.
func (s *Service) movedOn(ctx context.Context, j *job) bool {
	if err := j.msg.InProgress(); err != nil {
		j.log.Warn("in-progress ack failed", "err", err)
	}
	last, err := s.lastEvent(ctx, j.common)
	if err == nil && last.seq != j.fence && (last.newer(j.attempt) || last.kind.Terminal()) {
		j.log.Warn("the dispatch moved on without this run: stopping the runtime", "last_kind", last.kind, "last_attempt", last.attempt)
		return true
	}
	return false
}

// stopCause is why the run was stopped: the cause given to runCtx, or,
// when the worker's own ctx ended, that ctx's cause (ErrShutdown when it
// gave none). It is nil for a run that ended by itself.
func stopCause(ctx, runCtx context.Context) error {
	cause := context.Cause(runCtx)
	if errors.Is(cause, context.Canceled) && ctx.Err() == nil {
		cause = nil // the deferred stop has not run yet; nothing cancelled the run
	}
	if ctx.Err() != nil {
		cause = context.Cause(ctx)
		if cause == nil || errors.Is(cause, context.Canceled) {
			cause = ErrShutdown
		}
	}
	return cause
}
