// Package kvsnap reads the current value of every key of a JetStream
// key-value bucket once: a listing, where a watch is a feed.
//
// A KV watch marks the end of the stored values with a nil entry, sent
// when a delivered value reports nothing pending for its consumer. That
// count is a running one: while another writer replaces a key stored
// before the watch began, a value can report nothing pending before the
// replacement is counted, so the marker comes early and a listing that
// stops there leaves out a key that existed all along (a question record
// rewritten when its thread ends, say). Read does not count: it walks the
// bucket's stream in sequence order with batched direct gets
// (next_by_subj, ADR-31), each answered from the store as it is then,
// until the server says no message is left. A key stored before the call
// is therefore read in that value or, if it was replaced before the walk
// reached it, in the newer one, which lies further on.
package kvsnap

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Entry is one key's value.
type Entry struct {
	Key      string
	Value    []byte
	Revision uint64
	Created  time.Time
}

// ErrNoStream is Read's error when no stream answers the bucket's direct
// gets: the bucket does not exist (or does not allow direct gets).
var ErrNoStream = errors.New("no stream answers its direct gets: does the bucket exist, with allow_direct?")

// batch is how many messages one direct get asks for.
const batch = 256

// Read returns the value of every key of bucket that matches keys (a KV
// key filter, ">" for all) and is not deleted, in revision order. Each
// message of the answer must come within the connection's request
// timeout of the one before (a request the server lost, restarting, is
// not waited on until ctx ends), and all of it within ctx. The
// bucket's stream must allow direct gets (nats.go makes KV buckets so);
// the caller needs the grant $JS.API.DIRECT.GET.KV_<bucket>.
func Read(ctx context.Context, js jetstream.JetStream, bucket, keys string) ([]Entry, error) {
	nc := js.Conn()
	subject := apiPrefix(js) + "DIRECT.GET.KV_" + bucket
	prefix := "$KV." + bucket + "."
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, fmt.Errorf("kvsnap: read %s: %w", bucket, err)
	}
	defer func() { _ = sub.Unsubscribe() }()

	latest := map[string]Entry{}
	for seq := uint64(1); ; {
		next, done, err := page(ctx, nc, sub, subject, inbox, prefix, keys, seq, func(key string, e *Entry) {
			if e == nil {
				delete(latest, key)
			} else {
				latest[key] = *e
			}
		})
		if err != nil {
			return nil, fmt.Errorf("kvsnap: read %s: %w", bucket, err)
		}
		if done {
			break
		}
		seq = next
	}
	out := slices.Collect(maps.Values(latest))
	slices.SortFunc(out, func(a, b Entry) int { return cmp.Compare(a.Revision, b.Revision) })
	return out, nil
}

// page asks for the messages from seq on whose key (after prefix) matches
// keys, and passes each to put: the entry, or nil for a delete or purge
// marker. It returns the sequence to ask from next, or done when the
// server says no message is left.
func page(ctx context.Context, nc *nats.Conn, sub *nats.Subscription, subject, inbox, prefix, keys string, seq uint64, put func(string, *Entry)) (next uint64, done bool, err error) {
	req, err := json.Marshal(struct {
		Seq        uint64 `json:"seq"`
		NextBySubj string `json:"next_by_subj"`
		Batch      int    `json:"batch"`
	}{seq, prefix + keys, batch})
	if err != nil {
		return 0, false, err
	}
	if err := nc.PublishRequest(subject, inbox, req); err != nil {
		return 0, false, err
	}
	next = seq
	for {
		m, err := nextMsg(ctx, sub, nc.Opts.Timeout)
		if errors.Is(err, nats.ErrNoResponders) {
			return 0, false, ErrNoStream
		}
		if err != nil {
			return 0, false, fmt.Errorf("no complete answer to a direct get (is $JS.API.DIRECT.GET.<stream> granted?): %w", err)
		}
		if len(m.Data) == 0 && m.Header.Get("Status") != "" {
			switch status := m.Header.Get("Status"); status {
			case "204": // the end of this batch
				if n := m.Header.Get("Nats-Num-Pending"); n == "" || n == "0" {
					return 0, true, nil
				}
				return next, false, nil
			case "404": // nothing from seq on
				return 0, true, nil
			case "503":
				return 0, false, ErrNoStream
			default:
				return 0, false, fmt.Errorf("status %s %s", status, m.Header.Get("Description"))
			}
		}
		s, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
		if err != nil {
			return 0, false, fmt.Errorf("a message without its sequence")
		}
		next = s + 1
		key := strings.TrimPrefix(m.Header.Get(jetstream.SubjectHeader), prefix)
		if deleted(m.Header) {
			put(key, nil)
			continue
		}
		var created time.Time
		if ts := m.Header.Get(jetstream.TimeStampHeaer); ts != "" {
			created, _ = time.Parse(time.RFC3339Nano, ts)
		}
		put(key, &Entry{Key: key, Value: m.Data, Revision: s, Created: created})
	}
}

// nextMsg waits for sub's next message for at most idle, and not past ctx.
func nextMsg(ctx context.Context, sub *nats.Subscription, idle time.Duration) (*nats.Msg, error) {
	ctx, cancel := context.WithTimeout(ctx, idle)
	defer cancel()
	return sub.NextMsgWithContext(ctx)
}

// deleted reports a KV delete or purge marker, or a limit's marker.
func deleted(h nats.Header) bool {
	switch h.Get("KV-Operation") {
	case "DEL", "PURGE":
		return true
	}
	return h.Get(jetstream.MarkerReasonHeader) != ""
}

// apiPrefix is js's JetStream API subject prefix, with its trailing dot.
func apiPrefix(js jetstream.JetStream) string {
	o := js.Options()
	switch {
	case o.APIPrefix != "":
		return strings.TrimSuffix(o.APIPrefix, ".") + "."
	case o.Domain != "":
		return "$JS." + o.Domain + ".API."
	}
	return "$JS.API."
}
