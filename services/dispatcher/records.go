package dispatcher

import "sync"

// The records a dispatcher keeps: at most this many, of at most this many
// bytes in all; a record larger than maxCachedRecord is read when needed.
const (
	recordCacheSize  = 8192
	recordCacheBytes = 32 << 20
	maxCachedRecord  = 64 << 10
)

// recordCache is the store's copy (store.go) of the dispatches this
// dispatcher wrote last: the record as written and its revision, so that
// the status projection applies an event to it and writes with
// compare-and-set at that revision without reading it first
// (docs/storage.md, "The dispatch record and the reconciler"). It is
// only ever a guess: a record someone else wrote since (another
// dispatcher, a cancel) fails the compare-and-set, the entry is forgotten
// and the writer reads it again. A dispatch's entry goes when its terminal
// event is applied; beyond that, the older of two generations is dropped
// when the newer fills.
type recordCache struct {
	mu            sync.Mutex
	cur, old      map[string]cachedRecord
	curBytes      int
	max, maxBytes int
}

type cachedRecord struct {
	data []byte
	rev  uint64
}

func newRecordCache(max, maxBytes int) *recordCache {
	return &recordCache{cur: map[string]cachedRecord{}, old: map[string]cachedRecord{}, max: max, maxBytes: maxBytes}
}

// wrote notes that rec was written as data at rev: kept while the
// dispatch goes on, forgotten once it ended (nothing applies to it
// again but the retention's writes, which read it).
func (c *recordCache) wrote(rec *record, data []byte, rev uint64) {
	if rec.Terminal() || rec.ExpiresAt != nil || len(data) > maxCachedRecord {
		c.drop(rec.DispatchID)
		return
	}
	c.put(rec.DispatchID, data, rev)
}

// put notes that id was written as data at rev; an older revision than
// the one kept (two writers finishing out of order) changes nothing.
func (c *recordCache) put(id string, data []byte, rev uint64) {
	if c == nil || rev == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.get(id); ok && e.rev >= rev {
		return
	}
	if e, ok := c.cur[id]; ok {
		c.curBytes -= len(e.data)
	}
	delete(c.old, id)
	if len(c.cur) >= c.max/2 || c.curBytes+len(data) > c.maxBytes/2 {
		c.old, c.cur, c.curBytes = c.cur, map[string]cachedRecord{}, 0
	}
	c.cur[id] = cachedRecord{data: data, rev: rev}
	c.curBytes += len(data)
}

func (c *recordCache) get(id string) (cachedRecord, bool) {
	if e, ok := c.cur[id]; ok {
		return e, true
	}
	e, ok := c.old[id]
	return e, ok
}

// drop forgets id.
func (c *recordCache) drop(id string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	if e, ok := c.cur[id]; ok {
		c.curBytes -= len(e.data)
		delete(c.cur, id)
	}
	delete(c.old, id)
	// A map keeps the table of the most it ever held: once every
	// dispatch has ended, start again from empty ones.
	if len(c.cur) == 0 && len(c.old) == 0 {
		c.cur, c.old, c.curBytes = map[string]cachedRecord{}, map[string]cachedRecord{}, 0
	}
	c.mu.Unlock()
}

// len is how many records are kept.
func (c *recordCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.cur) + len(c.old)
}
