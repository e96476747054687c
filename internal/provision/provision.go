// Package provision creates Agora's streams, consumers, key-value buckets and
// object store (DESIGN §2). Ensure is idempotent: run against a server that
// already has them with the same settings, it changes nothing.
package provision

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/nats-io/nats.go/jetstream"

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
	// LifecycleMaxAge is how long lifecycle events are kept. Default 7 days.
	LifecycleMaxAge time.Duration
	// QuestionsMaxAge is how long question events are kept. Default 30 days.
	QuestionsMaxAge time.Duration
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
	if c.LifecycleMaxAge == 0 {
		c.LifecycleMaxAge = 7 * 24 * time.Hour
	}
	if c.QuestionsMaxAge == 0 {
		c.QuestionsMaxAge = 30 * 24 * time.Hour
	}
	if c.Duplicates == 0 {
		c.Duplicates = max(10*time.Minute, c.WorkAckWait*time.Duration(c.WorkMaxDeliver)+5*time.Minute)
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
		return jetstream.StreamConfig{
			Name: name, Description: desc, Subjects: []string{subj}, Retention: ret,
			MaxAge: age, Storage: st, Replicas: cfg.Replicas, Duplicates: cfg.Duplicates,
			Discard: jetstream.DiscardOld,
		}
	}
	return []jetstream.StreamConfig{
		base(lifecycle.StreamRequests, "Agora dispatch requests from clients and the router", lifecycle.SubjectRequestsAll, jetstream.WorkQueuePolicy, 0),
		base(lifecycle.StreamDispatch, "Agora accepted work for workers", lifecycle.SubjectDispatchAll, jetstream.WorkQueuePolicy, 0),
		base(lifecycle.StreamLifecycle, "Agora lifecycle CloudEvents", lifecycle.SubjectLifecycleAll, jetstream.LimitsPolicy, cfg.LifecycleMaxAge),
		base(lifecycle.StreamQuestions, "Agora question CloudEvents for answerers", lifecycle.SubjectQuestionsAll, jetstream.LimitsPolicy, cfg.QuestionsMaxAge),
		base(lifecycle.StreamAnswers, "Agora answers from answerers", lifecycle.SubjectAnswersAll, jetstream.WorkQueuePolicy, 0),
		progressStream(base(lifecycle.StreamProgress, "Agora progress reports of running sub-agents", lifecycle.SubjectProgressAll, jetstream.LimitsPolicy, cfg.LifecycleMaxAge)),
	}
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
		if err := ensureStream(ctx, js, sc); err != nil {
			return err
		}
	}
	for stream, ccs := range Consumers(cfg) {
		for _, cc := range ccs {
			if err := ensureConsumer(ctx, js, stream, cc); err != nil {
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
		{Bucket: lifecycle.BucketDispatches, Description: "Agora dispatch records and thread index", History: 1, Storage: st, Replicas: cfg.Replicas},
		// The server raises every per-key TTL to at least LimitMarkerTTL, so
		// keep it at its minimum (1s) for short question deadlines to hold.
		{Bucket: lifecycle.BucketQuestions, Description: "Agora question records", History: 5, Storage: st, Replicas: cfg.Replicas, LimitMarkerTTL: time.Second},
		// Used MCP request states; every state expires long before its
		// record does (docs/mcp.md).
		{Bucket: lifecycle.BucketMCPStates, Description: "Agora MCP request states already used", History: 1, TTL: MCPStateRetention, Storage: st, Replicas: cfg.Replicas},
	}
	for _, kc := range kvs {
		if err := ensureKV(ctx, js, kc); err != nil {
			return err
		}
	}
	for _, oc := range []jetstream.ObjectStoreConfig{
		{Bucket: lifecycle.BucketState, Description: "Agora large partial state", Storage: st, Replicas: cfg.Replicas},
		// Artifacts live as long as the lifecycle history that lists them
		// (docs/artifacts.md).
		{Bucket: lifecycle.BucketArtifacts, Description: "Agora artifacts: the files sub-agents leave", TTL: cfg.LifecycleMaxAge, Storage: st, Replicas: cfg.Replicas},
	} {
		if _, err := js.ObjectStore(ctx, oc.Bucket); errors.Is(err, jetstream.ErrBucketNotFound) {
			if _, err := js.CreateObjectStore(ctx, oc); err != nil && !errors.Is(err, jetstream.ErrBucketExists) {
				return fmt.Errorf("provision: object store %s: %w", oc.Bucket, err)
			}
		} else if err != nil {
			return fmt.Errorf("provision: object store %s: %w", oc.Bucket, err)
		}
	}
	return nil
}

func ensureStream(ctx context.Context, js jetstream.JetStream, want jetstream.StreamConfig) error {
	s, err := js.Stream(ctx, want.Name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		if _, err := js.CreateStream(ctx, want); err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return fmt.Errorf("provision: create stream %s: %w", want.Name, err)
		}
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
	return nil
}

func streamMatches(have, want jetstream.StreamConfig) bool {
	return reflect.DeepEqual(have.Subjects, want.Subjects) && have.Retention == want.Retention &&
		have.MaxAge == want.MaxAge && have.Storage == want.Storage && have.Replicas == want.Replicas &&
		have.Duplicates == want.Duplicates && have.Description == want.Description && have.Discard == want.Discard
}

func ensureConsumer(ctx context.Context, js jetstream.JetStream, stream string, want jetstream.ConsumerConfig) error {
	c, err := js.Consumer(ctx, stream, want.Durable)
	switch {
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		if _, err := js.CreateConsumer(ctx, stream, want); err != nil && !errors.Is(err, jetstream.ErrConsumerExists) {
			return fmt.Errorf("provision: create consumer %s/%s: %w", stream, want.Durable, err)
		}
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
	return nil
}

// MCPStateRetention is how long a used MCP request state is remembered:
// longer than any state lives.
const MCPStateRetention = 48 * time.Hour

func ensureKV(ctx context.Context, js jetstream.JetStream, want jetstream.KeyValueConfig) error {
	kv, err := js.KeyValue(ctx, want.Bucket)
	switch {
	case errors.Is(err, jetstream.ErrBucketNotFound):
		if _, err := js.CreateKeyValue(ctx, want); err != nil && !errors.Is(err, jetstream.ErrBucketExists) {
			return fmt.Errorf("provision: create bucket %s: %w", want.Bucket, err)
		}
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
	return nil
}
