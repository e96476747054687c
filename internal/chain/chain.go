// Package chain reads a dispatch's status from its chain of lifecycle
// events (docs/design.md §2, "The dispatch record and the reconciler"):
// the last event of each kind on agora.lifecycle.*.<thread_id>.<dispatch_id>,
// read with one batched direct get (multi_last, ADR-31), applied to the
// part of a record the events do not carry.
package chain

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// Link is one lifecycle event of a chain and its parsed data.
type Link struct {
	Event lifecycle.Event
	Data  lifecycle.Lifecycle
}

// maxKinds bounds the answer of one read: one message per kind.
const maxKinds = 8

// MaxEventRefs bounds the event ids a record lists.
const MaxEventRefs = 256

// ErrCut reports a read that ended before the server said its answer was
// complete (its deadline passed mid-answer): a status from part of the
// chain could go back, so the caller gets an error instead.
var ErrCut = errors.New("chain: the read ended before its last message")

// Last reads the last event of each kind of one dispatch from
// AGORA_LIFECYCLE, in stream order; none when the chain is empty. An event
// that does not parse is skipped: it changes no status. The stream must
// allow direct gets (internal/provision sets it).
func Last(ctx context.Context, js jetstream.JetStream, threadID, dispatchID string) ([]Link, error) {
	filter := lifecycle.LifecycleFilter("", threadID, dispatchID)
	msgs, err := jetstreamext.GetLastMsgsFor(ctx, js, lifecycle.StreamLifecycle, []string{filter}, jetstreamext.GetLastMsgsBatchSize(maxKinds))
	if err != nil {
		return nil, fmt.Errorf("chain: read %s: %w", dispatchID, err)
	}
	type sequenced struct {
		seq  uint64
		link Link
	}
	var out []sequenced
	complete := false
	for m, err := range msgs {
		if errors.Is(err, jetstreamext.ErrNoMessages) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("chain: read %s: %w", dispatchID, err)
		}
		// Nats-Num-Pending counts the messages of the answer still to
		// come: 0 on the last one. The iterator also ends quietly when the
		// context does, so only that header tells a whole answer.
		pending, perr := strconv.ParseUint(m.Header.Get("Nats-Num-Pending"), 10, 64)
		complete = perr == nil && pending == 0
		e, err := lifecycle.Decode(m.Header, m.Data)
		if err != nil {
			continue
		}
		if l, ok := parse(e); ok && l.Data.Base().DispatchID == dispatchID {
			out = append(out, sequenced{m.Sequence, l})
		}
	}
	if !complete {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrCut, dispatchID, err)
		}
		return nil, fmt.Errorf("%w: %s", ErrCut, dispatchID)
	}
	slices.SortFunc(out, func(a, b sequenced) int { return cmp.Compare(a.seq, b.seq) })
	links := make([]Link, len(out))
	for i, s := range out {
		links[i] = s.link
	}
	return links, nil
}

// Parse parses a dispatch's events, in their order, skipping those that
// are not lifecycle events.
func Parse(es []lifecycle.Event) []Link {
	var out []Link
	for _, e := range es {
		if l, ok := parse(e); ok {
			out = append(out, l)
		}
	}
	return out
}

func parse(e lifecycle.Event) (Link, bool) {
	d, err := lifecycle.Parse(e)
	if err != nil {
		return Link{}, false
	}
	l, ok := d.(lifecycle.Lifecycle)
	return Link{e, l}, ok
}

// Apply applies to rec, in order, the events it does not list yet.
func Apply(rec *client.Record, links ...Link) {
	for _, it := range links {
		ref := client.EventRef{ID: it.Event.ID(), Kind: it.Data.LifecycleKind(), Time: it.Event.Time().UTC()}
		if slices.ContainsFunc(rec.Events, func(r client.EventRef) bool { return r.ID == ref.ID }) {
			continue
		}
		apply(rec, ref, it.Data)
	}
}

// rank orders the kinds so the status never goes back, whatever order
// events of one dispatch are applied in.
func rank(k lifecycle.Kind) int {
	switch {
	case k == lifecycle.KindAccepted:
		return 1
	case k == lifecycle.KindStarted:
		return 2
	case k.Terminal():
		return 3
	}
	return 0
}

// apply changes rec for one new event: status, the kind's timestamp,
// attempt and worker (of the latest started; the chain is fenced, so it
// is the highest attempt), and the terminal summary (the first terminal
// event wins; there is only one per dispatch).
func apply(rec *client.Record, ref client.EventRef, l lifecycle.Lifecycle) {
	rec.Events = append(rec.Events, ref)
	if n := len(rec.Events); n > MaxEventRefs {
		rec.Events = rec.Events[n-MaxEventRefs:]
	}
	t := ref.Time
	switch v := l.(type) {
	case *lifecycle.Accepted:
		if rec.AcceptedAt == nil {
			rec.AcceptedAt = &t
		}
		if rec.SubagentRevision == 0 {
			rec.SubagentRevision = v.SubagentRevision
		}
	case *lifecycle.Started:
		if v.Attempt >= rec.Attempt {
			rec.Attempt, rec.WorkerID, rec.StartedAt = v.Attempt, v.WorkerID, &t
		}
	default:
		if rec.Result == nil {
			rec.Result, rec.EndedAt = Result(l), &t
		}
	}
	if k := l.LifecycleKind(); rank(k) > rank(rec.Status) {
		rec.Status = k
	}
}

// Result summarises a terminal event.
func Result(l lifecycle.Lifecycle) *client.Result {
	r := &client.Result{Kind: l.LifecycleKind()}
	switch v := l.(type) {
	case *lifecycle.Finished:
		code := v.ExitCode
		r.ExitCode, r.DurationMS, r.Output = &code, v.DurationMS, v.Output
	case *lifecycle.NeedsInput:
		code := v.ExitCode
		r.ExitCode, r.DurationMS, r.QuestionID, r.Question = &code, v.DurationMS, v.QuestionID, v.Question
	case *lifecycle.Failed:
		r.Reason, r.Detail, r.ExitCode, r.DurationMS = v.Reason, v.Detail, v.ExitCode, v.DurationMS
	case *lifecycle.Cancelled:
		r.By, r.Detail = v.By, v.Reason
	}
	return r
}
