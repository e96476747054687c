package kvsnap_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/pkg/kvsnap"
)

func bucket(t *testing.T, history uint8) (jetstream.JetStream, jetstream.KeyValue) {
	t.Helper()
	js := natstest.Start(t).JetStream(t)
	kv, err := js.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: "snap", History: history})
	if err != nil {
		t.Fatal(err)
	}
	return js, kv
}

// Read returns each live key once, in its last value, in revision order;
// deleted and purged keys are left out and the filter selects.
func TestReadListsLiveKeys(t *testing.T) {
	for _, history := range []uint8{1, 5} {
		t.Run(fmt.Sprintf("history %d", history), func(t *testing.T) {
			js, kv := bucket(t, history)
			ctx := t.Context()
			if es, err := kvsnap.Read(ctx, js, "snap", ">"); err != nil || len(es) != 0 {
				t.Fatalf("empty bucket: %v %v", es, err)
			}
			for i := range 600 { // more than a batch
				if _, err := kv.Put(ctx, "a."+strconv.Itoa(i%300), []byte(strconv.Itoa(i))); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := kv.Put(ctx, "b.x", []byte("bx")); err != nil {
				t.Fatal(err)
			}
			if err := kv.Delete(ctx, "a.1"); err != nil {
				t.Fatal(err)
			}
			if err := kv.Purge(ctx, "a.2"); err != nil {
				t.Fatal(err)
			}
			es, err := kvsnap.Read(ctx, js, "snap", ">")
			if err != nil {
				t.Fatal(err)
			}
			if len(es) != 299 {
				t.Fatalf("%d entries, want 299", len(es))
			}
			seen := map[string]bool{}
			for i, e := range es {
				if i > 0 && e.Revision <= es[i-1].Revision {
					t.Fatalf("entry %d revision %d after %d", i, e.Revision, es[i-1].Revision)
				}
				if seen[e.Key] || e.Key == "a.1" || e.Key == "a.2" {
					t.Fatalf("entry %+v", e)
				}
				seen[e.Key] = true
				got, err := kv.Get(ctx, e.Key)
				if err != nil || string(got.Value()) != string(e.Value) || got.Revision() != e.Revision || e.Created.IsZero() {
					t.Fatalf("entry %s = %q rev %d, the bucket has %v %v", e.Key, e.Value, e.Revision, got, err)
				}
			}
			es, err = kvsnap.Read(ctx, js, "snap", "b.*")
			if err != nil || len(es) != 1 || es[0].Key != "b.x" || string(es[0].Value) != "bx" {
				t.Fatalf("filtered read: %+v %v", es, err)
			}
		})
	}
}

// While a writer replaces every key again and again, each read still
// holds every key (the case a watch's end-of-values marker gets wrong),
// in a value no older than the one stored when the read began.
func TestReadWhileKeysAreReplaced(t *testing.T) {
	js, kv := bucket(t, 1)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	const keys = 64
	var mu sync.Mutex
	stored := make([]int, keys) // the last value written of each key
	for i := range keys {
		if _, err := kv.Put(ctx, "k."+strconv.Itoa(i), []byte("0")); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for n := 1; ctx.Err() == nil; n++ {
			for i := range keys {
				if _, err := kv.Put(ctx, "k."+strconv.Itoa(i), []byte(strconv.Itoa(n))); err != nil {
					return
				}
				mu.Lock()
				stored[i] = n
				mu.Unlock()
			}
		}
	})
	for range 200 {
		mu.Lock()
		before := append([]int(nil), stored...)
		mu.Unlock()
		es, err := kvsnap.Read(ctx, js, "snap", ">")
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]int{}
		for _, e := range es {
			v, _ := strconv.Atoi(string(e.Value))
			got[e.Key] = v
		}
		for i := range keys {
			k := "k." + strconv.Itoa(i)
			v, ok := got[k]
			if !ok {
				t.Fatalf("read %d of %d keys: %s missing", len(got), keys, k)
			}
			if v < before[i] {
				t.Fatalf("%s read as %d, older than %d stored before the read", k, v, before[i])
			}
		}
	}
	cancel()
	wg.Wait()
}

// A bucket that does not exist, or a cancelled context, is an error.
func TestReadErrors(t *testing.T) {
	js, _ := bucket(t, 1)
	if _, err := kvsnap.Read(t.Context(), js, "nope", ">"); err == nil || !strings.Contains(err.Error(), "does the bucket exist") {
		t.Errorf("reading a bucket that does not exist: %v", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := kvsnap.Read(ctx, js, "snap", ">"); err == nil {
		t.Error("a read with a cancelled context succeeded")
	}
}

// A direct get whose answer never comes (the server lost it, restarting)
// fails within the connection's request timeout, even under a context
// that would wait for much longer.
func TestReadGivesUpOnALostAnswer(t *testing.T) {
	srv := natstest.Start(t)
	// Something takes the request and never answers it.
	swallow := srv.Conn(t)
	if _, err := swallow.Subscribe("$JS.API.DIRECT.GET.KV_lost", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	if err := swallow.Flush(); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(srv.Conn(t, nats.Timeout(300*time.Millisecond)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	start := time.Now()
	_, err = kvsnap.Read(ctx, js, "lost", ">")
	if err == nil {
		t.Fatal("a listing nobody answered succeeded")
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("gave up after %s, want about the request timeout (300ms)", d)
	}
	if ctx.Err() != nil {
		t.Errorf("waited until the caller's context ended: %v", ctx.Err())
	}
}
