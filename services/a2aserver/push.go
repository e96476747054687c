package a2aserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2asrv/push"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/egress"
	"github.com/agora-dispatch/agora/internal/hook"
	"github.com/agora-dispatch/agora/internal/principal"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/consume"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// Push notifications (docs/a2a.md, "Push notifications"): a2a-go serves
// the protocol's config methods on pushStore, which keeps each task's
// configs in the KV bucket agora_a2a under push.<task id>, with the
// principal that owns the task. Delivery does not ride on a2a-go's
// executions (none follows a task answered through the inbox): the
// durable consumer pushDurable reads every lifecycle event, and each one
// of a task with configs is POSTed to each of them, signed as the webhook
// notifier signs (internal/hook), with the event's id as X-Agora-Event-Id.

// pushDurable is the lifecycle consumer every A2A server process shares:
// each event is delivered by one of them.
const pushDurable = "a2a-push"

// pushAckWait is pushDurable's AckWait; a delivery that retries is kept
// alive with in-progress acknowledgements.
const pushAckWait = 30 * time.Second

// maxPushConfigs bounds the configs of one task.
const maxPushConfigs = 10

// pushRecord is a task's entry in the bucket.
type pushRecord struct {
	// Owner is the principal that owns the task, and so its configs.
	Owner   string            `json:"owner"`
	Configs []*a2a.PushConfig `json:"configs"`
}

// pushStore is a2a-go's push.ConfigStore over the bucket. Every method
// acts for the principal in ctx: only the task's owner (or an admin)
// reads or changes its configs. Its methods are safe for concurrent use.
type pushStore struct{ s *Service }

var _ push.ConfigStore = pushStore{}

// noSender is the push.Sender a2a-go is given: delivery is the lifecycle
// consumer's (deliverPush), for every event of the task, so a2a-go's
// executions send nothing of their own.
type noSender struct{}

func (noSender) SendPush(context.Context, *a2a.PushConfig, a2a.Event) error { return nil }

// bucket is the A2A server's KV bucket.
func (s *Service) bucket(ctx context.Context) (jetstream.KeyValue, error) {
	js, err := jetstream.New(s.c.Conn())
	if err != nil {
		return nil, fmt.Errorf("a2aserver: jetstream: %w", err)
	}
	kv, err := js.KeyValue(ctx, lifecycle.BucketA2A)
	if err != nil {
		return nil, fmt.Errorf("a2aserver: bucket %s (is JetStream provisioned?): %w", lifecycle.BucketA2A, err)
	}
	return kv, nil
}

// owner checks that who may manage the push configs of task id and
// returns the owner's name. A task being started by who's message (its
// thread not dispatched yet) is who's.
func (ps pushStore) owner(ctx context.Context, id a2a.TaskID) (*principal.Principal, string, error) {
	who := principalOf(ctx)
	if who == nil {
		return nil, "", a2a.ErrUnauthenticated
	}
	if _, starting := ctx.Value(planKey{}).(plan); starting {
		return who, who.Name, nil
	}
	th, err := ps.s.thread(ctx, who, string(id))
	if err != nil {
		return nil, "", err
	}
	owner := th.Rounds[0].Principal
	if !who.MayCancel(owner) {
		return nil, "", a2a.NewError(a2a.ErrUnauthorized, fmt.Sprintf("principal %s may see task %s but not its push notification configs: only the principal that started it or an admin may", who.Name, id))
	}
	return who, owner, nil
}

// pushKey is the key of task id's configs.
func pushKey(id a2a.TaskID) string { return "push." + string(id) }

// read is the record of task id, with its revision (0: none).
func (ps pushStore) read(ctx context.Context, kv jetstream.KeyValue, id a2a.TaskID) (pushRecord, uint64, error) {
	e, err := kv.Get(ctx, pushKey(id))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return pushRecord{}, 0, nil
	}
	if err != nil {
		return pushRecord{}, 0, unavailable(err)
	}
	var r pushRecord
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		return pushRecord{}, 0, unavailable(fmt.Errorf("push record of %s: %w", id, err))
	}
	return r, e.Revision(), nil
}

// change applies f to task id's record with compare-and-set, again on a
// concurrent write; a record f leaves without configs is deleted.
func (ps pushStore) change(ctx context.Context, id a2a.TaskID, owner string, f func(*pushRecord) error) error {
	kv, err := ps.s.bucket(ctx)
	if err != nil {
		return unavailable(err)
	}
	for range 10 {
		r, rev, err := ps.read(ctx, kv, id)
		if err != nil {
			return err
		}
		if r.Owner == "" {
			r.Owner = owner
		}
		if err := f(&r); err != nil {
			return err
		}
		switch {
		case len(r.Configs) == 0 && rev == 0:
			return nil
		case len(r.Configs) == 0:
			err = kv.Delete(ctx, pushKey(id), jetstream.LastRevision(rev))
		default:
			b, merr := json.Marshal(r)
			if merr != nil {
				return unavailable(merr)
			}
			if rev == 0 {
				_, err = kv.Create(ctx, pushKey(id), b)
			} else {
				_, err = kv.Update(ctx, pushKey(id), b, rev)
			}
		}
		if err == nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !strings.Contains(err.Error(), "wrong last sequence") {
			return unavailable(err)
		}
	}
	return a2a.NewError(a2a.ErrInternalError, "the push notification configs of task "+string(id)+" kept changing: try again")
}

// Save implements push.ConfigStore: it checks the URL (docs/a2a.md) and
// adds or replaces the config with its id (one is made when it has none).
func (ps pushStore) Save(ctx context.Context, id a2a.TaskID, c *a2a.PushConfig) (*a2a.PushConfig, error) {
	if !ps.s.pushOn() {
		return nil, a2a.ErrPushNotificationNotSupported
	}
	if c == nil {
		return nil, invalid("a push notification config is required")
	}
	_, owner, err := ps.owner(ctx, id)
	if err != nil {
		return nil, err
	}
	if err := ps.s.checkPushURL(ctx, c.URL); err != nil {
		return nil, err
	}
	saved := *c
	saved.TaskID = id
	if saved.ID == "" {
		saved.ID = newConfigID()
	}
	if len(saved.ID) > 128 || len(saved.Token) > 1024 {
		return nil, invalid("a push notification config's id is at most 128 bytes, its token at most 1024")
	}
	err = ps.change(ctx, id, owner, func(r *pushRecord) error {
		for i, old := range r.Configs {
			if old.ID == saved.ID {
				r.Configs[i] = &saved
				return nil
			}
		}
		if len(r.Configs) >= maxPushConfigs {
			return invalid("task %s has %d push notification configs already: delete one first", id, maxPushConfigs)
		}
		r.Configs = append(r.Configs, &saved)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &saved, nil
}

// Get implements push.ConfigStore.
func (ps pushStore) Get(ctx context.Context, id a2a.TaskID, configID string) (*a2a.PushConfig, error) {
	configs, err := ps.List(ctx, id)
	if err != nil {
		return nil, err
	}
	for _, c := range configs {
		if c.ID == configID {
			return c, nil
		}
	}
	return nil, fmt.Errorf("%w: task %s has no push notification config %q: %w", a2a.ErrInvalidParams, id, configID, push.ErrPushConfigNotFound)
}

// List implements push.ConfigStore.
func (ps pushStore) List(ctx context.Context, id a2a.TaskID) ([]*a2a.PushConfig, error) {
	if !ps.s.pushOn() {
		return nil, a2a.ErrPushNotificationNotSupported
	}
	if _, _, err := ps.owner(ctx, id); err != nil {
		return nil, err
	}
	kv, err := ps.s.bucket(ctx)
	if err != nil {
		return nil, unavailable(err)
	}
	r, _, err := ps.read(ctx, kv, id)
	return r.Configs, err
}

// Delete implements push.ConfigStore; deleting one that is not there is
// no error.
func (ps pushStore) Delete(ctx context.Context, id a2a.TaskID, configID string) error {
	_, owner, err := ps.owner(ctx, id)
	if err != nil {
		return err
	}
	return ps.change(ctx, id, owner, func(r *pushRecord) error {
		kept := r.Configs[:0]
		for _, c := range r.Configs {
			if c.ID != configID {
				kept = append(kept, c)
			}
		}
		r.Configs = kept
		return nil
	})
}

// DeleteAll implements push.ConfigStore.
func (ps pushStore) DeleteAll(ctx context.Context, id a2a.TaskID) error {
	_, owner, err := ps.owner(ctx, id)
	if err != nil {
		return err
	}
	return ps.change(ctx, id, owner, func(r *pushRecord) error { r.Configs = nil; return nil })
}

func newConfigID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// pushOn reports whether push notifications are offered: a secret to
// sign them is set.
func (s *Service) pushOn() bool { return s.cfg.PushSecret != "" }

// checkPushURL refuses a URL push notifications may not go to: one that
// is not http(s), or whose host resolves to a loopback, private,
// link-local or otherwise reserved address (egress.Refused), unless
// PushAllowPrivate. The dialer checks the address again on every POST.
func (s *Service) checkPushURL(ctx context.Context, raw string) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" || u.User != nil {
		return invalid("push notification url %q: want an http or https URL without credentials", raw)
	}
	if s.cfg.PushAllowPrivate {
		return nil
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupNetIP(rctx, "ip", u.Hostname())
	if err != nil {
		return invalid("push notification url %q: its host does not resolve (%v)", raw, err)
	}
	for _, a := range addrs {
		if why := egress.Refused(a); why != "" {
			return invalid("push notification url %q: %s resolves to %s, a %s address; push notifications go only to public addresses (the operator may allow others with AGORA_A2A_PUSH_ALLOW_PRIVATE)", raw, u.Hostname(), a, why)
		}
	}
	return nil
}

// pushClient is the HTTP client of every POST: no redirects, and a dialer
// that refuses every address checkPushURL refuses, at the moment it
// connects (a DNS answer that changed since the check does not help).
func (s *Service) pushClient() *http.Client {
	d := &net.Dialer{Timeout: 10 * time.Second}
	if !s.cfg.PushAllowPrivate {
		d.Control = func(_, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return fmt.Errorf("a2aserver: push: %w", err)
			}
			if why := egress.Refused(ap.Addr()); why != "" {
				return fmt.Errorf("a2aserver: push: %s is a %s address: refused (AGORA_A2A_PUSH_ALLOW_PRIVATE)", ap.Addr(), why)
			}
			return nil
		}
	}
	tr := &http.Transport{DialContext: d.DialContext, Proxy: nil, ForceAttemptHTTP2: true,
		TLSHandshakeTimeout: 10 * time.Second, MaxIdleConns: 16, IdleConnTimeout: time.Minute}
	return hook.NoRedirects(&http.Client{Transport: tr}, s.cfg.PushTimeout)
}

// runPush delivers push notifications until ctx ends, through the durable
// consumer every A2A server shares. ready is closed once it consumes.
func (s *Service) runPush(ctx context.Context, ready func()) error {
	js, err := jetstream.New(s.c.Conn())
	if err != nil {
		return fmt.Errorf("a2aserver: jetstream: %w", err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, lifecycle.StreamLifecycle, jetstream.ConsumerConfig{
		Durable:       pushDurable,
		Description:   "A2A push notifications (docs/a2a.md)",
		FilterSubject: lifecycle.LifecycleFilter("", "", ""),
		DeliverPolicy: jetstream.DeliverNewPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       pushAckWait,
		MaxAckPending: 64,
		// An event whose task cannot be read keeps being retried for a
		// while, never for ever.
		MaxDeliver: 30,
	})
	if err != nil {
		return fmt.Errorf("a2aserver: consumer %s on %s: %w", pushDurable, lifecycle.StreamLifecycle, err)
	}
	ready()
	hc := s.pushClient()
	log := s.log.With("consumer", pushDurable)
	return consume.Run(ctx, cons, func(ctx context.Context, m jetstream.Msg) consume.Verdict {
		return s.pushEvent(ctx, hc, m, log)
	}, consume.Options{PullExpiry: 2 * time.Second, KeepAlive: consume.KeepAliveEvery(pushAckWait), ShutdownTimeout: -1, Logger: log})
}

// pushEvent POSTs one lifecycle event to every config of its task; its
// verdict settles the message.
func (s *Service) pushEvent(ctx context.Context, hc *http.Client, m jetstream.Msg, log *slog.Logger) consume.Verdict {
	e, err := lifecycle.DecodeMsg(m)
	if err != nil {
		return consume.Ack() // not an event of Agora's vocabulary: nothing to push
	}
	d, err := lifecycle.Parse(e)
	if err != nil {
		return consume.Ack()
	}
	l, ok := d.(lifecycle.Lifecycle)
	if !ok {
		return consume.Ack()
	}
	c := l.Base()
	kv, err := s.bucket(ctx)
	if err != nil {
		log.Warn("a2a push: bucket", "err", err)
		return consume.Nak(2 * time.Second)
	}
	rec, _, err := pushStore{s}.read(ctx, kv, a2a.TaskID(c.ThreadID))
	if err != nil {
		return consume.Nak(time.Second)
	}
	if len(rec.Configs) == 0 {
		return consume.Ack()
	}
	th, err := s.c.Thread(ctx, c.ThreadID)
	switch {
	case errors.Is(err, client.ErrNotFound):
		return consume.Ack() // its records expired: nothing to tell
	case err != nil || len(th.Rounds) == 0:
		return consume.Nak(time.Second)
	}
	ev := pushedEvent(a2a.TaskInfo{TaskID: a2a.TaskID(c.ThreadID), ContextID: contextOf(th)}, l)
	if ev == nil {
		return consume.Ack()
	}
	body, err := json.Marshal(a2a.StreamResponse{Event: ev})
	if err != nil {
		log.Error("a2a push: body", "thread_id", c.ThreadID, "err", err)
		return consume.Ack()
	}
	for _, pc := range rec.Configs {
		if !s.deliver(ctx, hc, pc, e.ID(), body, log.With("thread_id", c.ThreadID, "config_id", pc.ID, "event_id", e.ID())) {
			return consume.Nak(time.Second)
		}
	}
	return consume.DoubleAck()
}

// deliver POSTs body to pc until it takes it, refuses it for good, or the
// attempts run out (then it is logged and dropped). It is false when ctx
// ended first.
func (s *Service) deliver(ctx context.Context, hc *http.Client, pc *a2a.PushConfig, eventID string, body []byte, log *slog.Logger) bool {
	h := http.Header{"User-Agent": {"agora-a2a"}}
	if pc.Token != "" {
		h.Set("A2A-Notification-Token", pc.Token)
	}
	if pc.Auth != nil && pc.Auth.Credentials != "" {
		switch strings.ToLower(pc.Auth.Scheme) {
		case "bearer":
			h.Set("Authorization", "Bearer "+pc.Auth.Credentials)
		case "basic":
			h.Set("Authorization", "Basic "+pc.Auth.Credentials)
		}
	}
	for attempt := 1; ; attempt++ {
		retryAfter, permanent, err := hook.Post(ctx, hc, hook.Request{URL: pc.URL, Secret: s.cfg.PushSecret, EventID: eventID, Body: body, Header: h})
		if err == nil {
			log.Debug("a2a push delivered", "attempt", attempt)
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		if permanent || attempt >= s.cfg.PushAttempts {
			log.Warn("a2a push not delivered: dropped", "attempt", attempt, "err", err)
			return true
		}
		wait := hook.Backoff(s.cfg.PushBackoff, attempt)
		if retryAfter > 0 {
			wait = retryAfter
		}
		log.Info("a2a push failed; retrying", "attempt", attempt, "retry_in", wait, "err", err)
		if !hook.Sleep(ctx, wait) {
			return false
		}
	}
}

// pushedEvent is what a lifecycle event of a task is pushed as: a status
// update (submitted, working, input-required with the question, failed,
// canceled), or the completed task with its output artifact; nil for one
// that is not pushed.
func pushedEvent(info a2a.TaskInfo, l lifecycle.Lifecycle) a2a.Event {
	c := l.Base()
	st := func(state a2a.TaskState, msg *a2a.Message) a2a.Event {
		ev := a2a.NewStatusUpdateEvent(info, state, msg)
		ev.Status.Timestamp = eventTime()
		ev.Metadata = map[string]any{metaRound: c.Round}
		return ev
	}
	switch d := l.(type) {
	case *lifecycle.Accepted:
		if c.Round == 0 {
			return st(a2a.TaskStateSubmitted, nil)
		}
		return st(a2a.TaskStateWorking, nil)
	case *lifecycle.Started:
		return st(a2a.TaskStateWorking, nil)
	case *lifecycle.NeedsInput:
		q := lifecycle.Question{Common: d.Common, QuestionID: d.QuestionID, Status: "asked", Question: d.Question,
			Options: d.Options, Context: d.Context, Kind: d.Kind}
		return st(a2a.TaskStateInputRequired, questionMessage(info, q))
	case *lifecycle.Finished:
		t := &a2a.Task{ID: info.TaskID, ContextID: info.ContextID,
			Status:    a2a.TaskStatus{State: a2a.TaskStateCompleted, Timestamp: eventTime()},
			Artifacts: []*a2a.Artifact{outputArtifact(d.DispatchID, d.Output)},
			Metadata:  map[string]any{metaThreadID: c.ThreadID, metaRound: c.Round, metaSkill: c.Subagent}}
		return t
	case *lifecycle.Failed:
		return st(a2a.TaskStateFailed, endMessage(info, "end-"+d.DispatchID, failedText(d.Reason, d.Detail)))
	case *lifecycle.Cancelled:
		return st(a2a.TaskStateCanceled, endMessage(info, "end-"+d.DispatchID, cancelledText(d.By, d.Reason)))
	}
	return nil
}
