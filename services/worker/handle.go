package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/agora-dispatch/agora/internal/clip"
	"github.com/agora-dispatch/agora/internal/crashpoint"
	"github.com/agora-dispatch/agora/internal/logging"
	"github.com/agora-dispatch/agora/internal/sandbox/contain"
	"github.com/agora-dispatch/agora/internal/subagentmcp"
	"github.com/agora-dispatch/agora/internal/telemetry"
	"github.com/agora-dispatch/agora/pkg/consume"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/runtime"
	"github.com/agora-dispatch/agora/pkg/sentinel"
	"github.com/agora-dispatch/agora/pkg/subagent"
)

// job is one delivery being handled.
type job struct {
	msg         jetstream.Msg
	req         *lifecycle.Request
	common      lifecycle.Common
	trace       string
	traceExact  bool // trace is the run span's own (tracing on): events carry it as is
	attempt     int
	fence       uint64                 // sequence of the dispatch's last event as this run knows it (fence.go)
	started     jetstream.PubAckFuture // the async `started` publish, when it went out
	startedSent bool                   // `started` was attempted; the terminal event must follow it
	owned       bool                   // this run's `started` is stored: it owns the dispatch
	box         *contain.Box           // the run's sandbox (internal/sandbox/contain)
	fs          *runFS                 // the filesystem the run writes to (wsfs.go)
	over        string                 // the limit the workspace watch saw passed
	ws          string                 // the attempt's workspace, once made
	start       time.Time
	span        trace.Span // the run's span (trace.go), parent of the ack's
	log         *slog.Logger
}

// Handle runs one delivery of the work consumer to its end: skip it when it
// is already terminal, otherwise run it and publish exactly one terminal
// event, then acknowledge it. ctx bounds the run: when it ends the runtime
// is stopped and the dispatch ends cancelled. Handle decides in one place
// whether the message is acked, nak'ed with a delay or terminated.
func (s *Service) Handle(ctx context.Context, msg jetstream.Msg) Outcome {
	s.metrics.inFlight.Inc()
	defer s.metrics.inFlight.Dec()
	j := &job{msg: msg, start: time.Now(), attempt: 1}
	if md, err := msg.Metadata(); err == nil {
		j.attempt = int(md.NumDelivered)
	}
	ev, err := lifecycle.DecodeMsg(msg)
	var d lifecycle.Data
	if err == nil {
		d, err = lifecycle.Parse(ev)
	}
	req, ok := d.(*lifecycle.Request)
	if err != nil || !ok || lifecycle.ValidToken(req.DispatchID) != nil || lifecycle.ValidToken(req.Subagent) != nil {
		// Not a dispatch we can name: nothing to report it on. Drop it
		// for good rather than redeliver poison.
		s.log.Error("undecodable work message terminated", "subject", msg.Subject(), "err", err, "type", fmt.Sprintf("%T", d))
		_ = consume.Settle(ctx, msg, consume.Term("undecodable dispatch request"))
		s.metrics.outcome("", "undecodable")
		return Outcome{Kind: "", ExitCode: -1}
	}
	if req.ThreadID == "" {
		req.ThreadID = req.DispatchID
	}
	j.req = req
	j.trace = lifecycle.Traceparent(ev)
	j.common = lifecycle.Common{DispatchID: req.DispatchID, ThreadID: req.ThreadID, ParentID: req.ParentID, Round: req.Round, Subagent: req.Subagent}
	ctx, span := s.runSpan(ctx, j, ev.Time(), msg.Subject())
	j.log = s.log.With("dispatch_id", req.DispatchID, "thread_id", req.ThreadID, "round", req.Round, "attempt", j.attempt, "subagent", req.Subagent).
		With(logging.Trace(j.trace)...)
	crashpoint.Here(crashpoint.WorkerPickup) // docs/chaos.md
	o := s.handle(ctx, j)
	endRun(span, o)
	return o
}

func (s *Service) handle(ctx context.Context, j *job) Outcome {
	// Register for a cancel before looking for a terminal event, so a
	// cancel published after that look still reaches this run.
	cancelCh := s.cancels.register(j.req.DispatchID)
	defer s.cancels.unregister(j.req.DispatchID)

	last, err := s.lookup(ctx, j)
	if err != nil {
		return s.retryLater(j, err)
	}
	if o, settled := s.settled(j, last); settled {
		return o
	}
	j.fence = last.seq

	def, err := s.definition(ctx, j.req)
	if err != nil {
		return s.finish(ctx, j, &lifecycle.Failed{Common: j.common, Reason: lifecycle.ReasonWorkerFailed, Detail: err.Error()}, -1, "")
	}
	if f := s.belowFloor(j, def); f != nil {
		return s.finish(ctx, j, f, -1, "")
	}
	timeout := runTimeout(def, j.req)
	s.contain(j, def, timeout)
	// `started` goes out asynchronously while the workspace is prepared;
	// claim waits for its acknowledgement before the runtime starts.
	j.started, j.startedSent = s.publishAsync(j, s.startedData(j)), true

	pctx, pspan := telemetry.Tracer().Start(ctx, "agora.run.workspace")
	inv, err := s.prepare(pctx, j, def)
	telemetry.End(pspan, err)
	j.ws = inv.Workspace
	var te *transientError
	if errors.As(err, &te) {
		s.cleanup(ctx, j, inv, true)
		return s.retryLater(j, te.err)
	}
	if err != nil {
		o := s.finish(ctx, j, &lifecycle.Failed{Common: j.common, Reason: lifecycle.ReasonWorkerFailed, Detail: redact(err.Error(), secretValues(def))}, -1, "")
		s.cleanup(ctx, j, inv, true)
		return o
	}
	// The runtime starts only once this attempt owns the dispatch.
	if o, ok := s.claim(ctx, j); !ok {
		s.cleanup(ctx, j, inv, true)
		return o
	}
	e := s.supervise(ctx, j, def, inv, timeout, cancelCh)
	o := s.resolve(ctx, j, def, inv.Workspace, e.res, e.cause, e.cancelBy, e.cancelReason)
	// A run whose runtime reported an error (such as a launcher that gave
	// no report) may have left a process behind: its workspace is
	// removed, never parked for another run.
	s.cleanup(ctx, j, inv, e.res.Err == nil)
	return o
}

// lookup finds the event this run's `started` is fenced on: named by the
// work message of a first delivery, otherwise read from the chain — and
// waited for when the work message says an accepted event was sent
// before it (docs/worker.md#fencing).
func (s *Service) lookup(ctx context.Context, j *job) (lastEvent, error) {
	lctx, lspan := telemetry.Tracer().Start(ctx, "agora.run.lookup")
	last, known := acceptedFence(j)
	var err error
	if known {
		lspan.SetAttributes(attribute.String("agora.fence.from", "work_message"))
		s.metrics.fences.WithLabelValues("work_message").Inc()
	} else {
		lspan.SetAttributes(attribute.String("agora.fence.from", "read"))
		s.metrics.fences.WithLabelValues("read").Inc()
		last, err = s.lastEvent(context.WithoutCancel(lctx), j.common)
		if err == nil && last.seq == 0 && j.msg.Headers().Get(lifecycle.AcceptedHeader) != "" {
			last, err = s.awaitAccepted(context.WithoutCancel(lctx), j)
		}
	}
	telemetry.End(lspan, err)
	return last, err
}

// contain gives the run its sandbox and the filesystem it writes to.
func (s *Service) contain(j *job, def subagent.Definition, timeout time.Duration) {
	j.box = s.host.Box(def, timeout, j.log) // its egress proxy's lines name the run
	j.fs = &runFS{}
	if j.box.Off() {
		j.log.Warn("sandbox off: the sub-agent runs with the worker's own access to files and network", "subagent", def.Name)
	}
}

// cleanup releases what the run held: its workspace is kept (when asked
// to), parked for another run when reusable, or removed; then its
// filesystem and its box are closed.
func (s *Service) cleanup(ctx context.Context, j *job, inv Invocation, reusable bool) {
	_, cspan := telemetry.Tracer().Start(ctx, "agora.run.cleanup")
	defer cspan.End()
	ws := inv.Workspace
	j.fs.unmount()
	switch {
	case ws == "" || s.cfg.KeepWorkspaces:
		if inv.hold != nil {
			inv.hold.Close()
		}
	case reusable && inv.hold != nil:
		s.spares.park(s.cfg.WorkspaceRoot, ws, inv.hold) // or removes it
	default:
		if err := os.RemoveAll(ws); err != nil {
			j.log.Warn("remove workspace", "err", err)
		}
		if inv.hold != nil {
			inv.hold.Close()
		}
	}
	j.fs.close()
	j.box.Close()
}

// resolve turns a finished run into its one terminal event (docs/wire.md,
// "The sentinel file").
func (s *Service) resolve(ctx context.Context, j *job, def subagent.Definition, ws string, res Result, cause error, cancelBy, cancelReason string) Outcome {
	if st, ok := j.box.EgressStats(); ok {
		s.metrics.egressOf(def.Name, st) // the run's proxy serves nothing more
	}
	dur := time.Since(j.start).Milliseconds()
	exit := &res.ExitCode
	if res.ExitCode < 0 {
		exit = nil
	}
	// Redact both tails whole, before stderrNote keeps only the end of
	// stderr: a secret cut by that truncation could no longer be
	// recognised. The same tails become finished's stdout_tail and
	// stderr_tail (docs/worker.md, "What a run leaves").
	secrets := secretValues(def)
	res.Stdout, res.Stderr = []byte(redactTail(res.Stdout, secrets)), []byte(redactTail(res.Stderr, secrets))
	failed := func(r lifecycle.Reason, detail string) Outcome {
		detail = clip.String(redact(detail, secretValues(def)), 1024)
		return s.finish(ctx, j, &lifecycle.Failed{Common: j.common, Reason: r, Detail: detail, ExitCode: exit, DurationMS: dur}, res.ExitCode, "")
	}
	if errors.Is(cause, errFenced) {
		return s.settle(ctx, j)
	}
	if !errors.Is(cause, errCancelled) && !errors.Is(cause, ErrShutdown) {
		// A run that went over a sandbox limit fails, naming the limit,
		// whatever it wrote.
		if lim := j.passed(res); lim != "" {
			return failed(lifecycle.ReasonLimitExceeded, "the run passed its sandbox limit "+lim+stderrNote(res.Stderr))
		}
	}
	if errors.Is(cause, errCancelled) {
		if cancelBy == "" {
			cancelBy = "api"
		}
		return s.finish(ctx, j, &lifecycle.Cancelled{Common: j.common, By: cancelBy, Reason: cancelReason}, res.ExitCode, "")
	}
	// The run's results, read through the descriptor of what it wrote to
	// (wsfs.go, viewOr) — once the path is known to still lead there:
	// a workspace lost while the run lived is never read as its result.
	if lost := j.fs.lost(ws); lost != "" {
		j.ws = ""
		return failed(lifecycle.ReasonWorkspaceLost, lost)
	}
	rws := j.fs.viewOr(ws)
	j.ws = rws
	_, sspan := telemetry.Tracer().Start(ctx, "agora.run.sentinel")
	rsl, err := sentinel.Resolve(rws)
	sspan.SetAttributes(attribute.String("agora.sentinel", rsl.Status.String()))
	telemetry.End(sspan, err)
	if err != nil {
		return failed(lifecycle.ReasonWorkspaceLost, "the sentinel could not be read: "+err.Error())
	}
	switch rsl.Status {
	case sentinel.Valid:
		return s.needsInput(ctx, j, &rsl.Request, res.ExitCode, dur)
	case sentinel.Malformed, sentinel.Oversized:
		return failed(lifecycle.ReasonWorkerFailed, rsl.Err.Error())
	}
	return s.exited(ctx, j, rws, res, cause, dur, failed)
}

// needsInput ends a run that wrote a valid sentinel: needs_input with its
// question, the partial state inline or, when larger than
// lifecycle.MaxInlineState, stored in the object store by reference.
func (s *Service) needsInput(ctx context.Context, j *job, req *sentinel.Request, exitCode int, dur int64) Outcome {
	ni := &lifecycle.NeedsInput{
		Common: j.common, QuestionID: lifecycle.QuestionID(j.req.DispatchID),
		Question: req.Question, Options: req.Options, Context: req.Context,
		Kind: lifecycle.QuestionKind(req.Kind), DedupeKey: req.DedupeKey, Reuse: req.Reuse,
		DurationMS: dur, ExitCode: exitCode,
	}
	if len(req.PartialState) > lifecycle.MaxInlineState {
		if _, err := s.state.PutBytes(context.WithoutCancel(ctx), j.req.DispatchID, req.PartialState); err != nil {
			return s.retryLater(j, fmt.Errorf("store partial state: %w", err))
		}
		ni.PartialStateRef = j.req.DispatchID
	} else {
		ni.PartialState = req.PartialState
	}
	return s.finish(ctx, j, ni, exitCode, "")
}

// exited ends a run that wrote no sentinel: cancelled at the worker's
// shutdown, failed for a runtime error, the time limit or a non-zero
// exit, or finished with its output (read from rws) when it exited 0.
func (s *Service) exited(ctx context.Context, j *job, rws string, res Result, cause error, dur int64, failed func(lifecycle.Reason, string) Outcome) Outcome {
	switch {
	case errors.Is(cause, ErrShutdown):
		return s.finish(ctx, j, &lifecycle.Cancelled{Common: j.common, By: "worker:" + s.cfg.ID, Reason: "worker shutdown timeout passed"}, res.ExitCode, "")
	case res.Err != nil:
		return failed(lifecycle.ReasonWorkerFailed, res.Err.Error()+j.box.FailureNote(res.Err.Error())+j.box.EgressNote(res.Err.Error()))
	case errors.Is(cause, errTimeout):
		return failed(lifecycle.ReasonTimeout, "runtime passed its time limit and wrote no sentinel"+stderrNote(res.Stderr)+j.box.EgressNote(string(res.Stderr)))
	case res.ExitCode == 0:
		out, why, err := readOutput(rws)
		if err != nil {
			return failed(lifecycle.ReasonWorkspaceLost, "output.json could not be read: "+err.Error())
		}
		if why != "" {
			j.log.Warn("output not carried", "why", why)
		}
		return s.finish(ctx, j, &lifecycle.Finished{Common: j.common, ExitCode: 0, DurationMS: dur, Output: out, OutputDropped: why,
			StdoutTail: string(res.Stdout), StderrTail: string(res.Stderr)}, 0, "")
	default:
		return failed(lifecycle.ReasonProviderFailed, fmt.Sprintf("runtime exited %d and wrote no sentinel%s%s%s", res.ExitCode, stderrNote(res.Stderr),
			j.box.FailureNote(string(res.Stderr)), j.box.EgressNote(string(res.Stderr))))
	}
}

// passed names the limit the run went over, if any: from the workspace
// watch, the workspace's own filesystem full, or what the run's box saw
// (the signal that ended the runtime, the cgroups' counters).
func (j *job) passed(res Result) string {
	if j.over != "" {
		return j.over
	}
	if j.fs.full() {
		return fmt.Sprintf("workspace_size (%d bytes: the workspace's filesystem is full)", j.box.Limits().WorkspaceSize)
	}
	return res.exceeded
}

func stderrNote(b []byte) string {
	s := strings.TrimSpace(validUTF8(b))
	if s == "" {
		return ""
	}
	if len(s) > 700 {
		s = "…" + s[len(s)-700:]
	}
	return "; stderr: " + s
}

// finish publishes the terminal event, acks the message and reports the
// outcome. A terminal event that already exists (PubAck.Duplicate) is not
// an error: its first version stands.
func (s *Service) finish(ctx context.Context, j *job, d lifecycle.Lifecycle, exitCode int, _ string) Outcome {
	if j.startedSent {
		if o, ok := s.claim(ctx, j); !ok {
			return o
		}
	}
	if p, ok := d.(interface{ SetProducer(string, int) }); ok {
		p.SetProducer(s.cfg.ID, j.attempt)
	}
	if outs := lifecycle.RunOutputs(d); outs != nil && hasArtifacts(j.ws) {
		// A run another attempt took over uploads nothing: its names
		// would replace the newer attempt's files.
		if last, err := s.lastEvent(ctx, j.common); err == nil && last.seq != j.fence && (last.newer(j.attempt) || last.kind.Terminal()) {
			return s.settleWith(j, last)
		}
		o, err := s.heartbeat(j, func() (lifecycle.Outputs, error) { return s.uploadArtifacts(ctx, j, j.ws) })
		if err != nil {
			return s.retryLater(j, err)
		}
		*outs = o
	}
	// The event must fit the server's max payload: shrunk, or replaced
	// by a failed event that says why (fit.go).
	d, m, err := s.fit(ctx, j, d)
	if err != nil {
		return s.retryLater(j, err)
	}
	pctx, pspan := telemetry.Tracer().Start(ctx, "agora.run.publish", trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attribute.String("agora.kind", string(d.LifecycleKind()))))
	var stored bool
	var last lastEvent
	if m != nil {
		stored, last, err = s.publishMsgFenced(pctx, j, m) // as fit measured it
	} else {
		stored, last, err = s.publishFenced(pctx, j, d)
	}
	// An end before the run claimed the dispatch (no definition, below
	// the floor) was fenced on the event this run knew, perhaps from its
	// work message: when the chain moved on to an event that neither ends
	// nor takes over the dispatch, it follows that event, as claim does.
	for range 8 {
		if err != nil || stored || j.startedSent || last.kind.Terminal() || last.newer(j.attempt) {
			break
		}
		j.fence = last.seq
		stored, last, err = s.publishFenced(pctx, j, d)
	}
	telemetry.End(pspan, err)
	if err != nil {
		return s.retryLater(j, err)
	}
	if !stored && !last.ownedBy(s.cfg.ID, j.attempt, lifecycle.Kind.Terminal) {
		// Not ours to end: only what the stream accepted is reported.
		return s.settleWith(j, last)
	}
	s.ack(j)
	out := Outcome{DispatchID: j.req.DispatchID, Kind: d.LifecycleKind(), ExitCode: exitCode}
	attrs := []any{"kind", out.Kind, "duration_ms", time.Since(j.start).Milliseconds()}
	if f, ok := d.(*lifecycle.Failed); ok {
		out.Reason = f.Reason
		attrs = append(attrs, "reason", f.Reason, "detail", f.Detail)
	}
	j.log.Info("dispatch ended", attrs...)
	s.metrics.outcome(out.Kind, out.Reason)
	s.metrics.duration.WithLabelValues(string(out.Kind)).Observe(time.Since(j.start).Seconds())
	return out
}

// publishAsync sends a fenced event without waiting for its
// acknowledgement. A failure here is caught by claim, which republishes.
func (s *Service) publishAsync(j *job, d lifecycle.Data) jetstream.PubAckFuture {
	m, err := s.fencedMsg(j, d)
	if err != nil {
		return nil
	}
	f, err := s.js.PublishMsgAsync(m)
	if err != nil {
		j.log.Warn("async publish failed; will retry", "err", err)
		return nil
	}
	return f
}

func (s *Service) ack(j *job) {
	span := trace.SpanFromContext(context.Background()) // none: a job with no run span
	if j.span != nil {
		_, span = telemetry.Tracer().Start(trace.ContextWithSpan(context.Background(), j.span), "agora.run.ack")
	}
	// A plain ack, not DoubleAck's round trip: the ack follows the
	// dispatch's terminal event, so a lost one costs a redelivery that the
	// fence read acks and skips (docs/worker.md#fencing).
	err := consume.Settle(context.Background(), j.msg, consume.Ack())
	telemetry.End(span, err)
	if err != nil {
		j.log.Warn("ack failed; the dispatch will be redelivered and skipped as terminal", "err", err)
	}
}

// retryLater gives the message back for another attempt after a short
// delay: used for transient NATS failures, never for a sub-agent's own
// failure. A failure that can never succeed (a message larger than the
// server takes) is not retried: the dispatch fails once (giveUp, fit.go).
func (s *Service) retryLater(j *job, err error) Outcome {
	if tooLarge(err) {
		return s.giveUp(j, err)
	}
	j.log.Warn("transient failure: message returned for redelivery", "err", err)
	_ = consume.Settle(context.Background(), j.msg, consume.Nak(time.Second))
	s.metrics.outcome("", "retried")
	return Outcome{DispatchID: j.req.DispatchID, ExitCode: -1}
}

func (s *Service) definition(ctx context.Context, req *lifecycle.Request) (subagent.Definition, error) {
	var (
		e   jetstream.KeyValueEntry
		err error
	)
	if req.SubagentRevision > 0 {
		if def, ok := s.defCache.get(req.Subagent, req.SubagentRevision); ok {
			return def, nil
		}
		e, err = s.defs.GetRevision(ctx, req.Subagent, req.SubagentRevision)
	} else {
		e, err = s.defs.Get(ctx, req.Subagent)
	}
	if err != nil {
		return subagent.Definition{}, fmt.Errorf("sub-agent %q (revision %d): %w", req.Subagent, req.SubagentRevision, err)
	}
	var def subagent.Definition
	if err := json.Unmarshal(e.Value(), &def); err != nil {
		return subagent.Definition{}, fmt.Errorf("sub-agent %q: stored definition: %w", req.Subagent, err)
	}
	if err := def.Validate(); err != nil {
		return subagent.Definition{}, err
	}
	if _, ok := s.inProcess[def.Runtime]; !ok {
		rt, ok := s.runtimes[def.Runtime]
		if !ok {
			return subagent.Definition{}, fmt.Errorf("sub-agent %q: runtime %q is not available on this worker (it offers %s)", def.Name, def.Runtime, strings.Join(s.offered(), ", "))
		}
		if v, ok := rt.(runtime.Validator); ok {
			if err := v.Validate(def); err != nil {
				return subagent.Definition{}, fmt.Errorf("sub-agent %q: %w", def.Name, err)
			}
		}
	}
	s.defCache.put(req.Subagent, e.Revision(), def)
	return def, nil
}

// prepare builds this attempt's own workspace: input.json, runtime files,
// the definition's files, and the environment. The returned invocation
// names the workspace and holds its lock whenever one was created, also
// with an error.
func (s *Service) prepare(ctx context.Context, j *job, def subagent.Definition) (Invocation, error) {
	ws, hold, err := prepareWorkspace(s.cfg.WorkspaceRoot, j.req.DispatchID, j.attempt, s.spares)
	if err != nil {
		return Invocation{}, err
	}
	inv := Invocation{Workspace: ws, hold: hold, box: j.box, fs: j.fs}
	j.fs.dir = hold
	if j.box.WorkspaceFS() == contain.WorkspaceMount {
		if err := j.fs.mount(ws, j.box.Limits().WorkspaceSize); err != nil {
			return inv, err
		}
	}
	input, err := s.writeInput(ctx, j, ws)
	if err != nil {
		return inv, err
	}
	inv.Definition, inv.Request, inv.Input, inv.KillGrace = def, *j.req, input, s.cfg.KillGrace
	if inv.Env, err = s.environment(j, def, ws); err != nil {
		return inv, err
	}
	inv.helper = runtime.Helper{Disabled: s.cfg.DisableNeedsInputHelper == "true", NeedsInputFile: filepath.Join(ws, ".agora", "needs_input.json")}
	if s.exe != "" {
		inv.helper.MCPServer, inv.helper.MCPEnv = s.exe, subagentmcp.EnvServe+"=serve"
	}
	if err := s.writeFiles(&inv, def); err != nil {
		return inv, err
	}
	return inv, nil
}

// writeInput writes .agora/input.json: the request's input object, with
// the partial state of a resume read from the object store when it came
// by reference. It returns the object written.
func (s *Service) writeInput(ctx context.Context, j *job, ws string) (map[string]json.RawMessage, error) {
	input := map[string]json.RawMessage{}
	if len(j.req.Input) > 0 && string(j.req.Input) != "null" {
		if err := json.Unmarshal(j.req.Input, &input); err != nil {
			return nil, fmt.Errorf("input is not a JSON object: %w", err)
		}
	}
	if ref := j.req.PartialStateRef; ref != "" {
		b, err := s.state.GetBytes(ctx, ref)
		if err != nil {
			if !errors.Is(err, jetstream.ErrObjectNotFound) {
				return nil, &transientError{fmt.Errorf("partial state %q: %w", ref, err)}
			}
			return nil, fmt.Errorf("partial state %q: %w", ref, err)
		}
		input["partial_state"] = b
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(input); err != nil {
		return nil, fmt.Errorf("input: %w", err)
	}
	b := bytes.TrimRight(buf.Bytes(), "\n")
	// The workspace is brand new and nothing has run in it yet, so a plain
	// write cannot be redirected by a link.
	if err := os.WriteFile(filepath.Join(ws, ".agora", "input.json"), b, 0o600); err != nil {
		return nil, fmt.Errorf("write input.json: %w", err)
	}
	return input, nil
}

// environment is the run's whole environment, sorted: the default-deny
// one (Environment) and, for a sandboxed run, a private tmp and home
// inside its workspace and what its box sets (the helper's PATH, the
// egress proxy) in place of the same names.
func (s *Service) environment(j *job, def subagent.Definition, ws string) ([]string, error) {
	envs := append(Environment(os.Environ(), def, j.req.Env, ws, j.req.DispatchID, j.req.ThreadID, j.req.Round), "AGORA_ATTEMPT="+strconv.Itoa(j.attempt))
	var pathEnv string
	for _, kv := range envs {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			pathEnv = v
		}
	}
	env := map[string]string{}
	if !j.box.Off() {
		dirs, err := privateDirs(ws)
		if err != nil {
			return nil, err
		}
		if err := j.box.Prepare(ws, pathEnv); err != nil {
			return nil, err
		}
		maps.Copy(env, dirs)
		maps.Copy(env, j.box.Env())
	}
	envs = slices.DeleteFunc(envs, func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		_, over := env[k]
		return over
	})
	for k, v := range env {
		envs = append(envs, k+"="+v)
	}
	slices.Sort(envs)
	return envs, nil
}

// writeFiles asks the run's runtime for its command and writes the files
// it lays down, then the definition's own files, into the workspace.
func (s *Service) writeFiles(inv *Invocation, def subagent.Definition) error {
	ws := inv.Workspace
	if rt, ok := s.runtimes[def.Runtime]; ok && s.inProcess[def.Runtime] == nil {
		cmd, err := rt.Command(inv.public())
		if err != nil {
			return fmt.Errorf("%s runtime: %w", def.Runtime, err)
		}
		inv.args = cmd.Args
		for _, f := range cmd.Files {
			if err := runtimeFilePath(f.Path); err != nil {
				return fmt.Errorf("%s runtime's file: %w", def.Runtime, err)
			}
			if err := writeWorkspaceFile(ws, f.Path, f.Data); err != nil {
				return fmt.Errorf("%s runtime's file: %w", def.Runtime, err)
			}
		}
	}
	for name, content := range def.Files {
		if err := subagent.ValidFilePath(name); err != nil {
			return fmt.Errorf("definition file: %w", err)
		}
		if err := writeWorkspaceFile(ws, name, []byte(content)); err != nil {
			return fmt.Errorf("definition file: %w", err)
		}
	}
	return nil
}

// runtimeFilePath checks where a runtime lays down a file
// (runtime.File): where a definition's files may go, or directly in
// .agora under a name Agora does not use itself.
func runtimeFilePath(p string) error {
	err := subagent.ValidFilePath(p)
	if err == nil {
		return nil
	}
	name, ok := strings.CutPrefix(path.Clean(filepath.ToSlash(p)), ".agora/")
	if ok && !filepath.IsAbs(p) && name != ".." && !strings.Contains(name, "/") && !slices.Contains(agoraOwn, name) {
		return nil
	}
	return err
}

// agoraOwn are the names Agora keeps in a workspace's .agora.
var agoraOwn = []string{"input.json", "output.json", "needs_input.json", "progress.jsonl", "artifacts", "tmp", "home"}

// transientError marks a preparation failure worth another delivery
// (NATS unreachable), as opposed to one the request itself caused.
type transientError struct{ err error }

func (e *transientError) Error() string { return e.err.Error() }
func (e *transientError) Unwrap() error { return e.err }

func parseCancel(b []byte) (by, reason string) {
	var c struct {
		By     string `json:"by"`
		Reason string `json:"reason"`
	}
	_ = json.Unmarshal(b, &c)
	return clip.String(c.By, 200), clip.String(c.Reason, 500)
}

func validUTF8(b []byte) string { return strings.ToValidUTF8(string(b), "\uFFFD") }

// redactTail turns a captured tail (the last tailSize bytes of a stream)
// into text an event may carry: valid UTF-8, every secret value replaced,
// and, when the capture cut the stream, the end of a secret left at its
// start replaced too (at least 4 bytes of it: fewer say nothing). It keeps
// at most tailSize bytes.
func redactTail(b []byte, secrets []string) string {
	s := redact(string(b), secrets)
	if len(b) >= tailSize {
		s = redactCutSecret(s, secrets)
	}
	return lastBytes(validUTF8([]byte(s)), tailSize)
}

// redactCutSecret replaces the longest end of a secret (4 bytes or more)
// that s starts with.
func redactCutSecret(s string, secrets []string) string {
	best := 0
	for _, v := range secrets {
		for k := len(v) - 1; k >= 4 && k > best; k-- {
			if strings.HasPrefix(s, v[len(v)-k:]) {
				best = k
				break
			}
		}
	}
	if best == 0 {
		return s
	}
	return "[redacted]" + s[best:]
}

// lastBytes keeps at most the last n bytes of s, on a rune boundary
// (redaction may have made a tail longer than it was captured).
func lastBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := len(s) - n
	for i < len(s) && !utf8.RuneStart(s[i]) {
		i++
	}
	return s[i:]
}
