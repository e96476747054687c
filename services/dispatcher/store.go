package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/chain"
	"github.com/agora-dispatch/agora/internal/retention"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// errNoRecord reports a dispatch id with no record (or a thread with no
// index).
var errNoRecord = errors.New("dispatcher: no such dispatch")

// errConflict reports a lost compare-and-set: the key was written since it
// was read, or a create found it taken. The caller reads again.
var errConflict = errors.New("dispatcher: record changed concurrently")

// maxCAS bounds the compare-and-set retries of one change.
const maxCAS = 64

// record is a dispatch record as stored under its dispatch id: the public
// client.Record, the part of it the events do not carry kept current, and
// its status as created (every door answers the status from the chain:
// view). Whether its work is queued is not recorded: the chain says it once
// a worker starts it, and until then finish and the reconciler queue it
// again, a duplicate when it is there (reconcile.go).
type record struct {
	client.Record
}

// store is the one home of the dispatch records and thread indexes in
// agora_dispatches (docs/storage.md, "The dispatch record and the
// reconciler"): every read and write of that bucket goes through it, and
// so does the dispatcher's one write to agora_questions, the retention of a
// closed question (docs/storage.md, "Retention"). A record is the value
// under its dispatch id; a thread's index, its dispatches in round order,
// is the value under thread.<thread_id>. Writes over a revision are
// compare-and-set; a record set to expire is written with its TTL.
//
// The store keeps the records this dispatcher wrote last (records.go), so
// a writer can start from its own copy instead of a read. It is safe for
// concurrent use; its zero cache (nil) keeps nothing.
type store struct {
	kv        jetstream.KeyValue  // agora_dispatches
	questions jetstream.KeyValue  // agora_questions: closed questions get their TTL
	js        jetstream.JetStream // TTL writes and the reconciler's scan
	chain     *chain.Reader       // the dispatches' chains, for their status (view)
	cache     *recordCache        // the records as this dispatcher last wrote them
}

func newStore(js jetstream.JetStream, dispatches, questions jetstream.KeyValue) (store, error) {
	r, err := chain.NewReader(js)
	if err != nil {
		return store{}, fmt.Errorf("dispatcher: %w", err)
	}
	return store{kv: dispatches, questions: questions, js: js, chain: r, cache: newRecordCache(recordCacheSize, recordCacheBytes)}, nil
}

// conflict reports a lost compare-and-set of the bucket.
func conflict(err error) bool {
	return errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists)
}

// get reads a dispatch record and its revision; errNoRecord when there is
// none.
func (st store) get(ctx context.Context, id string) (record, uint64, error) {
	e, err := st.kv.Get(ctx, id)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrInvalidKey):
		return record{}, 0, fmt.Errorf("%w: %s", errNoRecord, id)
	case err != nil:
		return record{}, 0, fmt.Errorf("dispatcher: read record %s: %w", id, err)
	}
	var rec record
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return record{}, 0, fmt.Errorf("dispatcher: decode record %s: %w", id, err)
	}
	return rec, e.Revision(), nil
}

// cached returns the record of id as this dispatcher last wrote it, or
// reads it when it has no copy. The revision is the one to write at; when
// the copy is stale that write fails as a conflict and the caller reads
// again with get.
func (st store) cached(ctx context.Context, id string) (record, uint64, error) {
	if st.cache != nil {
		st.cache.mu.Lock()
		e, ok := st.cache.get(id)
		st.cache.mu.Unlock()
		if ok {
			var rec record
			if err := json.Unmarshal(e.data, &rec); err != nil {
				return record{}, 0, fmt.Errorf("dispatcher: decode record %s: %w", id, err)
			}
			return rec, e.rev, nil
		}
	}
	return st.get(ctx, id)
}

// create writes a new record as it is — with its TTL when it is set to
// expire — and keeps it as written. It returns the record's revision, or
// errConflict when the dispatch id is taken.
func (st store) create(ctx context.Context, rec *record) (uint64, error) {
	data, err := json.Marshal(rec)
	if err != nil {
		return 0, fmt.Errorf("dispatcher: encode record: %w", err)
	}
	var opts []jetstream.KVCreateOpt
	if rec.ExpiresAt != nil {
		opts = append(opts, jetstream.KeyTTL(retention.TTL(*rec.ExpiresAt)))
	}
	rev, err := st.kv.Create(ctx, rec.DispatchID, data, opts...)
	if conflict(err) {
		return 0, fmt.Errorf("%w: %s exists", errConflict, rec.DispatchID)
	}
	if err != nil {
		return 0, fmt.Errorf("dispatcher: create record %s: %w", rec.DispatchID, err)
	}
	st.cache.wrote(rec, data, rev)
	return rev, nil
}

// put writes rec as it is over revision rev and keeps it as written. It
// returns the new revision, or errConflict when the record changed since
// rev; a copy kept of it is then stale, and forgotten.
func (st store) put(ctx context.Context, rec *record, rev uint64) (uint64, error) {
	id := rec.DispatchID
	data, err := json.Marshal(rec)
	if err != nil {
		return 0, fmt.Errorf("dispatcher: encode record: %w", err)
	}
	n, err := st.write(ctx, id, data, rev, rec.ExpiresAt)
	if conflict(err) {
		st.cache.drop(id)
		return 0, fmt.Errorf("%w: %s", errConflict, id)
	}
	if err != nil {
		return 0, fmt.Errorf("dispatcher: write record %s: %w", id, err)
	}
	st.cache.wrote(rec, data, n)
	return n, nil
}

// write updates a key of agora_dispatches over rev: with a TTL when the
// value is set to expire, so a late write (a redelivered event) keeps it
// expiring (docs/storage.md, "Retention"). A lost compare-and-set is
// jetstream.ErrKeyExists or jetstream.ErrKeyRevisionMismatch (conflict).
func (st store) write(ctx context.Context, key string, data []byte, rev uint64, expires *time.Time) (uint64, error) {
	if expires == nil {
		return st.kv.Update(ctx, key, data, rev)
	}
	n, err := retention.Update(ctx, st.js, lifecycle.BucketDispatches, key, data, rev, *expires)
	if errors.Is(err, retention.ErrConflict) {
		return 0, jetstream.ErrKeyExists
	}
	return n, err
}

// update applies mutate to a record with compare-and-set, retrying on
// conflict. mutate reports whether it changed anything; when it did not,
// nothing is written.
// It starts from this dispatcher's own copy when it has one (records.go):
// fields of a record only ever go from unset to set, so a stale copy can
// make mutate write too much, never too little, and that write fails the
// compare-and-set and reads again.
func (st store) update(ctx context.Context, id string, mutate func(*record) bool) (record, error) {
	known, rev, err := st.cached(ctx, id)
	if err != nil {
		return known, err
	}
	return st.updateFrom(ctx, known, rev, mutate)
}

// updateFrom is update starting from rec as read at revision rev, which
// saves the read when nobody wrote the record since; rev 0 reads first.
func (st store) updateFrom(ctx context.Context, known record, rev uint64, mutate func(*record) bool) (record, error) {
	id := known.DispatchID
	for range maxCAS {
		rec := known
		if rev == 0 {
			var err error
			if rec, rev, err = st.get(ctx, id); err != nil {
				return rec, err
			}
		}
		if !mutate(&rec) {
			return rec, nil
		}
		rec.UpdatedAt = time.Now().UTC()
		if _, err := st.put(ctx, &rec, rev); err == nil {
			return rec, nil
		} else if !errors.Is(err, errConflict) {
			return rec, err
		}
		rev = 0 // somebody wrote it: read again
	}
	return record{}, fmt.Errorf("dispatcher: update record %s: %d conflicting writers", id, maxCAS)
}

// threadIndex is the value under thread.<thread_id> in agora_dispatches:
// the thread's dispatches in round order.
type threadIndex struct {
	ThreadID   string        `json:"thread_id"`
	Dispatches []threadEntry `json:"dispatches"`
	// ExpiresAt is set when the thread ends (see client.Record.ExpiresAt).
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
}

type threadEntry struct {
	Round      int    `json:"round"`
	DispatchID string `json:"dispatch_id"`
}

// threadPrefix begins the key of every thread index.
const threadPrefix = "thread."

func threadKey(threadID string) string { return threadPrefix + threadID }

// thread reads a thread's index; errNoRecord when there is none. A thread
// of one round has no index (enter): its root, the record under the
// thread's own id, is its only entry.
func (st store) thread(ctx context.Context, threadID string) (threadIndex, error) {
	idx, _, err := st.readThread(ctx, threadID)
	if !errors.Is(err, errNoRecord) {
		return idx, err
	}
	root, _, rerr := st.get(ctx, threadID)
	switch {
	case errors.Is(rerr, errNoRecord):
		return idx, err
	case rerr != nil:
		return threadIndex{}, rerr
	case root.Round != 0 || root.ThreadID != threadID:
		return idx, err // a later round of another thread under this id
	}
	return threadIndex{ThreadID: threadID, Dispatches: []threadEntry{{Round: 0, DispatchID: threadID}}, ExpiresAt: root.ExpiresAt}, nil
}

// readThread reads a thread's index and its revision; errNoRecord when
// there is none.
func (st store) readThread(ctx context.Context, threadID string) (threadIndex, uint64, error) {
	e, err := st.kv.Get(ctx, threadKey(threadID))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return threadIndex{}, 0, fmt.Errorf("%w: thread %s", errNoRecord, threadID)
	}
	if err != nil {
		return threadIndex{}, 0, fmt.Errorf("dispatcher: read thread index %s: %w", threadID, err)
	}
	var idx threadIndex
	if err := json.Unmarshal(e.Value(), &idx); err != nil {
		return threadIndex{}, 0, fmt.Errorf("dispatcher: decode thread index %s: %w", threadID, err)
	}
	return idx, e.Revision(), nil
}

// enter lists a dispatch in its thread's index, as acceptance and the
// projection do, except a root: a root is the first entry of its thread
// (its thread id is its own), so a thread that never gets a second round
// needs no index at all (thread answers it from the root's record). The
// index is written when a later round is entered, listing the root first.
func (st store) enter(ctx context.Context, threadID string, round int, dispatchID string) error {
	if round == 0 && dispatchID == threadID {
		return nil
	}
	return st.index(ctx, threadID, round, dispatchID)
}

// index adds a dispatch to its thread's index, once, with the thread's
// root (the dispatch under the thread's id) listed too.
func (st store) index(ctx context.Context, threadID string, round int, dispatchID string) error {
	return st.indexFrom(ctx, threadID, round, dispatchID, nil)
}

// indexRead is a read of a thread index made ahead of the write.
type indexRead struct {
	e   jetstream.KeyValueEntry
	err error
}

// readIndex reads a thread's index ahead of indexFrom, beside other work.
func (st store) readIndex(ctx context.Context, threadID string) *indexRead {
	e, err := st.kv.Get(ctx, threadKey(threadID))
	return &indexRead{e: e, err: err}
}

// indexFrom is index starting from pre, a read of the index made earlier
// (nil: read it), which saves the read when nobody wrote the index since.
func (st store) indexFrom(ctx context.Context, threadID string, round int, dispatchID string, pre *indexRead) error {
	key := threadKey(threadID)
	// create makes the index with this one dispatch; false when another
	// writer made it first.
	create := func() (bool, error) {
		idx := threadIndex{ThreadID: threadID, Dispatches: []threadEntry{{Round: round, DispatchID: dispatchID}}}
		if dispatchID != threadID {
			// The root, never entered itself (enter). A reader skips an
			// entry without a record, as it skips any other.
			idx.Dispatches = append([]threadEntry{{Round: 0, DispatchID: threadID}}, idx.Dispatches...)
		}
		data, _ := json.Marshal(idx)
		_, err := st.kv.Create(ctx, key, data)
		if conflict(err) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("dispatcher: create thread index %s: %w", threadID, err)
		}
		return true, nil
	}
	if round == 0 {
		// A root starts its thread: the index is most likely new.
		if ok, err := create(); ok || err != nil {
			return err
		}
	}
	for range maxCAS {
		var e jetstream.KeyValueEntry
		var err error
		if pre != nil {
			e, err, pre = pre.e, pre.err, nil
		} else {
			e, err = st.kv.Get(ctx, key)
		}
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			if ok, err := create(); ok || err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("dispatcher: read thread index %s: %w", threadID, err)
		}
		var idx threadIndex
		if err := json.Unmarshal(e.Value(), &idx); err != nil {
			return fmt.Errorf("dispatcher: decode thread index %s: %w", threadID, err)
		}
		if slices.ContainsFunc(idx.Dispatches, func(t threadEntry) bool { return t.DispatchID == dispatchID }) {
			return nil
		}
		idx.Dispatches = append(idx.Dispatches, threadEntry{Round: round, DispatchID: dispatchID})
		idx.ExpiresAt = nil // a new round: the thread goes on
		slices.SortStableFunc(idx.Dispatches, func(a, b threadEntry) int {
			if a.Round != b.Round {
				return a.Round - b.Round
			}
			return strings.Compare(a.DispatchID, b.DispatchID)
		})
		data, _ := json.Marshal(idx)
		if _, err := st.kv.Update(ctx, key, data, e.Revision()); err == nil {
			return nil
		} else if !conflict(err) {
			return fmt.Errorf("dispatcher: update thread index %s: %w", threadID, err)
		}
	}
	return fmt.Errorf("dispatcher: update thread index %s: %d conflicting writers", threadID, maxCAS)
}

// expireIndex writes the thread index again with its TTL; errNoRecord
// when the thread has no index.
func (st store) expireIndex(ctx context.Context, threadID string, expires time.Time) (threadIndex, error) {
	key := threadKey(threadID)
	for range maxCAS {
		idx, rev, err := st.readThread(ctx, threadID)
		if err != nil {
			return threadIndex{}, err
		}
		if idx.ExpiresAt != nil {
			return idx, nil
		}
		idx.ExpiresAt = &expires
		data, _ := json.Marshal(idx)
		if _, err := st.write(ctx, key, data, rev, &expires); err == nil {
			return idx, nil
		} else if !conflict(err) {
			return threadIndex{}, fmt.Errorf("dispatcher: write thread index %s: %w", threadID, err)
		}
	}
	return threadIndex{}, fmt.Errorf("dispatcher: thread index %s: %d conflicting writers", threadID, maxCAS)
}

// expireQuestion writes a closed question record again with its TTL and
// expires_at, which the router keeps on its own later writes. A question
// still asked, or joined to one asked (docs/router.md, "Ask once"), is left
// alone: nothing that waits expires.
func (st store) expireQuestion(ctx context.Context, qid string, expires time.Time) error {
	for range maxCAS {
		e, err := st.questions.Get(ctx, qid)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("dispatcher: read question %s: %w", qid, err)
		}
		var q map[string]json.RawMessage
		if err := json.Unmarshal(e.Value(), &q); err != nil {
			return nil // not a record the router wrote: left alone
		}
		var status string
		_ = json.Unmarshal(q["status"], &status)
		if status == "asked" || status == lifecycle.StatusJoined || string(q["expires_at"]) != "" {
			return nil
		}
		q["expires_at"], _ = json.Marshal(expires)
		data, err := json.Marshal(q)
		if err != nil {
			return fmt.Errorf("dispatcher: encode question %s: %w", qid, err)
		}
		_, err = retention.Update(ctx, st.js, lifecycle.BucketQuestions, qid, data, e.Revision(), expires)
		if err == nil {
			return nil
		}
		if !errors.Is(err, retention.ErrConflict) {
			return fmt.Errorf("dispatcher: write question %s: %w", qid, err)
		}
	}
	return fmt.Errorf("dispatcher: question %s: %d conflicting writers", qid, maxCAS)
}

// unstarted lists, sorted, the dispatch ids whose record was last written
// since `since` as an acceptance still to run, created before
// `createdBefore`: a request, not created ended (refused, over its round
// limit) and not set to expire. These are
// the reconciler's candidates (docs/storage.md, "The dispatch record
// and the reconciler"); it reads their chains. It reads the records
// written since then from the bucket's own stream, not every key: the
// scan is bounded by what changed.
func (st store) unstarted(ctx context.Context, since, createdBefore time.Time) ([]string, error) {
	stream := "KV_" + lifecycle.BucketDispatches
	prefix := "$KV." + lifecycle.BucketDispatches + "."
	// One consumer for the whole pass, fetched from until nothing is
	// pending. No subject filter: the bucket's stream holds only its
	// keys, and nats-server counts a filtered consumer's pending messages
	// over every key when it creates it (127 ms at 200,000 keys, against
	// under 1 ms unfiltered). Not an ordered consumer either: its Fetch
	// makes a new consumer for every batch, each counting again — at
	// 30,000 paused threads, a pass after a busy minute took over a second
	// of the server's CPU.
	cons, err := st.js.CreateConsumer(ctx, stream, jetstream.ConsumerConfig{
		DeliverPolicy:     jetstream.DeliverByStartTimePolicy,
		OptStartTime:      &since,
		AckPolicy:         jetstream.AckNonePolicy,
		MemoryStorage:     true,
		InactiveThreshold: time.Minute, // gone on its own if this pass dies
	})
	if err != nil {
		return nil, err
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = st.js.DeleteConsumer(dctx, stream, cons.CachedInfo().Name)
	}()
	candidates := map[string]bool{}
	for pending := cons.CachedInfo().NumPending; pending > 0; {
		batch, err := cons.Fetch(256, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return nil, err
		}
		n := 0
		for m := range batch.Messages() {
			n++
			key := strings.TrimPrefix(m.Subject(), prefix)
			if md, err := m.Metadata(); err == nil {
				pending = md.NumPending
			}
			if strings.HasPrefix(key, threadPrefix) {
				continue
			}
			// Only what decides: a record is decoded into these fields
			// alone.
			var rec struct {
				DispatchID string         `json:"dispatch_id"`
				Status     lifecycle.Kind `json:"status"`
				Request    *struct{}      `json:"request"`
				CreatedAt  time.Time      `json:"created_at"`
				ExpiresAt  *time.Time     `json:"expires_at"`
			}
			if json.Unmarshal(m.Data(), &rec) == nil && rec.DispatchID == key {
				candidates[key] = rec.Request != nil && !rec.Status.Terminal() && rec.ExpiresAt == nil && rec.CreatedAt.Before(createdBefore)
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) && !errors.Is(err, context.DeadlineExceeded) {
			return nil, err
		}
		if n == 0 {
			break
		}
	}
	var ids []string
	for _, id := range slices.Sorted(maps.Keys(candidates)) {
		if candidates[id] {
			ids = append(ids, id)
		}
	}
	return ids, nil
}
