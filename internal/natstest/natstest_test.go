package natstest_test

import (
	"slices"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// A server started from options accepts connections and is shut down
// when its test ends.
func TestStartOptions(t *testing.T) {
	var s *server.Server
	t.Run("running", func(t *testing.T) {
		s = natstest.StartOptions(t, &server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
		nc, err := nats.Connect(s.ClientURL())
		if err != nil {
			t.Fatal(err)
		}
		nc.Close()
	})
	if s.Running() {
		t.Error("the server still runs after its test ended")
	}
}

func TestClient(t *testing.T) {
	srv := natstest.Start(t)
	c := srv.Client(t)
	if nc := c.Conn(); !nc.IsConnected() || nc.ConnectedUrl() != srv.URL {
		t.Fatalf("the client is connected %v to %q, want %q", nc.IsConnected(), nc.ConnectedUrl(), srv.URL)
	}
}

// Stored reads what the stream holds under its filter, oldest first, and
// Lifecycle decodes a stored lifecycle message back to its event.
func TestStoredAndLifecycle(t *testing.T) {
	srv := natstest.Start(t)
	js := srv.JetStream(t)
	ctx := t.Context()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}}); err != nil {
		t.Fatal(err)
	}
	for _, m := range []struct{ subject, data string }{{"t.a", "1"}, {"t.b", "2"}, {"t.a", "3"}} {
		if _, err := js.Publish(ctx, m.subject, []byte(m.data)); err != nil {
			t.Fatal(err)
		}
	}
	e, err := lifecycle.New("test", &lifecycle.Accepted{Common: lifecycle.Common{DispatchID: "d-1", ThreadID: "d-1", Subagent: "planner"}})
	if err != nil {
		t.Fatal(err)
	}
	msg, err := lifecycle.Encode("t.event", e)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.PublishMsg(ctx, msg); err != nil {
		t.Fatal(err)
	}

	var got []string
	for _, m := range natstest.Stored(t, js, "T", "t.a") {
		got = append(got, string(m.Data()))
	}
	if !slices.Equal(got, []string{"1", "3"}) {
		t.Errorf("stored under t.a: %q, want [1 3]", got)
	}
	if n := natstest.StreamInfo(t, js, "T").State.Msgs; n != 4 {
		t.Errorf("stream holds %d messages, want 4", n)
	}
	events := natstest.Stored(t, js, "T", "t.event")
	if len(events) != 1 {
		t.Fatalf("%d events stored, want 1", len(events))
	}
	back, d := natstest.Lifecycle(t, events[0].Headers(), events[0].Data())
	if a, ok := d.(*lifecycle.Accepted); !ok || back.ID() != e.ID() || a.DispatchID != "d-1" {
		t.Errorf("decoded %s %T %+v, want the accepted event of d-1", back.ID(), d, d)
	}
}
