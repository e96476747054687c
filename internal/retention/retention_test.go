package retention_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/retention"
	"github.com/agora-dispatch/agora/internal/testkit"
)

// A closing write expires with nothing older reappearing, whether the
// bucket keeps one revision per key (no roll-up needed, none sent) or
// several (rolled up into the closing write).
func TestUpdateExpiresWhole(t *testing.T) {
	js := natstest.Start(t).JetStream(t)
	for _, c := range []struct {
		history    uint8
		wantRollup bool
	}{{1, false}, {4, true}} {
		bucket := "retention_test_h" + string('0'+rune(c.history))
		kv, err := js.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: bucket, History: c.history, LimitMarkerTTL: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		var rev uint64
		for _, v := range []string{"asked", "claimed"} {
			if rev, err = kv.PutString(t.Context(), "q-1", v); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := retention.Update(t.Context(), js, bucket, "q-1", []byte("answered"), rev-1, time.Now().Add(time.Second)); !errors.Is(err, retention.ErrConflict) {
			t.Errorf("history %d: a stale revision gave %v, want ErrConflict", c.history, err)
		}
		if _, err := retention.Update(t.Context(), js, bucket, "q-1", []byte("answered"), rev, time.Now().Add(time.Second)); err != nil {
			t.Fatal(err)
		}
		s, err := js.Stream(t.Context(), "KV_"+bucket)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := s.GetLastMsgForSubject(t.Context(), "$KV."+bucket+".q-1")
		if err != nil {
			t.Fatal(err)
		}
		if got := raw.Header.Get(jetstream.MsgRollup) != ""; got != c.wantRollup || string(raw.Data) != "answered" {
			t.Errorf("history %d: closing write %q with roll-up %v, want %v", c.history, raw.Data, got, c.wantRollup)
		}
		testkit.Eventually(t, 10*time.Second, fmt.Sprintf("history %d: the closing write to expire", c.history), func() bool {
			e, err := kv.Get(t.Context(), "q-1")
			if errors.Is(err, jetstream.ErrKeyNotFound) {
				return true
			}
			if err != nil {
				t.Fatal(err)
			}
			if v := string(e.Value()); v != "answered" {
				t.Fatalf("history %d: an older revision %q reappeared", c.history, v)
			}
			return false
		})
	}
}
