package dispatcher

import (
	"context"

	"github.com/agora-dispatch/agora/internal/chain"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// A dispatch's status is read from its chain (docs/design.md §2, "The
// dispatch record and the reconciler"): the record keeps what the events
// do not carry, and every door that answers a record applies to it the
// last event of each kind (internal/chain), one batched direct get.

// lastEvents reads the last event of each kind of one dispatch, in stream
// order.
func (st store) lastEvents(ctx context.Context, threadID, dispatchID string) ([]event, error) {
	links, err := st.chain.Last(ctx, threadID, dispatchID)
	evs := make([]event, len(links))
	for i, l := range links {
		evs[i] = event{l.Event, l.Data}
	}
	return evs, err
}

// derive applies to rec, in order, the events it does not list yet.
func derive(rec *client.Record, evs []event) {
	for _, it := range evs {
		chain.Apply(rec, chain.Link{Event: it.e, Data: it.l})
	}
}

// parseAll parses a dispatch's events, skipping those that are not
// lifecycle events.
func parseAll(es []lifecycle.Event) []event {
	links := chain.Parse(es)
	evs := make([]event, len(links))
	for i, l := range links {
		evs[i] = event{l.Event, l.Data}
	}
	return evs
}

// view reads a dispatch record and derives its status from its chain: the
// record every door answers. The revision is the stored one. The chain's
// subject names the thread, which the record holds; a root's thread is its
// own id, so that chain is read beside the record, and a root's status
// costs one round trip's wait, not two.
func (st store) view(ctx context.Context, id string) (record, uint64, error) {
	type read struct {
		evs []event
		err error
	}
	root := make(chan read, 1)
	go func() {
		evs, err := st.lastEvents(ctx, id, id)
		root <- read{evs, err}
	}()
	rec, rev, err := st.get(ctx, id)
	if err != nil {
		return rec, rev, err
	}
	var evs []event
	if rec.ThreadID == id {
		r := <-root
		evs, err = r.evs, r.err
	} else {
		evs, err = st.lastEvents(ctx, rec.ThreadID, id)
	}
	if err != nil {
		return rec, rev, err
	}
	derive(&rec.Record, evs)
	return rec, rev, nil
}
