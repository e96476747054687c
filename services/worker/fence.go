package worker

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/jserr"
	"github.com/agora-dispatch/agora/internal/telemetry"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// Fencing (docs/worker.md#fencing). A dispatch's lifecycle events form one
// chain on AGORA_LIFECYCLE (subject filter agora.lifecycle.*.<thread>.<id>).
// A run publishes each of its events on condition that the chain's last
// event is still the one it knows (Nats-Expected-Last-Subject-Sequence with
// that filter): `started` on the event it saw before it began, the terminal
// event on its own `started`. A newer delivery of the same work message
// publishes its own `started` first, so a stale run — paused past AckWait,
// cut off from NATS — can no longer end the dispatch: its terminal publish
// is refused, it kills its runtime and publishes nothing.

// Headers of JetStream's per-subject compare-and-set.
const (
	hdrExpectLastSubjSeq     = "Nats-Expected-Last-Subject-Sequence"
	hdrExpectLastSubjSeqSubj = "Nats-Expected-Last-Subject-Sequence-Subject"
)

// lastEvent is the last event of a dispatch's chain.
type lastEvent struct {
	seq      uint64 // 0: the dispatch has no event yet
	kind     lifecycle.Kind
	attempt  int    // of a `started`, or the producer of a terminal event
	workerID string // the same, for the worker
}

// newer reports whether the chain already belongs to a later delivery than
// attempt: a newer run has started.
func (l lastEvent) newer(attempt int) bool {
	return l.kind == lifecycle.KindStarted && l.attempt > attempt
}

// ownedBy reports whether the last event is one that run (worker, attempt)
// published itself, e.g. a publish whose acknowledgement was lost.
func (l lastEvent) ownedBy(workerID string, attempt int, kind func(lifecycle.Kind) bool) bool {
	return kind(l.kind) && l.attempt == attempt && (l.workerID == "" || l.workerID == workerID)
}

// errFenced is the cause given to a run stopped because a newer delivery of
// its work message took the dispatch over.
var errFenced = errors.New("worker: fenced: a newer attempt took the dispatch over")

// lastEvent reads the dispatch's last lifecycle event by direct get: any
// replica answers, and one that lags may answer an older event of the
// chain. That is safe for every use but the max-deliveries advisory's
// (docs/worker.md#fencing): each event is published on condition, checked
// by the stream leader, that the chain's last event is the one read, so a
// stale read costs a refused publish and a second read.
func (s *Service) lastEvent(ctx context.Context, c lifecycle.Common) (lastEvent, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	raw, err := s.events.GetLastMsgForSubject(ctx, lifecycle.LifecycleFilter("", c.ThreadID, c.DispatchID))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return lastEvent{}, nil
	}
	if err != nil {
		return lastEvent{}, fmt.Errorf("read the dispatch's last event: %w", err)
	}
	return readLast(raw.Subject, raw.Sequence, raw.Header, raw.Data), nil
}

// acceptedFence is the fence of a first delivery whose work message names
// the stream sequence of its dispatch's accepted event
// (lifecycle.AcceptedSeqHeader), stored before the work was published:
// `started` is fenced on it without reading the chain. known is false for
// a redelivery, whose chain holds more than `accepted`, and for a message
// without the header. Were the chain to have moved on since — a cancel
// while the work was queued — the stream refuses the `started` and claim
// reads the chain then (docs/worker.md#fencing).
func acceptedFence(j *job) (last lastEvent, known bool) {
	if j.attempt != 1 {
		return lastEvent{}, false
	}
	seq, err := strconv.ParseUint(j.msg.Headers().Get(lifecycle.AcceptedSeqHeader), 10, 64)
	if err != nil || seq == 0 {
		return lastEvent{}, false
	}
	return lastEvent{seq: seq, kind: lifecycle.KindAccepted}, true
}

// acceptedWait bounds how long a run waits for its dispatch's accepted
// event on an empty chain before it returns the work message for
// redelivery.
const acceptedWait = 2 * time.Second

// awaitAccepted reads the dispatch's chain again until an event is there:
// the work message says an accepted event was sent before it
// (lifecycle.AcceptedHeader), and the dispatcher sends the two to two
// streams without waiting in between, so the work can be delivered before
// its accepted event is stored. A `started` fenced on the empty chain would
// be stored before that event, and the run's terminal event, fenced on its
// `started`, refused once the event lands. Reads back off from 1 ms; after
// acceptedWait with the chain still empty the error returns the message
// for redelivery (docs/worker.md#fencing).
func (s *Service) awaitAccepted(ctx context.Context, j *job) (lastEvent, error) {
	start := time.Now()
	for wait := time.Millisecond; ; wait = min(2*wait, 200*time.Millisecond) {
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return lastEvent{}, ctx.Err()
		case <-t.C:
		}
		last, err := s.lastEvent(ctx, j.common)
		if err != nil {
			return last, err
		}
		if last.seq != 0 {
			s.metrics.acceptedWaits.WithLabelValues("stored").Inc()
			j.log.Info("the dispatch's accepted event was stored after its work message was delivered: waited for it", "waited", time.Since(start).Round(time.Microsecond))
			return last, nil
		}
		if time.Since(start) > acceptedWait {
			s.metrics.acceptedWaits.WithLabelValues("not_stored").Inc()
			return lastEvent{}, fmt.Errorf("the dispatch's accepted event (%s) is not stored %s after its work message was delivered", j.msg.Headers().Get(lifecycle.AcceptedHeader), acceptedWait)
		}
	}
}

// lastEventOnLeader is lastEvent read from the stream leader (the
// JetStream API's STREAM.MSG.GET, never a direct get): the latest event
// stored, for a caller that acts on a refused publish as on a chain that
// moved on (docs/worker.md#fencing).
func (s *Service) lastEventOnLeader(ctx context.Context, c lifecycle.Common) (lastEvent, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// The older JetStream API reads through the leader unless asked
	// for a direct get.
	ljs, err := s.js.Conn().JetStream()
	if err != nil {
		return lastEvent{}, fmt.Errorf("read the dispatch's last event: %w", err)
	}
	raw, err := ljs.GetLastMsg(lifecycle.StreamLifecycle, lifecycle.LifecycleFilter("", c.ThreadID, c.DispatchID), nats.Context(ctx))
	if errors.Is(err, nats.ErrMsgNotFound) {
		return lastEvent{}, nil
	}
	if err != nil {
		return lastEvent{}, fmt.Errorf("read the dispatch's last event: %w", err)
	}
	return readLast(raw.Subject, raw.Sequence, raw.Header, raw.Data), nil
}

// readLast decodes a dispatch's last event, stored at seq on subject.
func readLast(subject string, seq uint64, header nats.Header, data []byte) lastEvent {
	last := lastEvent{seq: seq}
	a, err := lifecycle.ParseLifecycleSubject(subject)
	if err != nil {
		return last
	}
	last.kind = a.Kind
	ev, err := lifecycle.Decode(header, data)
	if err != nil {
		return last
	}
	d, err := lifecycle.Parse(ev)
	if err != nil {
		return last
	}
	switch x := d.(type) {
	case *lifecycle.Started:
		last.attempt, last.workerID = x.Attempt, x.WorkerID
	case *lifecycle.Finished:
		last.attempt, last.workerID = x.Attempt, x.WorkerID
	case *lifecycle.NeedsInput:
		last.attempt, last.workerID = x.Attempt, x.WorkerID
	case *lifecycle.Failed:
		last.attempt, last.workerID = x.Attempt, x.WorkerID
	case *lifecycle.Cancelled:
		last.attempt, last.workerID = x.Attempt, x.WorkerID
	}
	return last
}

// fencedMsg builds the message for d, to be stored only while the chain's
// last event is still j.fence.
func (s *Service) fencedMsg(j *job, d lifecycle.Data) (*nats.Msg, error) {
	_, m, err := lifecycle.Message(s.source, d, j.traceOption())
	if err != nil {
		return nil, err
	}
	m.Header.Set(hdrExpectLastSubjSeq, strconv.FormatUint(j.fence, 10))
	m.Header.Set(hdrExpectLastSubjSeqSubj, lifecycle.LifecycleFilter("", j.common.ThreadID, j.common.DispatchID))
	return m, nil
}

// publishFenced publishes d on condition that the chain's last event is
// j.fence, retrying transient failures for up to 30 s (never a message too
// large to be stored: tooLarge, fit.go). When it is stored,
// j.fence moves to it and stored is true. When the chain moved on, stored
// is false and last is the event that is there now.
func (s *Service) publishFenced(ctx context.Context, j *job, d lifecycle.Data) (stored bool, last lastEvent, err error) {
	m, err := s.fencedMsg(j, d)
	if err != nil {
		return false, lastEvent{}, err
	}
	return s.publishMsgFenced(ctx, j, m)
}

// publishMsgFenced is publishFenced of a message fencedMsg built with the
// fence j has now.
func (s *Service) publishMsgFenced(ctx context.Context, j *job, m *nats.Msg) (stored bool, last lastEvent, err error) {
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	backoff := 50 * time.Millisecond
	for {
		ack, err := s.js.PublishMsg(pctx, m)
		if err == nil && ack.Duplicate {
			// A replicated stream drops a repeated event id before it
			// checks the fence: the event stored under that id may be
			// this run's own (an acknowledgement lost), or one from a
			// delivery before this one (a work message delivered a
			// second time as attempt 1). Only the leader can tell.
			last, lerr := s.lastEventOnLeader(pctx, j.common)
			if lerr == nil {
				if a, perr := lifecycle.ParseLifecycleSubject(m.Subject); perr == nil && last.seq == ack.Sequence &&
					last.ownedBy(s.cfg.ID, j.attempt, func(k lifecycle.Kind) bool { return k == a.Kind }) {
					j.fence = ack.Sequence
					return true, lastEvent{}, nil
				}
				return false, last, nil
			}
			err = lerr
		} else if err == nil {
			j.fence = ack.Sequence
			return true, lastEvent{}, nil
		}
		if tooLarge(err) {
			// Refused for its size: every retry would be refused too.
			return false, lastEvent{}, fmt.Errorf("publish %s: %w", m.Subject, err)
		}
		if wrongLastSeq(err) {
			last, lerr := s.lastEvent(pctx, j.common)
			if lerr == nil {
				return false, last, nil
			}
			err = lerr
		}
		select {
		case <-pctx.Done():
			return false, lastEvent{}, fmt.Errorf("publish %s: %w", m.Subject, err)
		case <-time.After(backoff):
			backoff = min(2*backoff, 2*time.Second)
		}
	}
}

// wrongLastSeq reports whether a publish was refused by the per-subject
// compare-and-set.
func wrongLastSeq(err error) bool { return jserr.WrongLastSequence(err) }

func (s *Service) startedData(j *job) *lifecycle.Started {
	st := &lifecycle.Started{Common: j.common, WorkerID: s.cfg.ID, Attempt: j.attempt}
	if j.box != nil {
		st.Sandbox = j.box.Report()
	}
	return st
}

// settled handles a delivery whose dispatch needs nothing from this run:
// already terminal (acked and skipped) or taken over by a newer attempt
// (fenced). It reports false when the run may go on.
func (s *Service) settled(j *job, last lastEvent) (Outcome, bool) {
	switch {
	case last.kind.Terminal():
		j.log.Info("already terminal: acked without running", "kind", last.kind)
		s.ack(j)
		s.metrics.outcome("", "skipped")
		return Outcome{DispatchID: j.req.DispatchID, Kind: last.kind, Skipped: true, ExitCode: -1}, true
	case last.newer(j.attempt):
		return s.fenced(j, last), true
	}
	return Outcome{}, false
}

// settleWith ends a run whose own event was refused because the chain
// moved on to last.
func (s *Service) settleWith(j *job, last lastEvent) Outcome {
	if last.kind.Terminal() {
		// Someone else ended the dispatch (a cancel, a newer attempt):
		// that event stands, and the work message is done with.
		j.log.Info("dispatch already ended elsewhere: this run's result is dropped", "kind", last.kind, "by_worker", last.workerID, "by_attempt", last.attempt)
		s.ack(j)
		s.metrics.outcome("", "superseded")
		return Outcome{DispatchID: j.req.DispatchID, Kind: last.kind, Skipped: true, ExitCode: -1}
	}
	return s.fenced(j, last)
}

// settle reads the chain and ends a run that was stopped because the
// dispatch moved on without it.
func (s *Service) settle(ctx context.Context, j *job) Outcome {
	last, err := s.lastEvent(context.WithoutCancel(ctx), j.common)
	if err != nil {
		return s.retryLater(j, err)
	}
	if o, ok := s.settled(j, last); ok {
		return o
	}
	return s.fenced(j, last)
}

// fenced gives up a run that no longer owns its dispatch: it publishes
// nothing and leaves the work message alone (an ack or nak would act on
// the newer delivery's message).
func (s *Service) fenced(j *job, last lastEvent) Outcome {
	j.log.Warn("fenced: a newer attempt owns the dispatch; this run publishes nothing", "newer_attempt", last.attempt, "newer_worker", last.workerID, "last_kind", last.kind)
	s.metrics.outcome("", "fenced")
	return Outcome{DispatchID: j.req.DispatchID, Fenced: true, ExitCode: -1}
}

// claim makes sure this run's `started` is the chain's latest event before
// its runtime starts: it waits for the async publish and, when that was
// refused or lost, publishes again after the event that is there now — an
// `accepted` stored late, an older attempt's `started` — unless that event
// ends or takes over the dispatch. It reports false, with the outcome, when
// the run must not go on.
func (s *Service) claim(ctx context.Context, j *job) (Outcome, bool) {
	if j.owned {
		return Outcome{}, true
	}
	_, span := telemetry.Tracer().Start(ctx, "agora.run.claim")
	defer span.End()
	if j.started != nil {
		select {
		case ack := <-j.started.Ok():
			if !ack.Duplicate {
				j.fence, j.owned = ack.Sequence, true
				return Outcome{}, true
			}
			// Dropped as a repeat of an earlier `started` of this
			// attempt: publishFenced below finds out whose it is.
		case err := <-j.started.Err():
			if !wrongLastSeq(err) {
				j.log.Warn("started event not acknowledged; republishing", "err", err)
				break
			}
			// Refused: the chain moved on from the fence it was sent
			// on (a cancel while queued, an `accepted` stored late).
			// Read it before publishing again, rather than be refused
			// once more.
			last, lerr := s.lastEvent(ctx, j.common)
			if lerr != nil {
				break
			}
			if o, ok := s.settled(j, last); ok {
				return o, false
			}
			j.fence = last.seq
		case <-time.After(30 * time.Second):
		}
		j.started = nil
	}
	for range 8 {
		stored, last, err := s.publishFenced(ctx, j, s.startedData(j))
		if err != nil {
			return s.retryLater(j, err), false
		}
		if stored {
			j.owned = true
			return Outcome{}, true
		}
		if last.ownedBy(s.cfg.ID, j.attempt, func(k lifecycle.Kind) bool { return k == lifecycle.KindStarted }) {
			j.fence, j.owned = last.seq, true
			return Outcome{}, true
		}
		if o, ok := s.settled(j, last); ok {
			return o, false
		}
		j.fence = last.seq
	}
	return s.retryLater(j, errors.New("the dispatch's events kept changing while this run claimed it")), false
}
