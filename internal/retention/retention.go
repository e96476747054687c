// Package retention keeps finished work readable for a while and then
// lets JetStream forget it (docs/storage.md, "Retention"): a record that
// closes is written again with a per-message TTL (nats-server 2.11+
// message TTLs, enabled on the buckets by their LimitMarkerTTL), so the
// server removes it after the retention without any sweeper; a record
// still in use is written without one and never expires.
package retention

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/jserr"
)

// Default is AGORA_RETENTION's default: how long finished work stays
// readable.
const Default = 7 * 24 * time.Hour

// ErrConflict reports that the key changed since the revision given: the
// caller reads it again.
var ErrConflict = errors.New("retention: the record changed concurrently")

// TTL returns the time from now until at, at least one second (the
// buckets' smallest TTL).
func TTL(at time.Time) time.Duration {
	return max(time.Until(at), time.Second)
}

// Update writes value at key of bucket over revision rev, to expire at
// expires. It is KeyValue.Update with a TTL, which the KV API offers only
// on Create: the same publish on $KV.<bucket>.<key>, with the expected
// last subject sequence and a Nats-TTL header. In a bucket that keeps
// history it also rolls the key's history up into this one value, so that
// when it expires no older revision is left to reappear. A bucket of one
// revision per key needs no roll-up (the write replaces the old one), and
// gets none: nats-server answers any purge, a roll-up's included, by
// recounting the pending messages of every consumer on the bucket over
// all its keys, in the bucket's write path.
func Update(ctx context.Context, js jetstream.JetStream, bucket, key string, value []byte, rev uint64, expires time.Time) (uint64, error) {
	m := &nats.Msg{Subject: "$KV." + bucket + "." + key, Header: nats.Header{}, Data: value}
	if keepsHistory(ctx, js, bucket) {
		m.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
	}
	ack, err := js.PublishMsg(ctx, m, jetstream.WithExpectLastSequencePerSubject(rev), jetstream.WithMsgTTL(TTL(expires)))
	if err != nil {
		if jserr.WrongLastSequence(err) {
			return 0, ErrConflict
		}
		return 0, err
	}
	return ack.Sequence, nil
}

// histories caches each bucket's history setting (revisions per key), read
// once per JetStream context and bucket: provisioning only ever lowers it
// (docs/storage.md, "Provisioning").
var histories sync.Map // historyKey → int64

type historyKey struct {
	js     jetstream.JetStream
	bucket string
}

// keepsHistory reports whether bucket keeps more than one revision per
// key; when its status cannot be read, it assumes so (a roll-up is always
// correct, only slower).
func keepsHistory(ctx context.Context, js jetstream.JetStream, bucket string) bool {
	k := historyKey{js, bucket}
	if h, ok := histories.Load(k); ok {
		return h.(int64) > 1
	}
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		return true
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return true
	}
	histories.Store(k, st.History())
	return st.History() > 1
}
