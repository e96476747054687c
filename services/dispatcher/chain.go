package dispatcher

import (
	"context"

	"github.com/agora-dispatch/agora/internal/chain"
)

// A dispatch's status is read from its chain (docs/storage.md, "The
// dispatch record and the reconciler"): the record keeps what the events
// do not carry, and every door that answers a record applies to it the
// last event of each kind (internal/chain), one batched direct get.

// view reads a dispatch record and derives its status from its chain: the
// record every door answers. The revision is the stored one.
func (st store) view(ctx context.Context, id string) (record, uint64, error) {
	rec, _, rev, err := st.viewChain(ctx, id)
	return rec, rev, err
}

// viewChain is view, and the chain's events it applied. The chain's
// subject names the thread, which the record holds; a root's thread is its
// own id, so that chain is read beside the record, and a root's status
// costs one round trip's wait, not two.
func (st store) viewChain(ctx context.Context, id string) (record, []chain.Link, uint64, error) {
	type read struct {
		links []chain.Link
		err   error
	}
	root := make(chan read, 1)
	go func() {
		links, err := st.chain.Last(ctx, id, id)
		root <- read{links, err}
	}()
	rec, rev, err := st.get(ctx, id)
	if err != nil {
		return rec, nil, rev, err
	}
	var links []chain.Link
	if rec.ThreadID == id {
		r := <-root
		links, err = r.links, r.err
	} else {
		links, err = st.chain.Last(ctx, rec.ThreadID, id)
	}
	if err != nil {
		return rec, nil, rev, err
	}
	chain.Apply(&rec.Record, links...)
	return rec, links, rev, nil
}

// terminal returns the first terminal event of a chain's links.
func terminal(links []chain.Link) (chain.Link, bool) {
	for _, l := range links {
		if l.Data.LifecycleKind().Terminal() {
			return l, true
		}
	}
	return chain.Link{}, false
}
