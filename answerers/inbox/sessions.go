package inbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// Sessions live in the KV bucket agora_inbox_sessions, so a restart or a
// second replica keeps people signed in (docs/inbox.md). The key is the
// SHA-256 of the token (a reader of the bucket cannot sign in with it),
// the value who signed in, the CSRF token and the expiry; each key
// carries its session's TTL, so the server deletes it when it ends. Every
// replica watches the bucket: signing out deletes the key, and each
// replica then ends that session at once, its open live streams too.

// sessionRecord is a session's value in the bucket.
type sessionRecord struct {
	User    string    `json:"user"`
	CSRF    string    `json:"csrf"`
	Created time.Time `json:"created"`
	Expires time.Time `json:"expires"`
}

// session is one sign-in.
type session struct {
	user    string // the name; looked up in the users file on each use
	csrf    string
	expires time.Time
	ended   atomic.Bool   // signed out
	done    chan struct{} // closed when signed out
}

// valid reports whether the session may still be used; live streams check
// it, so signing out ends them too.
func (s *session) valid() bool { return !s.ended.Load() && time.Now().Before(s.expires) }

func (s *session) end() {
	if s.ended.CompareAndSwap(false, true) {
		close(s.done)
	}
}

// errNotStarted is returned before Run has opened the bucket.
var errNotStarted = errors.New("inbox: the sessions bucket is not open yet (the inbox is starting)")

// sessions is the view of the sessions bucket this replica keeps.
type sessions struct {
	ttl   time.Duration
	log   *slog.Logger
	ready chan struct{} // closed when kv is set
	kv    jetstream.KeyValue

	mu sync.Mutex
	m  map[string]*session // by key (the token's hash)
}

func newSessions(ttl time.Duration, log *slog.Logger) *sessions {
	return &sessions{ttl: ttl, log: log, ready: make(chan struct{}), m: map[string]*session{}}
}

// sessionKey is a token's key in the bucket.
func sessionKey(token string) string {
	h := sha256.Sum256([]byte(token))
	return hex.EncodeToString(h[:])
}

// open sets the bucket; Run calls it once.
func (ss *sessions) open(kv jetstream.KeyValue) {
	ss.kv = kv
	close(ss.ready)
}

// bucket waits (up to readyWait) for Run to open the bucket.
func (ss *sessions) bucket(ctx context.Context) (jetstream.KeyValue, error) {
	select {
	case <-ss.ready:
		return ss.kv, nil
	default:
	}
	t := time.NewTimer(readyWait)
	defer t.Stop()
	select {
	case <-ss.ready:
		return ss.kv, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-t.C:
		return nil, errNotStarted
	}
}

// create signs name in: a new token whose session is stored in the
// bucket before it is handed out.
func (ss *sessions) create(ctx context.Context, name string) (string, *session, error) {
	kv, err := ss.bucket(ctx)
	if err != nil {
		return "", nil, err
	}
	token := randomToken()
	now := time.Now()
	rec := sessionRecord{User: name, CSRF: randomToken(), Created: now.UTC(), Expires: now.Add(ss.ttl).UTC()}
	b, _ := json.Marshal(rec)
	key := sessionKey(token)
	if _, err := kv.Create(ctx, key, b, jetstream.KeyTTL(ss.ttl)); err != nil {
		return "", nil, fmt.Errorf("inbox: store the session in %s: %w", lifecycle.BucketInboxSessions, err)
	}
	sess := ss.put(key, rec)
	return token, sess, nil
}

// put adds (or returns the existing) session of a record.
func (ss *sessions) put(key string, rec sessionRecord) *session {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if old, ok := ss.m[key]; ok {
		return old
	}
	sess := &session{user: rec.User, csrf: rec.CSRF, expires: rec.Expires, done: make(chan struct{})}
	ss.m[key] = sess
	return sess
}

// lookup finds the session of token: in this replica's view, or (signed
// in a moment ago on another replica, before the watch brought it) in the
// bucket.
func (ss *sessions) lookup(ctx context.Context, token string) (*session, bool) {
	if token == "" {
		return nil, false
	}
	key := sessionKey(token)
	ss.mu.Lock()
	sess, ok := ss.m[key]
	ss.mu.Unlock()
	if ok {
		if !sess.valid() {
			ss.drop(key)
			return nil, false
		}
		return sess, true
	}
	kv, err := ss.bucket(ctx)
	if err != nil {
		return nil, false
	}
	gctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	e, err := kv.Get(gctx, key)
	if err != nil {
		if !errors.Is(err, jetstream.ErrKeyNotFound) {
			ss.log.Warn("session lookup failed", "err", err)
		}
		return nil, false
	}
	var rec sessionRecord
	if json.Unmarshal(e.Value(), &rec) != nil || rec.User == "" || !time.Now().Before(rec.Expires) {
		return nil, false
	}
	return ss.put(key, rec), true
}

// drop ends and forgets the session of key in this replica.
func (ss *sessions) drop(key string) {
	ss.mu.Lock()
	sess, ok := ss.m[key]
	delete(ss.m, key)
	ss.mu.Unlock()
	if ok {
		sess.end()
	}
}

// delete signs token out everywhere: its key is purged from the bucket
// (every replica's watch then ends it) and it ends here at once. The
// purge's marker lasts as long as a session could have, then goes: a
// sign-out leaves nothing in the bucket for good.
func (ss *sessions) delete(ctx context.Context, token string) error {
	key := sessionKey(token)
	ss.drop(key)
	kv, err := ss.bucket(ctx)
	if err != nil {
		return err
	}
	if err := kv.Purge(ctx, key, jetstream.PurgeTTL(max(ss.ttl, time.Second))); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("inbox: delete the session from %s: %w", lifecycle.BucketInboxSessions, err)
	}
	return nil
}

// count is the number of sessions this replica knows.
func (ss *sessions) count() int {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return len(ss.m)
}

// watch keeps this replica's view current until ctx ends, restarting the
// watch when it breaks: a new session elsewhere is added, a deleted or
// expired one ends here (and its live streams with it).
func (ss *sessions) watch(ctx context.Context) {
	backoff := 500 * time.Millisecond
	for ctx.Err() == nil {
		err := ss.watchOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		ss.log.Warn("the watch of the sessions bucket broke; restarting it", "err", err, "retry_in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

// watchOnce runs one watch of the sessions bucket until ctx ends or the
// watch breaks; after the initial load it forgets the sessions the load
// did not show (forgetGone).
func (ss *sessions) watchOnce(ctx context.Context) error {
	return watchBucket(ctx, ss.kv, func(e jetstream.KeyValueEntry) {
		if e.Operation() != jetstream.KeyValuePut {
			// deleted (signed out) or purged, or expired (TTL marker)
			ss.drop(e.Key())
			return
		}
		var rec sessionRecord
		if json.Unmarshal(e.Value(), &rec) == nil && rec.User != "" && time.Now().Before(rec.Expires) {
			ss.put(e.Key(), rec)
		}
	}, func(seen map[string]bool) { ss.forgetGone(ctx, seen) })
}

// forgetGone ends the sessions this replica knows that the initial load
// of a (re)started watch did not show, once the bucket confirms they are
// gone (one signed in meanwhile may not have been in the load).
func (ss *sessions) forgetGone(ctx context.Context, seen map[string]bool) {
	ss.mu.Lock()
	var maybe []string
	for k := range ss.m {
		if !seen[k] {
			maybe = append(maybe, k)
		}
	}
	ss.mu.Unlock()
	for _, k := range maybe {
		if _, err := ss.kv.Get(ctx, k); errors.Is(err, jetstream.ErrKeyNotFound) {
			ss.drop(k)
		}
	}
}
