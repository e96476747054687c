// Package provision creates Agora's streams, consumers, key-value buckets and
// object store (docs/storage.md, "Provisioning"). Ensure is idempotent: run
// against a server that already has them with the same settings, it changes
// nothing.
package provision

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/retention"
	"github.com/agora-dispatch/agora/pkg/audit"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// Config tunes provisioning. The zero value gives single-node defaults.
type Config struct {
	Replicas int  // stream, bucket and consumer replicas; default 1
	Memory   bool // memory storage instead of files (agora dev --memory)

	// WorkAckWait is the workers consumer's AckWait: how long a crashed
	// worker's delivery waits before redelivery. Default 30s.
	WorkAckWait time.Duration
	// WorkMaxDeliver bounds deliveries of one dispatch. Default 5.
	WorkMaxDeliver int
	// Retention is how long finished work stays readable
	// (AGORA_RETENTION; docs/storage.md, "Retention"). Default 7 days.
	// It sets the defaults of LifecycleMaxAge and QuestionsMaxAge: every
	// stream and bucket Agora writes is bounded by it or by what waits.
	Retention time.Duration
	// LifecycleMaxAge is how long lifecycle events (and progress reports
	// and artifacts) are kept. Default the retention, at least the
	// duplicate window.
	LifecycleMaxAge time.Duration
	// QuestionsMaxAge is how long question events are kept. Default the
	// retention, at least the duplicate window: an answerer down for less
	// than that still finds the questions asked meanwhile.
	QuestionsMaxAge time.Duration
	// AuditMaxAge is how long the decision log (AGORA_AUDIT,
	// docs/audit.md) is kept: default 180 days, and never shorter than
	// the retention, so the log outlives the work it records. Keeping it
	// for years is a larger value (AGORA_AUDIT_MAX_AGE, e.g. 87600h).
	AuditMaxAge time.Duration
	// MaxBytes bounds each of AGORA_LIFECYCLE, AGORA_QUESTIONS and
	// AGORA_PROGRESS (AGORA_STREAM_MAX_BYTES); the oldest messages are
	// discarded to make room. Default unlimited.
	MaxBytes int64
	// Changed, when set, is told of every stream, consumer and bucket
	// Ensure creates or changes, so start-up can say what it changed.
	Changed func(what string)
	// Duplicates is the duplicate window of every stream. It must exceed
	// WorkAckWait × WorkMaxDeliver. Default: that product plus 5 minutes,
	// at least 10 minutes.
	Duplicates time.Duration
}

func (c Config) withDefaults() Config {
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.WorkAckWait == 0 {
		c.WorkAckWait = 30 * time.Second
	}
	if c.WorkMaxDeliver == 0 {
		c.WorkMaxDeliver = 5
	}
	if c.Retention == 0 {
		c.Retention = retention.Default
	}
	if c.Duplicates == 0 {
		c.Duplicates = max(10*time.Minute, c.WorkAckWait*time.Duration(c.WorkMaxDeliver)+5*time.Minute)
	}
	if c.LifecycleMaxAge == 0 {
		c.LifecycleMaxAge = max(c.Retention, c.Duplicates)
	}
	if c.QuestionsMaxAge == 0 {
		c.QuestionsMaxAge = max(c.Retention, c.Duplicates)
	}
	if c.AuditMaxAge == 0 {
		c.AuditMaxAge = max(DefaultAuditMaxAge, c.Retention, c.Duplicates)
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = -1
	}
	return c
}

// Validate reports every problem with c at once.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	if c.Replicas < 1 || c.Replicas > 5 {
		errs = append(errs, fmt.Errorf("replicas %d: want 1 to 5", c.Replicas))
	}
	if c.Retention < time.Second {
		errs = append(errs, fmt.Errorf("retention %s: want at least 1s", c.Retention))
	}
	if c.MaxBytes < -1 || (c.MaxBytes > 0 && c.MaxBytes < 1<<20) {
		errs = append(errs, fmt.Errorf("stream max bytes %d: want at least 1 MiB, or -1 for unlimited", c.MaxBytes))
	}
	if c.WorkAckWait < time.Second {
		errs = append(errs, fmt.Errorf("work ack wait %s: want at least 1s", c.WorkAckWait))
	}
	if c.WorkMaxDeliver < 1 {
		errs = append(errs, fmt.Errorf("work max deliver %d: want at least 1", c.WorkMaxDeliver))
	}
	if min := c.WorkAckWait * time.Duration(c.WorkMaxDeliver); c.Duplicates <= min {
		errs = append(errs, fmt.Errorf("duplicate window %s must exceed ack wait × max deliver (%s)", c.Duplicates, min))
	}
	// The server refuses a duplicate window longer than the stream's MaxAge.
	if c.LifecycleMaxAge < c.Duplicates {
		errs = append(errs, fmt.Errorf("lifecycle max age %s: want at least the duplicate window (%s)", c.LifecycleMaxAge, c.Duplicates))
	}
	if c.QuestionsMaxAge < c.Duplicates {
		errs = append(errs, fmt.Errorf("questions max age %s: want at least the duplicate window (%s)", c.QuestionsMaxAge, c.Duplicates))
	}
	if c.AuditMaxAge < c.Retention || c.AuditMaxAge < c.Duplicates {
		errs = append(errs, fmt.Errorf("audit max age %s: want at least the retention (%s) and the duplicate window (%s)", c.AuditMaxAge, c.Retention, c.Duplicates))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("provision: %w", err)
	}
	return nil
}

// Consumer names beyond the two in lifecycle.
const (
	ConsumerRouter     = "router"         // AGORA_LIFECYCLE, needs_input only
	ConsumerRouterAns  = "router-answers" // AGORA_ANSWERS
	ConsumerProjection = "projection"     // AGORA_LIFECYCLE, the dispatcher's status projection
)

// Streams returns the stream configurations Ensure applies.
func Streams(cfg Config) []jetstream.StreamConfig {
	cfg = cfg.withDefaults()
	st := jetstream.FileStorage
	if cfg.Memory {
		st = jetstream.MemoryStorage
	}
	base := func(name, desc, subj string, ret jetstream.RetentionPolicy, age time.Duration) jetstream.StreamConfig {
		c := jetstream.StreamConfig{
			Name: name, Description: desc, Subjects: []string{subj}, Retention: ret,
			MaxAge: age, Storage: st, Replicas: cfg.Replicas, Duplicates: cfg.Duplicates,
			Discard: jetstream.DiscardOld,
		}
		if ret == jetstream.LimitsPolicy {
			// History: bounded by age and, when set, size, the oldest
			// going first (docs/storage.md, "Retention").
			c.MaxBytes = cfg.MaxBytes
		}
		return c
	}
	return []jetstream.StreamConfig{
		base(lifecycle.StreamRequests, "Agora dispatch requests from clients and the router", lifecycle.SubjectRequestsAll, jetstream.WorkQueuePolicy, 0),
		base(lifecycle.StreamDispatch, "Agora accepted work for workers", lifecycle.SubjectDispatchAll, jetstream.WorkQueuePolicy, 0),
		lifecycleStream(base(lifecycle.StreamLifecycle, "Agora lifecycle CloudEvents", lifecycle.SubjectLifecycleAll, jetstream.LimitsPolicy, cfg.LifecycleMaxAge)),
		base(lifecycle.StreamQuestions, "Agora question CloudEvents for answerers", lifecycle.SubjectQuestionsAll, jetstream.LimitsPolicy, cfg.QuestionsMaxAge),
		base(lifecycle.StreamAnswers, "Agora answers from answerers", lifecycle.SubjectAnswersAll, jetstream.WorkQueuePolicy, 0),
		progressStream(base(lifecycle.StreamProgress, "Agora progress reports of running sub-agents", lifecycle.SubjectProgressAll, jetstream.LimitsPolicy, cfg.LifecycleMaxAge)),
		auditStream(base(audit.Stream, "Agora decision log: hash-chained entries (docs/audit.md)", audit.Subject, jetstream.LimitsPolicy, cfg.AuditMaxAge)),
	}
}

// DefaultAuditMaxAge is how long the decision log is kept by default.
const DefaultAuditMaxAge = 180 * 24 * time.Hour

// auditStream keeps the decision log as written: no message can be
// deleted and the stream cannot be purged (only its age limit removes
// entries, oldest first), and it is bounded by age alone, never by size,
// so no burst of entries pushes old ones out.
func auditStream(c jetstream.StreamConfig) jetstream.StreamConfig {
	c.DenyDelete, c.DenyPurge = true, true
	c.MaxBytes = -1
	return c
}

// lifecycleStream answers reads of AGORA_LIFECYCLE (a dispatch's last
// event: the fence, cancel, acceptance's and the router's checks) by direct
// get, served inline by any replica instead of the leader's JetStream API
// queue. Why each read stays safe when a replica lags: docs/wire.md,
// "Reads by direct get".
func lifecycleStream(c jetstream.StreamConfig) jetstream.StreamConfig {
	c.AllowDirect = true
	return c
}

// ProgressPerDispatch is how many progress reports AGORA_PROGRESS keeps per
// dispatch: the latest ones matter (docs/progress.md).
const ProgressPerDispatch = 16

func progressStream(c jetstream.StreamConfig) jetstream.StreamConfig {
	c.MaxMsgsPerSubject = ProgressPerDispatch
	return c
}

// Consumers returns the durable consumer configurations Ensure applies,
// keyed by stream.
func Consumers(cfg Config) map[string][]jetstream.ConsumerConfig {
	cfg = cfg.withDefaults()
	pull := func(name, desc, filter string, ackWait time.Duration, maxDeliver int) jetstream.ConsumerConfig {
		return jetstream.ConsumerConfig{
			Durable: name, Description: desc, FilterSubject: filter,
			AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait, MaxDeliver: maxDeliver,
			MaxAckPending: 10000, Replicas: cfg.Replicas, DeliverPolicy: jetstream.DeliverAllPolicy,
		}
	}
	return map[string][]jetstream.ConsumerConfig{
		lifecycle.StreamRequests:  {pull(lifecycle.ConsumerDispatcher, "dispatcher intake", "", 30*time.Second, -1)},
		lifecycle.StreamDispatch:  {pull(lifecycle.ConsumerWorkers, "shared by every worker", "", cfg.WorkAckWait, cfg.WorkMaxDeliver)},
		lifecycle.StreamLifecycle: {pull(ConsumerRouter, "router: questions from needs_input", lifecycle.LifecycleFilter(lifecycle.KindNeedsInput, "", ""), 30*time.Second, -1), pull(ConsumerProjection, "dispatcher status projection", "", 30*time.Second, -1)},
		lifecycle.StreamAnswers:   {pull(ConsumerRouterAns, "router: answers", "", 30*time.Second, -1)},
	}
}

// Ensure creates or updates everything Agora needs. It changes nothing that
// already matches.
func Ensure(ctx context.Context, js jetstream.JetStream, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	cfg = cfg.withDefaults()
	for _, sc := range Streams(cfg) {
		if err := ensureStream(ctx, js, sc, cfg.Changed); err != nil {
			return err
		}
	}
	for stream, ccs := range Consumers(cfg) {
		for _, cc := range ccs {
			if err := ensureConsumer(ctx, js, stream, cc, cfg.Changed); err != nil {
				return err
			}
		}
	}
	st := jetstream.FileStorage
	if cfg.Memory {
		st = jetstream.MemoryStorage
	}
	kvs := []jetstream.KeyValueConfig{
		{Bucket: lifecycle.BucketSubagents, Description: "Agora sub-agent definitions", History: 5, Storage: st, Replicas: cfg.Replicas},
		// One key per runtime name the workers offer: bounded by the
		// names, each rewritten by every worker start.
		{Bucket: lifecycle.BucketRuntimes, Description: "Agora runtimes the workers offer", History: 1, Storage: st, Replicas: cfg.Replicas},
		// A thread's records get a per-key TTL when it ends (retention).
		{Bucket: lifecycle.BucketDispatches, Description: "Agora dispatch records and thread index", History: 1, Storage: st, Replicas: cfg.Replicas, LimitMarkerTTL: time.Second},
		// The server raises every per-key TTL to at least LimitMarkerTTL, so
		// keep it at its minimum (1s) for short question deadlines to hold.
		// History 1: a record lists its own history, and nothing reads
		// older revisions. With more, a question's closing write (a subject
		// rollup, internal/retention) purged several revisions at once, and
		// nats-server then recounts every consumer's pending messages over
		// every key of the bucket, in the stream's write path: at 100,000
		// waiting questions each thread's end held the bucket for tens of
		// milliseconds (docs/wire.md, "Buckets").
		{Bucket: lifecycle.BucketQuestions, Description: "Agora question records", History: 1, Storage: st, Replicas: cfg.Replicas, LimitMarkerTTL: time.Second},
		// Used MCP request states; every state expires long before its
		// record does (docs/mcp.md).
		{Bucket: lifecycle.BucketMCPStates, Description: "Agora MCP request states already used", History: 1, TTL: MCPStateRetention, Storage: st, Replicas: cfg.Replicas},
		// Inbox sign-ins and used answer links: each key carries its own
		// TTL (its session's, its link's), so both need per-key TTLs
		// (docs/inbox.md).
		{Bucket: lifecycle.BucketInboxSessions, Description: "Agora inbox sessions (keyed by a hash of the token)", History: 1, Storage: st, Replicas: cfg.Replicas, LimitMarkerTTL: time.Second},
		{Bucket: lifecycle.BucketAnswerLinks, Description: "Agora signed answer links already used", History: 1, Storage: st, Replicas: cfg.Replicas, LimitMarkerTTL: time.Second},
		// The Slack answerer's messages of open questions; an entry
		// outliving this is a question that never closed (docs/slack.md).
		// The router's open questions by match and remembered decisions;
		// each remembered decision carries its route's remember as its
		// own TTL (docs/router.md, "Decision memory").
		{Bucket: lifecycle.BucketDecisions, Description: "Agora open questions by match and remembered decisions", History: 1, Storage: st, Replicas: cfg.Replicas, LimitMarkerTTL: time.Second},
		// The A2A server's push notification configs and task index; an
		// entry lives as long as the lifecycle history of its task
		// (docs/a2a.md).
		{Bucket: lifecycle.BucketA2A, Description: "Agora A2A server: push.<task id> configs, task.<principal>.<task id> index", History: 1, TTL: cfg.LifecycleMaxAge, Storage: st, Replicas: cfg.Replicas},
		{Bucket: lifecycle.BucketSlackMessages, Description: "Slack messages of open Agora questions: <route>.<question_id> → channel and ts", History: 1, TTL: 90 * 24 * time.Hour, Storage: st, Replicas: cfg.Replicas},
	}
	for _, kc := range kvs {
		if err := ensureKV(ctx, js, kc, cfg.Changed); err != nil {
			return err
		}
	}
	for _, oc := range []jetstream.ObjectStoreConfig{
		{Bucket: lifecycle.BucketState, Description: "Agora large partial state", Storage: st, Replicas: cfg.Replicas},
		// Artifacts live as long as the lifecycle history that lists them
		// (docs/artifacts.md).
		{Bucket: lifecycle.BucketArtifacts, Description: "Agora artifacts: the files sub-agents leave", TTL: cfg.LifecycleMaxAge, Storage: st, Replicas: cfg.Replicas},
	} {
		obs, err := js.ObjectStore(ctx, oc.Bucket)
		switch {
		case errors.Is(err, jetstream.ErrBucketNotFound):
			if _, err := js.CreateObjectStore(ctx, oc); err != nil && !errors.Is(err, jetstream.ErrBucketExists) {
				return fmt.Errorf("provision: object store %s: %w", oc.Bucket, err)
			}
			report(cfg.Changed, "object store "+oc.Bucket+" created")
			continue
		case err != nil:
			return fmt.Errorf("provision: object store %s: %w", oc.Bucket, err)
		}
		st, err := obs.Status(ctx)
		if err != nil {
			return fmt.Errorf("provision: object store %s: %w", oc.Bucket, err)
		}
		if st.TTL() != oc.TTL {
			// The artifacts' TTL follows the retention.
			if _, err := js.UpdateObjectStore(ctx, oc); err != nil {
				return fmt.Errorf("provision: update object store %s: %w", oc.Bucket, err)
			}
			report(cfg.Changed, fmt.Sprintf("object store %s updated: TTL %s → %s", oc.Bucket, st.TTL(), oc.TTL))
		}
	}
	return nil
}

func ensureStream(ctx context.Context, js jetstream.JetStream, want jetstream.StreamConfig, changed func(string)) error {
	s, err := js.Stream(ctx, want.Name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		if _, err := js.CreateStream(ctx, want); err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return fmt.Errorf("provision: create stream %s: %w", want.Name, err)
		}
		report(changed, "stream "+want.Name+" created")
		return nil
	case err != nil:
		return fmt.Errorf("provision: stream %s: %w", want.Name, err)
	}
	have := s.CachedInfo().Config
	if streamMatches(have, want) {
		return nil
	}
	if _, err := js.UpdateStream(ctx, want); err != nil {
		return fmt.Errorf("provision: update stream %s: %w", want.Name, err)
	}
	report(changed, fmt.Sprintf("stream %s updated: %s", want.Name, streamDiff(have, want)))
	return nil
}

// streamDiff says what an update changes, for the start-up log.
func streamDiff(have, want jetstream.StreamConfig) string {
	var d []string
	if have.MaxAge != want.MaxAge {
		d = append(d, fmt.Sprintf("max age %s → %s", have.MaxAge, want.MaxAge))
	}
	if have.MaxBytes != want.MaxBytes {
		d = append(d, fmt.Sprintf("max bytes %d → %d", have.MaxBytes, want.MaxBytes))
	}
	if have.Duplicates != want.Duplicates {
		d = append(d, fmt.Sprintf("duplicate window %s → %s", have.Duplicates, want.Duplicates))
	}
	if have.Replicas != want.Replicas {
		d = append(d, fmt.Sprintf("replicas %d → %d", have.Replicas, want.Replicas))
	}
	if have.AllowDirect != want.AllowDirect {
		d = append(d, fmt.Sprintf("direct get %t → %t", have.AllowDirect, want.AllowDirect))
	}
	if have.DenyDelete != want.DenyDelete || have.DenyPurge != want.DenyPurge {
		d = append(d, fmt.Sprintf("deny delete/purge %t/%t → %t/%t", have.DenyDelete, have.DenyPurge, want.DenyDelete, want.DenyPurge))
	}
	if len(d) == 0 {
		return "description, subjects or policy"
	}
	return strings.Join(d, ", ")
}

func streamMatches(have, want jetstream.StreamConfig) bool {
	return reflect.DeepEqual(have.Subjects, want.Subjects) && have.Retention == want.Retention &&
		have.MaxAge == want.MaxAge && have.Storage == want.Storage && have.Replicas == want.Replicas &&
		have.Duplicates == want.Duplicates && have.Description == want.Description && have.Discard == want.Discard &&
		have.AllowDirect == want.AllowDirect && have.DenyDelete == want.DenyDelete && have.DenyPurge == want.DenyPurge &&
		(have.MaxBytes == want.MaxBytes || (want.MaxBytes == 0 && have.MaxBytes == -1))
}

func ensureConsumer(ctx context.Context, js jetstream.JetStream, stream string, want jetstream.ConsumerConfig, changed func(string)) error {
	c, err := js.Consumer(ctx, stream, want.Durable)
	switch {
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		if _, err := js.CreateConsumer(ctx, stream, want); err != nil && !errors.Is(err, jetstream.ErrConsumerExists) {
			return fmt.Errorf("provision: create consumer %s/%s: %w", stream, want.Durable, err)
		}
		report(changed, "consumer "+stream+"/"+want.Durable+" created")
		return nil
	case err != nil:
		return fmt.Errorf("provision: consumer %s/%s: %w", stream, want.Durable, err)
	}
	have := c.CachedInfo().Config
	if have.FilterSubject == want.FilterSubject && have.AckWait == want.AckWait && have.MaxDeliver == want.MaxDeliver &&
		have.MaxAckPending == want.MaxAckPending && have.Description == want.Description {
		return nil
	}
	if _, err := js.UpdateConsumer(ctx, stream, want); err != nil {
		return fmt.Errorf("provision: update consumer %s/%s: %w", stream, want.Durable, err)
	}
	report(changed, "consumer "+stream+"/"+want.Durable+" updated")
	return nil
}

// MCPStateRetention is how long a used MCP request state is remembered:
// longer than any state lives.
const MCPStateRetention = 48 * time.Hour

func ensureKV(ctx context.Context, js jetstream.JetStream, want jetstream.KeyValueConfig, changed func(string)) error {
	kv, err := js.KeyValue(ctx, want.Bucket)
	switch {
	case errors.Is(err, jetstream.ErrBucketNotFound):
		if _, err := js.CreateKeyValue(ctx, want); err != nil && !errors.Is(err, jetstream.ErrBucketExists) {
			return fmt.Errorf("provision: create bucket %s: %w", want.Bucket, err)
		}
		report(changed, "bucket "+want.Bucket+" created")
		return nil
	case err != nil:
		return fmt.Errorf("provision: bucket %s: %w", want.Bucket, err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return fmt.Errorf("provision: bucket %s: %w", want.Bucket, err)
	}
	if si, ok := st.(*jetstream.KeyValueBucketStatus); ok {
		have := si.StreamInfo().Config
		if int(st.History()) == int(want.History) && have.Description == want.Description &&
			st.LimitMarkerTTL() == want.LimitMarkerTTL && have.MaxAge == want.TTL && have.Replicas == want.Replicas && have.Storage == want.Storage {
			return nil
		}
	}
	if _, err := js.UpdateKeyValue(ctx, want); err != nil {
		return fmt.Errorf("provision: update bucket %s: %w", want.Bucket, err)
	}
	report(changed, "bucket "+want.Bucket+" updated (history, TTL, per-key TTLs, replicas or storage)")
	return nil
}

func report(changed func(string), what string) {
	if changed != nil {
		changed(what)
	}
}
