//go:build linux

package natsserver_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/natsserver"
	"github.com/agora-dispatch/agora/internal/testkit"
)

// TestFullStoreRecovers: a store whose filesystem filled up takes no
// message (a file store keeps its write error), and once space returns
// the embedded server restarts JetStream by itself: what was stored is
// all there and new messages are stored again.
func TestFullStoreRecovers(t *testing.T) {
	dir, js, publish := smallStore(t, nil)
	ctx := t.Context()
	for range 10 {
		if err := publish(5 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	filler := filepath.Join(dir, "filler")
	testkit.Fill(t, filler)
	// Full: the next write fails, and the stream stays failed.
	stored := 10
	for i := 0; ; i++ {
		if err := publish(time.Second); err != nil {
			break
		}
		stored++
		if i > 100 {
			t.Fatal("the store took 100 messages on a full filesystem")
		}
	}
	if err := publish(time.Second); err == nil {
		t.Fatal("a stream that failed a write took a message again with no room")
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, "the stream to take messages again", func() bool { return publish(time.Second) == nil })
	st, err := js.Stream(ctx, "S")
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := int(info.State.Msgs); got < stored+1 {
		t.Errorf("the stream holds %d messages after recovery, want at least the %d stored before and the new one", got, stored)
	}
}

// TestFullStoreKeepsItsSize: JetStream restarted while the store's
// filesystem has only a little more than StoreRoom free keeps the size it
// started with; sized from the free space of that moment, it would refuse
// every write past three quarters of it as insufficient resources, for
// good, once the space was back.
func TestFullStoreKeepsItsSize(t *testing.T) {
	restarted := make(chan struct{}, 8)
	dir, _, publishIn := smallStore(t, func() { restarted <- struct{}{} })
	publish := func() error { return publishIn(5 * time.Second) }
	filler := filepath.Join(dir, "filler")
	testkit.Fill(t, filler)
	for i := 0; publish() == nil; i++ {
		if i > 100 {
			t.Fatal("the store took 100 messages on a full filesystem")
		}
	}
	// A little more than StoreRoom comes back: JetStream restarts then.
	fi, err := os.Stat(filler)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filler, fi.Size()-natsserver.StoreRoom-(8<<20)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-restarted:
	case <-time.After(30 * time.Second):
		t.Fatal("JetStream was not restarted once the store had room")
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	// 60 MiB: more than three quarters of the 72 MiB free at the restart,
	// less than three quarters of the 128 MiB the store started with.
	for i := range 960 {
		if err := publish(); err != nil {
			t.Fatalf("message %d (%d MiB) after the store had room again: %v", i+1, (i+1)/16, err)
		}
	}
}

// smallStore starts the embedded server with its store on a 128 MiB
// filesystem of its own (dir) and a stream S on it; publish stores a
// 64 KiB message within timeout. restarted, when set, is told of each
// restart of JetStream.
func smallStore(t *testing.T, restarted func()) (dir string, js jetstream.JetStream, publish func(timeout time.Duration) error) {
	t.Helper()
	dir = testkit.SmallFS(t, "128m")
	s, err := natsserver.Start(natsserver.Config{Port: -1, StoreDir: filepath.Join(dir, "store"), StoreRestarted: restarted})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}}); err != nil {
		t.Fatal(err)
	}
	publish = func(timeout time.Duration) error {
		ctx, cancel := context.WithTimeout(t.Context(), timeout)
		defer cancel()
		_, err := js.Publish(ctx, "s.x", make([]byte, 64<<10))
		return err
	}
	return dir, js, publish
}
