package natstest_test

import (
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/agora-dispatch/agora/internal/natstest"
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
	if c := natstest.Start(t).Client(t); c == nil {
		t.Fatal("Client returned nil")
	}
}
