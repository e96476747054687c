package worker

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agora-dispatch/agora/internal/clip"
	"github.com/agora-dispatch/agora/internal/jserr"
	"github.com/agora-dispatch/agora/pkg/consume"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// Terminal events fit (docs/worker.md, "Events fit"). A NATS server takes
// no message larger than its max payload (1 MiB by default), and a publish
// refused for its size is refused again on every retry: redelivering the
// work message would only run the sub-agent again. So before a terminal
// event is published its encoded size is checked against the connection's
// max payload (and AGORA_LIFECYCLE's max message size, when one is set),
// and an event that is too large gives up, in this order:
// entries of artifacts_skipped, an inline partial_state (stored in
// agora_state and referenced instead), entries of artifacts (counted in
// artifacts_omitted) and finished's output (dropped with a note). An event
// still too large ends the dispatch `failed worker-failed`, saying why.
// Any publish error that can never succeed (tooLarge) ends the dispatch
// once in the same way (giveUp), and its work message is settled, never
// redelivered.

// tooLarge reports whether err is a publish that can never succeed
// (jserr.TooLarge).
func tooLarge(err error) bool { return jserr.TooLarge(err) }

// msgSize is what a message counts against the server's max payload: its
// headers as sent (NATS/1.0 line, "key: value" lines, blank line) and its
// data.
func msgSize(m *nats.Msg) int {
	n := len(m.Data)
	if len(m.Header) == 0 {
		return n
	}
	n += len("NATS/1.0\r\n") + len("\r\n")
	for k, vs := range m.Header {
		for _, v := range vs {
			n += len(k) + len(": ") + len(v) + len("\r\n")
		}
	}
	return n
}

// eventSize is the size of d's fenced message.
func (s *Service) eventSize(j *job, d lifecycle.Data) (int, error) {
	m, err := s.fencedMsg(j, d)
	if err != nil {
		return 0, err
	}
	return msgSize(m), nil
}

// fit returns d, shrunk if need be so that its message fits the
// connection's max payload, or, when it cannot fit, a `failed
// worker-failed` event of the run that says why. When d fits as it is,
// fit also returns the fenced message it measured, ready to publish (the
// common case builds the event once); otherwise the message is nil and
// the publish builds the event it returns. An error is a transient store
// failure (the delivery is retried), or a tooLarge error when not even the
// failed event fits.
func (s *Service) fit(ctx context.Context, j *job, d lifecycle.Lifecycle) (lifecycle.Lifecycle, *nats.Msg, error) {
	limit, what := s.maxEvent()
	if limit <= 0 {
		return d, nil, nil // not connected yet: the publish reports it
	}
	m, err := s.fencedMsg(j, d)
	if err != nil {
		return d, nil, nil // an encoding error is the publish's to report
	}
	size := msgSize(m)
	if size <= limit {
		if f := s.recordFit(j, d, size, limit, what); f != nil {
			return f, nil, nil
		}
		return d, m, nil
	}
	first := size
	var orig lifecycle.Outputs
	if outs := lifecycle.RunOutputs(d); outs != nil {
		orig = *outs
	}
	size, gave, err := s.shrink(ctx, j, d, limit)
	if err != nil {
		return d, nil, err
	}
	if size <= limit {
		j.log.Warn("terminal event shrunk to fit "+what, "kind", d.LifecycleKind(), "bytes", first, "now", size, "limit", limit, "gave_up", strings.Join(gave, "; "))
		if f := s.recordFit(j, d, size, limit, what); f != nil {
			return f, nil, nil
		}
		return d, nil, nil
	}
	detail := fmt.Sprintf("the %s event of %d bytes exceeds %s of %d bytes", d.LifecycleKind(), first, what, limit)
	if len(gave) > 0 {
		detail += fmt.Sprintf(" and is still %d bytes without %s", size, strings.Join(gave, ", "))
	}
	if big := largestFields(d, 3); big != "" {
		detail += "; largest fields: " + big
	}
	f := &lifecycle.Failed{Common: j.common, Outputs: orig, Reason: lifecycle.ReasonWorkerFailed, Detail: clip.String(detail, 1024)}
	f.SetProducer(s.cfg.ID, j.attempt)
	f.ExitCode, f.DurationMS = runOf(d)
	j.log.Error("terminal event cannot fit "+what+": the dispatch fails", "kind", d.LifecycleKind(), "bytes", first, "limit", limit, "detail", f.Detail)
	fsize, _, err := s.shrink(ctx, j, f, limit)
	if err != nil {
		return d, nil, err
	}
	if fsize > limit {
		return d, nil, fmt.Errorf("worker: even the failed event (%d bytes) exceeds %s of %d bytes: %w", fsize, what, limit, nats.ErrMaxPayload)
	}
	return f, nil, nil
}

// recordFit returns the failed event that replaces a needs_input event
// whose question cannot be stored in the router's record (it goes on there
// with the request to resume with: such a question could never be asked),
// or nil when d is not one. eventSize is d's message as fit measured it.
func (s *Service) recordFit(j *job, d lifecycle.Lifecycle, eventSize, limit int, what string) *lifecycle.Failed {
	ni, ok := d.(*lifecycle.NeedsInput)
	if !ok {
		return nil
	}
	n := questionRecordSize(eventSize, len(j.msg.Data()))
	if n <= limit {
		return nil
	}
	f := &lifecycle.Failed{Common: j.common, Outputs: ni.Outputs, Reason: lifecycle.ReasonWorkerFailed, Detail: clip.String(fmt.Sprintf(
		"the question would make a record of about %d bytes in %s, more than %s of %d bytes (question %d bytes, context %d, %d options of %d bytes, inline partial_state %d, the request's input %d): ask with fewer or shorter options and a shorter context",
		n, lifecycle.BucketQuestions, what, limit, len(ni.Question), len(ni.Context), len(ni.Options), optionBytes(ni.Options), len(ni.PartialState), len(j.req.Input)), 1024)}
	f.SetProducer(s.cfg.ID, j.attempt)
	f.ExitCode, f.DurationMS = runOf(d)
	j.log.Error("question too large for its record: the dispatch fails", "bytes", n, "limit", limit)
	return f
}

// recordOverhead is room in a question's record beyond what the worker
// knows of it: ids, routing, deadlines, the history of answer attempts
// and the first threads that join it.
const recordOverhead = 32 << 10

// questionRecordSize estimates the router's record of a question
// (docs/wire.md, "Questions and answers") from what the worker has measured
// already: the needs_input event, which holds what the question shows and its
// inline state, the work message, which holds the request to resume with, and
// recordOverhead.
func questionRecordSize(eventSize, requestSize int) int {
	return eventSize + requestSize + recordOverhead
}

func optionBytes(opts []string) int {
	n := 0
	for _, o := range opts {
		n += len(o)
	}
	return n
}

// maxEvent is the largest lifecycle message that can be stored, and what
// sets it: the connection's max payload, or AGORA_LIFECYCLE's max message
// size when that is smaller (as the worker read it at start).
func (s *Service) maxEvent() (int, string) {
	limit, what := int(s.nc.MaxPayload()), "the server's max payload"
	if s.events != nil {
		if ms := int(s.events.CachedInfo().Config.MaxMsgSize); ms > 0 && (ms < limit || limit <= 0) {
			limit, what = ms, lifecycle.StreamLifecycle+"'s max message size"
		}
	}
	return limit, what
}

// shrink gives up parts of d, in the order of the package comment, until
// its message fits limit or nothing is left to give up. It returns the
// size reached and what was given up.
func (s *Service) shrink(ctx context.Context, j *job, d lifecycle.Lifecycle, limit int) (int, []string, error) {
	size, err := s.eventSize(j, d)
	if err != nil {
		return 0, nil, err
	}
	outs := lifecycle.RunOutputs(d)
	if outs == nil {
		outs = &lifecycle.Outputs{} // an event without lists to trim
	}
	steps := []func(excess int) (string, error){
		trimStep(&outs.ArtifactsSkipped, &outs.ArtifactsSkippedOmitted, "entries of artifacts_skipped"),
		func(int) (string, error) {
			ni, ok := d.(*lifecycle.NeedsInput)
			if !ok || len(ni.PartialState) == 0 {
				return "", nil
			}
			if _, err := s.state.PutBytes(context.WithoutCancel(ctx), j.req.DispatchID, ni.PartialState); err != nil {
				if tooLarge(err) {
					return "", nil // the store cannot take it either
				}
				return "", fmt.Errorf("store partial state: %w", err)
			}
			ni.PartialState, ni.PartialStateRef = nil, j.req.DispatchID
			return "the inline partial_state (stored in " + lifecycle.BucketState + ")", nil
		},
		trimStep(&outs.Artifacts, &outs.ArtifactsOmitted, "entries of artifacts"),
		func(int) (string, error) {
			f, ok := d.(*lifecycle.Finished)
			if !ok || len(f.Output) == 0 || string(f.Output) == "null" {
				return "", nil
			}
			f.OutputDropped = fmt.Sprintf("%d bytes of output.json dropped: the finished event would exceed the largest message the server stores, %d bytes", len(f.Output), limit)
			f.Output = nil
			return "the output", nil
		},
	}
	var gave []string
	for _, step := range steps {
		// A list step estimates what to drop; it runs again until the
		// event fits or the list is empty.
		for size > limit {
			what, err := step(size - limit)
			if err != nil {
				return size, gave, err
			}
			if what == "" {
				break
			}
			if len(gave) == 0 || gave[len(gave)-1] != what {
				gave = append(gave, what)
			}
			if size, err = s.eventSize(j, d); err != nil {
				return 0, gave, err
			}
		}
	}
	return size, gave, nil
}

// trimStep is a shrink step that drops entries from the end of *list,
// about excess bytes' worth, and counts them in *omitted; what names them
// in the failure detail. An empty list gives up nothing.
func trimStep[T any](list *[]T, omitted *int, what string) func(excess int) (string, error) {
	return func(excess int) (string, error) {
		if len(*list) == 0 {
			return "", nil
		}
		keep := trimTo(*list, excess)
		*omitted += len(*list) - keep
		*list = (*list)[:keep:keep]
		return what, nil
	}
}

// trimTo returns how many entries of list to keep so that the dropped
// entries' JSON is at least excess bytes, plus room for the count of what
// was omitted.
func trimTo[T any](list []T, excess int) int {
	excess += 64
	keep := len(list)
	for keep > 0 && excess > 0 {
		keep--
		excess -= jsonSize(list[keep]) + 1
	}
	return keep
}

// runOf returns the exit code and duration a terminal event reports.
func runOf(d lifecycle.Lifecycle) (*int, int64) {
	switch v := d.(type) {
	case *lifecycle.Finished:
		return &v.ExitCode, v.DurationMS
	case *lifecycle.NeedsInput:
		return &v.ExitCode, v.DurationMS
	case *lifecycle.Failed:
		return v.ExitCode, v.DurationMS
	}
	return nil, 0
}

// largestFields names the n largest fields of d's JSON with their sizes,
// for a failure's detail.
func largestFields(d lifecycle.Data, n int) string {
	b, err := json.Marshal(d)
	if err != nil {
		return ""
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(b, &fields) != nil {
		return ""
	}
	type field struct {
		name string
		size int
	}
	var all []field
	for k, v := range fields {
		all = append(all, field{k, len(v)})
	}
	slices.SortFunc(all, func(a, b field) int { return cmp.Or(b.size-a.size, strings.Compare(a.name, b.name)) })
	var parts []string
	for _, f := range all[:min(n, len(all))] {
		parts = append(parts, fmt.Sprintf("%s %d bytes", f.name, f.size))
	}
	return strings.Join(parts, ", ")
}

// giveUp ends a delivery whose failure can never succeed on retry (a
// message larger than the server takes): it publishes `failed
// worker-failed` saying why and acknowledges the work message, so the
// runtime never runs again. When not even that event can be stored, the
// message is terminated; the dispatch then has no terminal event, and the
// log says why.
func (s *Service) giveUp(j *job, cause error) Outcome {
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	f := &lifecycle.Failed{Common: j.common, Reason: lifecycle.ReasonWorkerFailed,
		Detail: clip.String("a message of this run can never be published: "+cause.Error(), 1024), DurationMS: time.Since(j.start).Milliseconds()}
	f.SetProducer(s.cfg.ID, j.attempt)
	stored, last, err := s.publishFenced(ctx, j, f)
	if err != nil {
		j.log.Error("permanent failure, and its failed event was not stored: work message terminated, never redelivered", "err", err, "cause", cause)
		_ = consume.Settle(ctx, j.msg, consume.Term("can never be published: "+clip.String(cause.Error(), 200)))
		s.metrics.outcome("", "terminated")
		return Outcome{DispatchID: j.req.DispatchID, ExitCode: -1}
	}
	if !stored && !last.ownedBy(s.cfg.ID, j.attempt, lifecycle.Kind.Terminal) {
		return s.settleWith(j, last)
	}
	s.ack(j)
	j.log.Info("dispatch ended", "kind", lifecycle.KindFailed, "reason", f.Reason, "detail", f.Detail)
	s.metrics.outcome(lifecycle.KindFailed, f.Reason)
	return Outcome{DispatchID: j.req.DispatchID, Kind: lifecycle.KindFailed, Reason: f.Reason, ExitCode: -1}
}
