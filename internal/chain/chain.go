// Package chain reads a dispatch's status from its chain of lifecycle
// events (docs/storage.md, "The dispatch record and the reconciler"):
// the last event of each kind on agora.lifecycle.*.<thread_id>.<dispatch_id>,
// read with one batched direct get (multi_last, ADR-31) by a Reader,
// applied to the part of a record the events do not carry.
package chain

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

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
// complete (its deadline passed mid-answer, or an answer was lost): a
// status from part of the chain could go back, so the caller gets an error
// instead.
var ErrCut = errors.New("chain: the read ended before its last message")

// Reader reads chains with batched direct gets over one connection. A
// batched get has several replies, which nats.go's request/reply does not
// take; a subscription of its own for each read (orbit.go's jetstreamext
// makes one) cost 0.24 ms a read here, against 0.08 ms with one
// subscription for every read's replies, each read told apart by the last
// token of its reply subject. It is safe for concurrent use.
type Reader struct {
	nc      *nats.Conn
	subject string // $JS.API.DIRECT.GET.AGORA_LIFECYCLE, with the JetStream API prefix
	prefix  string // reply subjects: <prefix>.<n>
	sub     *nats.Subscription
	next    atomic.Uint64
	mu      sync.Mutex
	calls   map[string]chan *nats.Msg
}

// NewReader subscribes for the replies of js's connection; Close ends it.
func NewReader(js jetstream.JetStream) (*Reader, error) {
	o := js.Options()
	api := "$JS.API."
	switch {
	case o.APIPrefix != "":
		api = strings.TrimSuffix(o.APIPrefix, ".") + "."
	case o.Domain != "":
		api = "$JS." + o.Domain + ".API."
	}
	nc := js.Conn()
	r := &Reader{nc: nc, subject: api + "DIRECT.GET." + lifecycle.StreamLifecycle, prefix: nc.NewRespInbox(), calls: map[string]chan *nats.Msg{}}
	sub, err := nc.Subscribe(r.prefix+".*", r.deliver)
	if err != nil {
		return nil, fmt.Errorf("chain: subscribe: %w", err)
	}
	r.sub = sub
	return r, nil
}

// Close unsubscribes.
func (r *Reader) Close() { _ = r.sub.Unsubscribe() }

func (r *Reader) deliver(m *nats.Msg) {
	token := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
	r.mu.Lock()
	ch := r.calls[token]
	r.mu.Unlock()
	if ch != nil {
		select {
		case ch <- m:
		default: // more than an answer holds: the read is cut
		}
	}
}

// Last reads the last event of each kind of one dispatch from
// AGORA_LIFECYCLE, in stream order; none when the chain is empty. An event
// that does not parse is skipped: it changes no status. The stream must
// allow direct gets (internal/provision sets it).
func (r *Reader) Last(ctx context.Context, threadID, dispatchID string) ([]Link, error) {
	req, err := json.Marshal(struct {
		MultiLast []string `json:"multi_last"`
		Batch     int      `json:"batch"`
	}{[]string{lifecycle.LifecycleFilter("", threadID, dispatchID)}, maxKinds})
	if err != nil {
		return nil, err
	}
	token := strconv.FormatUint(r.next.Add(1), 10)
	ch := make(chan *nats.Msg, maxKinds+2)
	r.mu.Lock()
	r.calls[token] = ch
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		delete(r.calls, token)
		r.mu.Unlock()
	}()
	if err := r.nc.PublishRequest(r.subject, r.prefix+"."+token, req); err != nil {
		return nil, fmt.Errorf("chain: read %s: %w", dispatchID, err)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, r.nc.Opts.Timeout)
		defer cancel()
	}
	type sequenced struct {
		seq  uint64
		link Link
	}
	var out []sequenced
	for {
		var m *nats.Msg
		select {
		case m = <-ch:
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: %s: %w", ErrCut, dispatchID, ctx.Err())
		}
		if len(m.Data) == 0 && m.Header.Get("Status") != "" {
			switch status := m.Header.Get("Status"); status {
			case "204": // the end of the answer, cut short when messages are still pending
				if n := m.Header.Get("Nats-Num-Pending"); n != "" && n != "0" {
					return nil, fmt.Errorf("%w: %s: %s events not sent", ErrCut, dispatchID, n)
				}
				slices.SortFunc(out, func(a, b sequenced) int { return cmp.Compare(a.seq, b.seq) })
				links := make([]Link, len(out))
				for i, s := range out {
					links[i] = s.link
				}
				return links, nil
			case "404":
				return nil, nil // no event
			default:
				return nil, fmt.Errorf("chain: read %s: status %s %s", dispatchID, status, m.Header.Get("Description"))
			}
		}
		seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("chain: read %s: a reply without its sequence", dispatchID)
		}
		e, err := lifecycle.Decode(m.Header, m.Data)
		if err != nil {
			continue
		}
		if l, ok := parse(e); ok && l.Data.Base().DispatchID == dispatchID {
			out = append(out, sequenced{seq, l})
		}
	}
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
