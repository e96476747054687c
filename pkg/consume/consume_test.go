package consume_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/consume"
)

const ackWait = 300 * time.Millisecond

// setup makes a work-queue stream T with one message per body and a
// durable consumer on it with a short AckWait.
func setup(t *testing.T, bodies ...string) (jetstream.Stream, jetstream.Consumer) {
	t.Helper()
	js := natstest.Start(t).JetStream(t)
	ctx := t.Context()
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t"}, Retention: jetstream.WorkQueuePolicy})
	if err != nil {
		t.Fatal(err)
	}
	c, err := js.CreateConsumer(ctx, "T", jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bodies {
		if _, err := js.Publish(ctx, "t", []byte(b)); err != nil {
			t.Fatal(err)
		}
	}
	return st, c
}

// run runs consume.Run until the test ends (or until the returned stop).
func run(t *testing.T, c jetstream.Consumer, h consume.Handler, o consume.Options) (stop func()) {
	t.Helper()
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- consume.Run(ctx, c, h, o) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func info(t *testing.T, c jetstream.Consumer) *jetstream.ConsumerInfo {
	t.Helper()
	ci, err := c.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return ci
}

func streamMsgs(t *testing.T, st jetstream.Stream) uint64 {
	t.Helper()
	si, err := st.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return si.State.Msgs
}

// Ack and DoubleAck remove the message from the work queue; each message
// is handled once.
func TestAckRemoves(t *testing.T) {
	for _, v := range []consume.Verdict{consume.Ack(), consume.DoubleAck()} {
		t.Run(v.String(), func(t *testing.T) {
			st, c := setup(t, "a", "b", "c")
			var calls atomic.Int32
			run(t, c, func(context.Context, jetstream.Msg) consume.Verdict { calls.Add(1); return v }, consume.Options{Slots: 2, PullExpiry: time.Second})
			testkit.Eventually(t, 10*time.Second, "the work queue emptied", func() bool { return streamMsgs(t, st) == 0 })
			if n := calls.Load(); n != 3 {
				t.Errorf("handler called %d times, want 3", n)
			}
			if ci := info(t, c); ci.NumAckPending != 0 || ci.NumRedelivered != 0 {
				t.Errorf("ack pending %d, redelivered %d; want 0, 0", ci.NumAckPending, ci.NumRedelivered)
			}
		})
	}
}

// Nak hands the message back; it comes again once the delay has passed.
func TestNakRedeliversAfterTheDelay(t *testing.T) {
	st, c := setup(t, "x")
	const delay = time.Second
	var mu sync.Mutex
	var seen []time.Time
	run(t, c, func(_ context.Context, m jetstream.Msg) consume.Verdict {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, time.Now())
		if len(seen) == 1 {
			return consume.Nak(delay)
		}
		return consume.Ack()
	}, consume.Options{PullExpiry: time.Second})
	testkit.Eventually(t, 10*time.Second, "the message acked on its second delivery", func() bool { return streamMsgs(t, st) == 0 })
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 2 {
		t.Fatalf("%d deliveries, want 2", len(seen))
	}
	if gap := seen[1].Sub(seen[0]); gap < delay {
		t.Errorf("redelivered after %s, want at least the nak's delay %s", gap, delay)
	}
}

// Term ends the message for good: the server no longer holds it for the
// consumer, while a message left unsettled (Leave) comes again after the
// AckWait.
func TestTermStopsRedelivery(t *testing.T) {
	_, c := setup(t, "poison", "left")
	var poison, left atomic.Int32
	run(t, c, func(_ context.Context, m jetstream.Msg) consume.Verdict {
		if string(m.Data()) == "poison" {
			poison.Add(1)
			return consume.Term("poison")
		}
		if left.Add(1) == 1 {
			return consume.Leave()
		}
		return consume.Ack()
	}, consume.Options{PullExpiry: time.Second})
	testkit.Eventually(t, 10*time.Second, "the left message delivered again after its AckWait and acked", func() bool {
		ci := info(t, c)
		return left.Load() == 2 && ci.NumAckPending == 0 && ci.NumPending == 0
	})
	// The left message waited out an AckWait that began after the poison
	// was terminated: had the poison still been pending, it would have
	// come again first.
	if n := poison.Load(); n != 1 {
		t.Errorf("the terminated message was handled %d times, want 1", n)
	}
}

// While a handler works longer than the AckWait, Run keeps its message
// from being delivered again; with the keep-alive off it comes again.
func TestKeepAliveHoldsASlowHandler(t *testing.T) {
	for _, tc := range []struct {
		name      string
		keepAlive time.Duration
		want      int32
	}{
		{"kept alive", 0, 1},
		{"not kept alive", -1, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, c := setup(t, "slow")
			var calls atomic.Int32
			release := make(chan struct{})
			run(t, c, func(ctx context.Context, m jetstream.Msg) consume.Verdict {
				if calls.Add(1) == 1 {
					<-release
				}
				return consume.Ack()
			}, consume.Options{Slots: 2, PullExpiry: time.Second, KeepAlive: tc.keepAlive})
			// Four AckWaits: without news the server delivers the message
			// again, to the other slot.
			deadline := time.Now().Add(4 * ackWait)
			testkit.Eventually(t, 10*time.Second, "four AckWaits passed or a second delivery", func() bool {
				return calls.Load() > 1 || time.Now().After(deadline)
			})
			close(release)
			testkit.Eventually(t, 10*time.Second, "the work queue emptied", func() bool { return streamMsgs(t, st) == 0 })
			if n := calls.Load(); n != tc.want {
				t.Errorf("handler called %d times, want %d", n, tc.want)
			}
		})
	}
}

// When Run's context ends, a handler in flight finishes with its context
// alive and its verdict is applied; Run returns only then.
func TestStopLetsInFlightFinish(t *testing.T) {
	st, c := setup(t, "busy")
	started := make(chan struct{})
	release := make(chan struct{})
	var handlerErr atomic.Value
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- consume.Run(ctx, c, func(hctx context.Context, m jetstream.Msg) consume.Verdict {
			close(started)
			<-release
			handlerErr.Store(fmt.Sprint(hctx.Err()))
			return consume.Ack()
		}, consume.Options{PullExpiry: time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	}()
	<-started
	cancel()
	select {
	case err := <-done:
		t.Fatalf("Run returned (%v) while a handler was in flight", err)
	case <-time.After(3 * ackWait):
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if got := handlerErr.Load(); got != "<nil>" {
		t.Errorf("the handler's context ended (%v) before the shutdown timeout", got)
	}
	// The ack is sent before Run returns; the server removes the message
	// when it has processed it.
	testkit.Eventually(t, 10*time.Second, "the in-flight handler's ack applied (no message left)", func() bool { return streamMsgs(t, st) == 0 })
}

// A handler still running when the shutdown timeout passes has its
// context cancelled; Run returns once it has.
func TestShutdownTimeoutCancelsHandlers(t *testing.T) {
	_, c := setup(t, "stuck")
	started := make(chan struct{})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- consume.Run(ctx, c, func(hctx context.Context, m jetstream.Msg) consume.Verdict {
			close(started)
			<-hctx.Done()
			return consume.Nak(0)
		}, consume.Options{PullExpiry: time.Second, ShutdownTimeout: 100 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	}()
	<-started
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after the shutdown timeout")
	}
	// Handed back: the next pull gets it again.
	m, err := c.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		t.Fatalf("the message did not come again: %v", err)
	}
	if md, _ := m.Metadata(); md == nil || md.NumDelivered != 2 {
		t.Errorf("metadata %+v, want delivery 2", md)
	}
}

func TestKeepAliveEvery(t *testing.T) {
	for _, tc := range []struct{ ackWait, want time.Duration }{
		{30 * time.Second, 10 * time.Second},
		{300 * time.Millisecond, 100 * time.Millisecond},
		{60 * time.Millisecond, 100 * time.Millisecond},
	} {
		if got := consume.KeepAliveEvery(tc.ackWait); got != tc.want {
			t.Errorf("KeepAliveEvery(%s) = %s, want %s", tc.ackWait, got, tc.want)
		}
	}
}

func TestVerdictString(t *testing.T) {
	for _, tc := range []struct {
		v    consume.Verdict
		want string
	}{
		{consume.Ack(), "ack"}, {consume.DoubleAck(), "double-ack"}, {consume.Nak(2 * time.Second), "nak 2s"},
		{consume.Term(""), "term"}, {consume.Term("bad"), "term: bad"}, {consume.Leave(), "leave"}, {consume.Verdict{}, "leave"},
	} {
		if got := tc.v.String(); got != tc.want {
			t.Errorf("String() = %q, want %q", got, tc.want)
		}
	}
}

func TestRunRefusesNil(t *testing.T) {
	if err := consume.Run(t.Context(), nil, func(context.Context, jetstream.Msg) consume.Verdict { return consume.Ack() }, consume.Options{}); err == nil {
		t.Error("Run with a nil consumer: no error")
	}
}
