package provision_test

import (
	"context"
	"errors"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/audit"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

var (
	wantStreams = []string{lifecycle.StreamRequests, lifecycle.StreamDispatch, lifecycle.StreamLifecycle,
		lifecycle.StreamQuestions, lifecycle.StreamAnswers, lifecycle.StreamProgress, audit.Stream}
	wantKV = []string{lifecycle.BucketSubagents, lifecycle.BucketDispatches, lifecycle.BucketQuestions, lifecycle.BucketMCPStates,
		lifecycle.BucketInboxSessions, lifecycle.BucketAnswerLinks, lifecycle.BucketSlackMessages, lifecycle.BucketDecisions, lifecycle.BucketRuntimes, lifecycle.BucketA2A}
)

// ensure runs provision.Ensure and fails the test on error.
func ensure(t *testing.T, js jetstream.JetStream, cfg provision.Config) {
	t.Helper()
	if err := provision.Ensure(t.Context(), js, cfg); err != nil {
		t.Fatalf("Ensure: %v", err)
	}
}

func streamInfo(t *testing.T, js jetstream.JetStream, name string) *jetstream.StreamInfo {
	t.Helper()
	s, err := js.Stream(t.Context(), name)
	if err != nil {
		t.Fatalf("stream %s: %v", name, err)
	}
	return s.CachedInfo()
}

func consumerInfo(t *testing.T, js jetstream.JetStream, stream, name string) *jetstream.ConsumerInfo {
	t.Helper()
	c, err := js.Consumer(t.Context(), stream, name)
	if err != nil {
		t.Fatalf("consumer %s/%s: %v", stream, name, err)
	}
	return c.CachedInfo()
}

func TestEnsureCreatesEverything(t *testing.T) {
	srv := natstest.Start(t)
	js := srv.JetStream(t)
	ctx := t.Context()
	cfg := provision.Config{}
	ensure(t, js, cfg)

	var names []string
	for n := range js.StreamNames(ctx).Name() {
		names = append(names, n)
	}
	want := append(slices.Clone(wantStreams), "OBJ_"+lifecycle.BucketState, "OBJ_"+lifecycle.BucketArtifacts)
	for _, b := range wantKV {
		want = append(want, "KV_"+b)
	}
	slices.Sort(names)
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Errorf("streams = %q, want %q", names, want)
	}

	for _, sc := range provision.Streams(cfg) {
		have := streamInfo(t, js, sc.Name).Config
		if !slices.Equal(have.Subjects, sc.Subjects) || have.Retention != sc.Retention || have.MaxAge != sc.MaxAge ||
			have.Storage != jetstream.FileStorage || have.Replicas != 1 || have.Duplicates != sc.Duplicates {
			t.Errorf("stream %s config = %+v, want %+v", sc.Name, have, sc)
		}
	}
	retention := map[string]jetstream.RetentionPolicy{
		lifecycle.StreamRequests:  jetstream.WorkQueuePolicy,
		lifecycle.StreamDispatch:  jetstream.WorkQueuePolicy,
		lifecycle.StreamAnswers:   jetstream.WorkQueuePolicy,
		lifecycle.StreamLifecycle: jetstream.LimitsPolicy,
		lifecycle.StreamQuestions: jetstream.LimitsPolicy,
	}
	for name, r := range retention {
		if got := streamInfo(t, js, name).Config.Retention; got != r {
			t.Errorf("stream %s retention = %v, want %v", name, got, r)
		}
	}
	if got := streamInfo(t, js, lifecycle.StreamLifecycle).Config.MaxAge; got != 7*24*time.Hour {
		t.Errorf("lifecycle MaxAge = %v, want 7 days", got)
	}

	consumers := provision.Consumers(cfg)
	if got := slices.Sorted(maps.Keys(consumers)); len(got) == 0 {
		t.Fatal("Consumers returned nothing")
	}
	for stream, ccs := range consumers {
		var names []string
		for n := range mustStream(t, js, stream).ConsumerNames(ctx).Name() {
			names = append(names, n)
		}
		var want []string
		for _, cc := range ccs {
			want = append(want, cc.Durable)
			have := consumerInfo(t, js, stream, cc.Durable).Config
			if have.Durable != cc.Durable || have.FilterSubject != cc.FilterSubject || have.AckPolicy != jetstream.AckExplicitPolicy ||
				have.AckWait != cc.AckWait || have.MaxDeliver != cc.MaxDeliver || have.MaxAckPending != cc.MaxAckPending ||
				have.DeliverSubject != "" {
				t.Errorf("consumer %s/%s = %+v, want a durable pull consumer like %+v", stream, cc.Durable, have, cc)
			}
		}
		slices.Sort(names)
		slices.Sort(want)
		if !slices.Equal(names, want) {
			t.Errorf("stream %s consumers = %q, want %q", stream, names, want)
		}
	}
	if w := consumerInfo(t, js, lifecycle.StreamDispatch, lifecycle.ConsumerWorkers).Config; w.AckWait != 30*time.Second || w.MaxDeliver != 5 {
		t.Errorf("workers AckWait %v MaxDeliver %d, want defaults 30s and 5", w.AckWait, w.MaxDeliver)
	}
	if r := consumerInfo(t, js, lifecycle.StreamLifecycle, provision.ConsumerRouter).Config; r.FilterSubject != "agora.lifecycle.needs_input.*.*" {
		t.Errorf("router filter = %q", r.FilterSubject)
	}

	for _, b := range wantKV {
		kv, err := js.KeyValue(ctx, b)
		if err != nil {
			t.Fatalf("bucket %s: %v", b, err)
		}
		st, err := kv.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if (b == lifecycle.BucketQuestions || b == lifecycle.BucketDispatches || b == lifecycle.BucketInboxSessions || b == lifecycle.BucketAnswerLinks) && st.LimitMarkerTTL() <= 0 {
			t.Errorf("bucket %s LimitMarkerTTL = %v, want per-key TTL enabled", b, st.LimitMarkerTTL())
		}
	}
	if st := kvStatus(t, js, lifecycle.BucketSubagents); st.History() != 5 {
		t.Errorf("%s history = %d, want 5", lifecycle.BucketSubagents, st.History())
	}
	if _, err := js.ObjectStore(ctx, lifecycle.BucketState); err != nil {
		t.Errorf("object store %s: %v", lifecycle.BucketState, err)
	}
}

func mustStream(t *testing.T, js jetstream.JetStream, name string) jetstream.Stream {
	t.Helper()
	s, err := js.Stream(t.Context(), name)
	if err != nil {
		t.Fatalf("stream %s: %v", name, err)
	}
	return s
}

func kvStatus(t *testing.T, js jetstream.JetStream, bucket string) jetstream.KeyValueStatus {
	t.Helper()
	kv, err := js.KeyValue(t.Context(), bucket)
	if err != nil {
		t.Fatalf("bucket %s: %v", bucket, err)
	}
	st, err := kv.Status(t.Context())
	if err != nil {
		t.Fatalf("bucket %s status: %v", bucket, err)
	}
	return st
}

func TestQuestionsBucketKeyTTL(t *testing.T) {
	srv := natstest.StartProvisioned(t, provision.Config{})
	js := srv.JetStream(t)
	ctx := t.Context()

	kv, err := js.KeyValue(ctx, lifecycle.BucketQuestions)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Create(ctx, "q-short", []byte(`{}`), jetstream.KeyTTL(time.Second)); err != nil {
		t.Fatalf("Create with KeyTTL: %v", err)
	}
	if _, err := kv.Create(ctx, "q-long", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(ctx, "q-short"); err != nil {
		t.Fatalf("Get right after Create: %v", err)
	}
	// 10s: well below the 1m floor an old LimitMarkerTTL imposed.
	testkit.Eventually(t, 10*time.Second, "the key with a 1s TTL to expire", func() bool {
		_, err := kv.Get(ctx, "q-short")
		if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Fatalf("Get: %v", err)
		}
		return err != nil
	})
	if _, err := kv.Get(ctx, "q-long"); err != nil {
		t.Errorf("key without TTL: %v", err)
	}

	// The setting is what makes it work: a bucket without it refuses.
	plain, err := js.KeyValue(ctx, lifecycle.BucketSubagents)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plain.Create(ctx, "k", []byte("v"), jetstream.KeyTTL(time.Second)); err == nil {
		t.Errorf("%s accepted a per-key TTL without LimitMarkerTTL", lifecycle.BucketSubagents)
	}
}

// snapshot is everything Ensure could change.
type snapshot struct {
	streams   map[string]streamSnap
	consumers map[string]consumerSnap
}

type streamSnap struct {
	created time.Time
	config  jetstream.StreamConfig
}

type consumerSnap struct {
	created time.Time
	config  jetstream.ConsumerConfig
}

func takeSnapshot(t *testing.T, js jetstream.JetStream) snapshot {
	t.Helper()
	ctx := t.Context()
	s := snapshot{streams: map[string]streamSnap{}, consumers: map[string]consumerSnap{}}
	names := js.StreamNames(ctx)
	for name := range names.Name() {
		si := streamInfo(t, js, name)
		s.streams[name] = streamSnap{si.Created, si.Config}
		cl := mustStream(t, js, name).ListConsumers(ctx)
		for ci := range cl.Info() {
			s.consumers[name+"/"+ci.Name] = consumerSnap{ci.Created, ci.Config}
		}
		if err := cl.Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := names.Err(); err != nil {
		t.Fatal(err)
	}
	return s
}

// countChanges counts JetStream API requests that create, update or delete
// a stream or consumer, by listening on the API subjects. A count waits
// for 200 ms without a request: the server may answer a request (and
// Ensure return) before it has copied the request to this connection, so
// a Flush here does not order the two.
func countChanges(t *testing.T, srv *natstest.Server) (count func() int) {
	t.Helper()
	nc := srv.Conn(t)
	ch := make(chan *nats.Msg, 4096)
	for _, subj := range []string{
		"$JS.API.STREAM.CREATE.>", "$JS.API.STREAM.UPDATE.>", "$JS.API.STREAM.DELETE.>",
		"$JS.API.CONSUMER.CREATE.>", "$JS.API.CONSUMER.DURABLE.CREATE.>", "$JS.API.CONSUMER.DELETE.>",
	} {
		if _, err := nc.ChanSubscribe(subj, ch); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	n := 0
	return func() int {
		t.Helper()
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		for {
			select {
			case m := <-ch:
				n++
				t.Logf("change request %d: %s", n, m.Subject)
			case <-time.After(200 * time.Millisecond):
				return n
			}
		}
	}
}

func TestEnsureIsIdempotent(t *testing.T) {
	for _, cfg := range []provision.Config{{}, {Memory: true}, {WorkAckWait: 2 * time.Minute, WorkMaxDeliver: 3, LifecycleMaxAge: 24 * time.Hour}} {
		t.Run("", func(t *testing.T) {
			srv := natstest.Start(t)
			js := srv.JetStream(t)
			changes := countChanges(t, srv)
			ensure(t, js, cfg)
			first := changes()
			if first == 0 {
				t.Fatal("the change counter saw no creation: it is not listening")
			}
			before := takeSnapshot(t, js)

			ensure(t, js, cfg)
			if n := changes() - first; n != 0 {
				t.Errorf("second Ensure sent %d create/update/delete requests, want 0", n)
			}
			after := takeSnapshot(t, js)
			if !reflect.DeepEqual(before, after) {
				for name, b := range before.streams {
					if a := after.streams[name]; !reflect.DeepEqual(a, b) {
						t.Errorf("stream %s changed:\nbefore %+v\nafter  %+v", name, b, a)
					}
				}
				for name, b := range before.consumers {
					if a := after.consumers[name]; !reflect.DeepEqual(a, b) {
						t.Errorf("consumer %s changed:\nbefore %+v\nafter  %+v", name, b, a)
					}
				}
				if len(before.streams) != len(after.streams) || len(before.consumers) != len(after.consumers) {
					t.Errorf("streams %d→%d, consumers %d→%d", len(before.streams), len(after.streams), len(before.consumers), len(after.consumers))
				}
			}
			if len(before.streams) != 19 { // 7 streams, 10 KV buckets, 2 object stores
				t.Errorf("%d streams, want 19", len(before.streams))
			}
		})
	}
}

func TestEnsureAppliesChanges(t *testing.T) {
	srv := natstest.Start(t)
	js := srv.JetStream(t)
	ensure(t, js, provision.Config{})
	workersCreated := consumerInfo(t, js, lifecycle.StreamDispatch, lifecycle.ConsumerWorkers).Created
	lifecycleCreated := streamInfo(t, js, lifecycle.StreamLifecycle).Created

	changed := provision.Config{LifecycleMaxAge: 2 * time.Hour, QuestionsMaxAge: 3 * time.Hour, WorkAckWait: time.Minute, WorkMaxDeliver: 7}
	ensure(t, js, changed)

	if got := streamInfo(t, js, lifecycle.StreamLifecycle).Config.MaxAge; got != 2*time.Hour {
		t.Errorf("lifecycle MaxAge = %v, want 2h", got)
	}
	if got := streamInfo(t, js, lifecycle.StreamQuestions).Config.MaxAge; got != 3*time.Hour {
		t.Errorf("questions MaxAge = %v, want 3h", got)
	}
	w := consumerInfo(t, js, lifecycle.StreamDispatch, lifecycle.ConsumerWorkers)
	if w.Config.AckWait != time.Minute || w.Config.MaxDeliver != 7 {
		t.Errorf("workers AckWait %v MaxDeliver %d, want 1m and 7", w.Config.AckWait, w.Config.MaxDeliver)
	}
	wantDup := 7*time.Minute + 5*time.Minute
	for _, name := range wantStreams {
		if got := streamInfo(t, js, name).Config.Duplicates; got != wantDup {
			t.Errorf("stream %s Duplicates = %v, want %v", name, got, wantDup)
		}
	}
	// Updated in place, not recreated.
	if got := streamInfo(t, js, lifecycle.StreamLifecycle).Created; !got.Equal(lifecycleCreated) {
		t.Errorf("lifecycle stream recreated: created %v, was %v", got, lifecycleCreated)
	}
	if !w.Created.Equal(workersCreated) {
		t.Errorf("workers consumer recreated: created %v, was %v", w.Created, workersCreated)
	}
}

func TestEnsureKeepsMessages(t *testing.T) {
	srv := natstest.StartProvisioned(t, provision.Config{})
	js := srv.JetStream(t)
	ctx := t.Context()
	if _, err := js.Publish(ctx, "agora.lifecycle.started.t1.d1", []byte("{}")); err != nil {
		t.Fatal(err)
	}
	ensure(t, js, provision.Config{LifecycleMaxAge: 48 * time.Hour})
	if n := streamInfo(t, js, lifecycle.StreamLifecycle).State.Msgs; n != 1 {
		t.Errorf("lifecycle stream has %d messages after an update, want 1", n)
	}
}

func TestEnsureMemory(t *testing.T) {
	srv := natstest.Start(t)
	js := srv.JetStream(t)
	ensure(t, js, provision.Config{Memory: true})
	names := js.StreamNames(t.Context())
	n := 0
	for name := range names.Name() {
		n++
		if got := streamInfo(t, js, name).Config.Storage; got != jetstream.MemoryStorage {
			t.Errorf("stream %s storage = %v, want memory", name, got)
		}
	}
	if n != 19 {
		t.Errorf("%d streams, want 19", n)
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  provision.Config
		want []string // substrings, one per problem; none means valid
	}{
		{name: "zero value", cfg: provision.Config{}},
		{name: "replicas 0 means default", cfg: provision.Config{Replicas: 0}},
		{name: "replicas 3", cfg: provision.Config{Replicas: 3}},
		{name: "replicas 5", cfg: provision.Config{Replicas: 5}},
		{name: "replicas 9", cfg: provision.Config{Replicas: 9}, want: []string{"replicas 9"}},
		{name: "replicas negative", cfg: provision.Config{Replicas: -1}, want: []string{"replicas -1"}},
		{name: "short ack wait", cfg: provision.Config{WorkAckWait: 500 * time.Millisecond}, want: []string{"ack wait 500ms"}},
		{name: "negative max deliver", cfg: provision.Config{WorkMaxDeliver: -1}, want: []string{"max deliver -1"}},
		{name: "duplicates equal to ack wait × max deliver", cfg: provision.Config{WorkAckWait: time.Minute, WorkMaxDeliver: 5, Duplicates: 5 * time.Minute},
			want: []string{"duplicate window 5m0s"}},
		{name: "duplicates below ack wait × max deliver", cfg: provision.Config{Duplicates: time.Minute}, want: []string{"duplicate window 1m0s"}},
		{name: "duplicates just above", cfg: provision.Config{WorkAckWait: time.Minute, WorkMaxDeliver: 5, Duplicates: 5*time.Minute + time.Second}},
		{name: "lifecycle max age below duplicate window", cfg: provision.Config{LifecycleMaxAge: 5 * time.Minute}, want: []string{"lifecycle max age 5m0s"}},
		{name: "audit max age below the retention", cfg: provision.Config{Retention: 400 * 24 * time.Hour, AuditMaxAge: 200 * 24 * time.Hour}, want: []string{"audit max age 4800h0m0s: want at least the retention"}},
		{name: "questions max age below duplicate window", cfg: provision.Config{QuestionsMaxAge: time.Minute}, want: []string{"questions max age 1m0s"}},
		{name: "everything at once", cfg: provision.Config{Replicas: 9, WorkAckWait: 10 * time.Millisecond, WorkMaxDeliver: -2, Duplicates: -time.Second, LifecycleMaxAge: -time.Hour},
			want: []string{"replicas 9", "ack wait 10ms", "max deliver -2", "duplicate window -1s", "lifecycle max age -1h0m0s"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			testkit.CheckErr(t, "Validate", err, tt.want...)
			if err == nil {
				return
			}
			if !strings.HasPrefix(err.Error(), "provision: ") {
				t.Errorf("error %q lacks the package prefix", err)
			}
			if got := len(strings.Split(err.Error(), "\n")); got != len(tt.want) {
				t.Errorf("error lists %d problems, want %d:\n%v", got, len(tt.want), err)
			}
		})
	}
}

func TestEnsureRefusesInvalidConfig(t *testing.T) {
	srv := natstest.Start(t)
	js := srv.JetStream(t)
	if err := provision.Ensure(t.Context(), js, provision.Config{Replicas: 9}); err == nil {
		t.Fatal("Ensure accepted replicas 9")
	}
	names := js.StreamNames(t.Context())
	for name := range names.Name() {
		t.Errorf("Ensure created stream %s despite invalid config", name)
	}
}

func TestDefaultDuplicateWindow(t *testing.T) {
	tests := []provision.Config{
		{},
		{WorkAckWait: 10 * time.Minute},
		{WorkAckWait: time.Hour, WorkMaxDeliver: 10},
		{WorkMaxDeliver: 100},
	}
	for _, cfg := range tests {
		ackWait, maxDeliver := cfg.WorkAckWait, cfg.WorkMaxDeliver
		if ackWait == 0 {
			ackWait = 30 * time.Second
		}
		if maxDeliver == 0 {
			maxDeliver = 5
		}
		if err := cfg.Validate(); err != nil {
			t.Errorf("%+v: %v", cfg, err)
		}
		for _, sc := range provision.Streams(cfg) {
			if sc.Duplicates <= ackWait*time.Duration(maxDeliver) {
				t.Errorf("%+v: stream %s duplicate window %v does not exceed %v × %d", cfg, sc.Name, sc.Duplicates, ackWait, maxDeliver)
			}
		}
	}
	// And on a real server.
	srv := natstest.StartProvisioned(t, provision.Config{})
	js := srv.JetStream(t)
	dup := streamInfo(t, js, lifecycle.StreamLifecycle).Config.Duplicates
	w := consumerInfo(t, js, lifecycle.StreamDispatch, lifecycle.ConsumerWorkers).Config
	if dup <= w.AckWait*time.Duration(w.MaxDeliver) {
		t.Errorf("lifecycle duplicate window %v does not exceed workers AckWait %v × MaxDeliver %d", dup, w.AckWait, w.MaxDeliver)
	}
}

// LIBRARY-NOTES: a WorkQueue stream allows one unfiltered consumer, so every
// worker must share the one "workers" consumer.
func TestWorkQueueAllowsOneConsumer(t *testing.T) {
	srv := natstest.StartProvisioned(t, provision.Config{})
	js := srv.JetStream(t)
	ctx := t.Context()

	tests := []struct {
		name   string
		filter string
		code   jetstream.ErrorCode
	}{
		{"second unfiltered", "", 10099},
		{"overlapping filter", "agora.dispatch.planner", 10100},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := js.CreateConsumer(ctx, lifecycle.StreamDispatch, jetstream.ConsumerConfig{
				Durable: "second", FilterSubject: tt.filter, AckPolicy: jetstream.AckExplicitPolicy,
			})
			var apiErr *jetstream.APIError
			if !errors.As(err, &apiErr) || apiErr.ErrorCode != tt.code {
				t.Errorf("second consumer: err = %v, want API error %d", err, tt.code)
			}
		})
	}
	var names []string
	for n := range mustStream(t, js, lifecycle.StreamDispatch).ConsumerNames(ctx).Name() {
		names = append(names, n)
	}
	if !slices.Equal(names, []string{lifecycle.ConsumerWorkers}) {
		t.Errorf("%s consumers = %q, want exactly [workers]", lifecycle.StreamDispatch, names)
	}
}

func TestEnsureHonoursContext(t *testing.T) {
	srv := natstest.Start(t)
	js := srv.JetStream(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := provision.Ensure(ctx, js, provision.Config{}); err == nil {
		t.Error("Ensure with a cancelled context: nil error")
	}
}

// A questions bucket made by an older Ensure (one-minute markers, which
// raise every per-key TTL to a minute; five revisions per key) is brought
// to the current setting, keeping each key's latest value.
func TestEnsureUpdatesQuestionsBucket(t *testing.T) {
	srv := natstest.Start(t)
	js := srv.JetStream(t)
	if _, err := js.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{
		Bucket: lifecycle.BucketQuestions, Description: "Agora question records", History: 5, LimitMarkerTTL: time.Minute,
	}); err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(t.Context(), lifecycle.BucketQuestions)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"asked", "claimed", "answered"} {
		if _, err := kv.PutString(t.Context(), "q-1", v); err != nil {
			t.Fatal(err)
		}
	}
	ensure(t, js, provision.Config{})
	st := kvStatus(t, js, lifecycle.BucketQuestions)
	if got := st.LimitMarkerTTL(); got != time.Second {
		t.Errorf("LimitMarkerTTL = %v after Ensure, want 1s", got)
	}
	if got := st.History(); got != 1 {
		t.Errorf("History = %d after Ensure, want 1", got)
	}
	if e, err := kv.Get(t.Context(), "q-1"); err != nil || string(e.Value()) != "answered" {
		t.Errorf("q-1 after Ensure: %v, %v; want its latest value kept", e, err)
	}
}

// A changed retention on a restart updates the streams, the dispatches
// bucket and the artifacts' TTL in place, says what it changed, and keeps
// what is stored.
func TestRetentionReconciles(t *testing.T) {
	srv := natstest.Start(t)
	js := srv.JetStream(t)
	ctx := t.Context()
	// An older deployment: no per-key TTLs on agora_dispatches, 7 days.
	old := jetstream.KeyValueConfig{Bucket: lifecycle.BucketDispatches, Description: "Agora dispatch records and thread index", History: 1}
	kv, err := js.CreateKeyValue(ctx, old)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "d-1", []byte(`{"dispatch_id":"d-1"}`)); err != nil {
		t.Fatal(err)
	}
	// Its questions stream kept 30 days whatever the retention.
	ensure(t, js, provision.Config{QuestionsMaxAge: 30 * 24 * time.Hour})
	// A question waiting when the setting changes.
	qkv, err := js.KeyValue(ctx, lifecycle.BucketQuestions)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := qkv.Create(ctx, "q-waiting", []byte(`{"status":"asked"}`)); err != nil {
		t.Fatal(err)
	}
	var changes []string
	ensure(t, js, provision.Config{Retention: 24 * time.Hour, MaxBytes: 64 << 20, Changed: func(s string) { changes = append(changes, s) }})
	joined := strings.Join(changes, "\n")
	for _, want := range []string{
		"stream AGORA_LIFECYCLE updated: max age 168h0m0s → 24h0m0s, max bytes -1 → 67108864",
		"stream AGORA_PROGRESS updated: max age 168h0m0s → 24h0m0s",
		"object store agora_artifacts updated: TTL 168h0m0s → 24h0m0s",
		"stream AGORA_QUESTIONS updated: max age 720h0m0s → 24h0m0s, max bytes -1 → 67108864",
	} {
		if !strings.Contains(joined, want) {
			t.Errorf("changes lack %q:\n%s", want, joined)
		}
	}
	if st := kvStatus(t, js, lifecycle.BucketDispatches); st.LimitMarkerTTL() <= 0 {
		t.Errorf("%s has no per-key TTLs after the update", lifecycle.BucketDispatches)
	}
	if e, err := kv.Get(ctx, "d-1"); err != nil || string(e.Value()) != `{"dispatch_id":"d-1"}` {
		t.Errorf("a record was lost by the update: %v", err)
	}
	if e, err := qkv.Get(ctx, "q-waiting"); err != nil || string(e.Value()) != `{"status":"asked"}` {
		t.Errorf("a waiting question was lost by the update: %v", err)
	}
	// Nothing changes a second time.
	changes = nil
	ensure(t, js, provision.Config{Retention: 24 * time.Hour, MaxBytes: 64 << 20, Changed: func(s string) { changes = append(changes, s) }})
	if len(changes) > 0 {
		t.Errorf("a second Ensure changed %q", changes)
	}
}

// The decision log refuses deletes and purges, is bounded by age alone
// (180 days, or the retention when longer) and follows a changed setting.
func TestAuditStream(t *testing.T) {
	srv := natstest.Start(t)
	js := srv.JetStream(t)
	ctx := t.Context()
	ensure(t, js, provision.Config{})
	c := streamInfo(t, js, audit.Stream).Config
	if !c.DenyDelete || !c.DenyPurge || c.MaxAge != 180*24*time.Hour || c.MaxBytes != -1 || !slices.Equal(c.Subjects, []string{audit.Subject}) {
		t.Fatalf("AGORA_AUDIT config = %+v", c)
	}
	ack, err := js.Publish(ctx, audit.Subject, []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	s := mustStream(t, js, audit.Stream)
	if err := s.DeleteMsg(ctx, ack.Sequence); err == nil {
		t.Error("deleting an entry succeeded")
	}
	if err := s.Purge(ctx); err == nil {
		t.Error("purging the log succeeded")
	}
	ensure(t, js, provision.Config{Retention: 365 * 24 * time.Hour})
	if got := streamInfo(t, js, audit.Stream).Config.MaxAge; got != 365*24*time.Hour {
		t.Errorf("with a retention of a year, audit MaxAge = %s, want the retention", got)
	}
	ensure(t, js, provision.Config{AuditMaxAge: 10 * 365 * 24 * time.Hour})
	if got := streamInfo(t, js, audit.Stream).Config.MaxAge; got != 10*365*24*time.Hour {
		t.Errorf("audit MaxAge = %s, want ten years", got)
	}
}
