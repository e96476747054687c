// Package natstest starts a real in-process NATS server with JetStream for
// tests: a random loopback port, a temporary file store, stopped by
// t.Cleanup. Every integration test uses it; nothing fakes NATS.
package natstest

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/natsserver"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// DeployUsers maps each NATS user of deploy/nats/permissions.conf to the
// environment variable the configuration reads its password from. The
// tests that run that configuration give every user a password through
// these.
var DeployUsers = map[string]string{
	"admin": "NATS_PASS_ADMIN", "client": "NATS_PASS_CLIENT", "dispatcher": "NATS_PASS_DISPATCHER",
	"worker": "NATS_PASS_WORKER", "router": "NATS_PASS_ROUTER", "answerer-human": "NATS_PASS_ANSWERER_HUMAN",
	"answerer-data": "NATS_PASS_ANSWERER_DATA", "answerer-agents": "NATS_PASS_ANSWERER_AGENTS",
	"answerer-slack": "NATS_PASS_ANSWERER_SLACK", "answerer-webhook": "NATS_PASS_ANSWERER_WEBHOOK",
	"auditlog": "NATS_PASS_AUDITLOG",
}

// Server is a running test server.
type Server struct {
	*server.Server
	URL      string
	StoreDir string
	port     int
}

// Start starts a server on a random loopback port with a fresh store
// directory. It is shut down when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	return StartIn(t, t.TempDir())
}

// StartIn starts a server as Start does with its store in dir (a
// filesystem a test fills, say). It is shut down when the test ends.
func StartIn(t testing.TB, dir string) *Server {
	t.Helper()
	s := &Server{StoreDir: dir}
	s.start(t, -1)
	t.Cleanup(s.Stop)
	return s
}

// StartProvisioned starts a server and provisions every Agora stream,
// consumer, bucket and object store on it with cfg (zero value: defaults).
func StartProvisioned(t testing.TB, cfg provision.Config) *Server {
	t.Helper()
	s := Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := provision.Ensure(ctx, s.JetStream(t), cfg); err != nil {
		t.Fatalf("natstest: provision: %v", err)
	}
	return s
}

// StartOptions starts a server with opts as they are (a configuration
// file's, say, read with server.ProcessConfigFile) and waits until it
// accepts connections. It is shut down when the test ends.
func StartOptions(t testing.TB, opts *server.Options) *server.Server {
	t.Helper()
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("natstest: %v", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		t.Fatal("natstest: server not ready within 10s")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s
}

func (s *Server) start(t testing.TB, port int) {
	t.Helper()
	srv, err := natsserver.Start(natsserver.Config{Port: port, StoreDir: s.StoreDir})
	if err != nil {
		t.Fatalf("natstest: %v", err)
	}
	s.Server = srv
	s.URL = srv.ClientURL()
	if a, ok := srv.Addr().(*net.TCPAddr); ok {
		s.port = a.Port
	}
}

// Stop shuts the server down and waits for it. Safe to call twice.
func (s *Server) Stop() {
	if s.Server == nil {
		return
	}
	s.Server.Shutdown()
	s.Server.WaitForShutdown()
}

// Restart stops the server and starts it again on the same port and store
// directory, as a crash-and-restart of the broker would.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Stop()
	s.start(t, s.port)
}

// Conn connects to the server; the connection is closed when the test ends.
// Clients reconnect forever, so a Restart does not break them.
func (s *Server) Conn(t testing.TB, opts ...nats.Option) *nats.Conn {
	t.Helper()
	opts = append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond)}, opts...)
	nc, err := nats.Connect(s.URL, opts...)
	if err != nil {
		t.Fatalf("natstest: connect %s: %v", s.URL, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Client returns an Agora client on a new connection (Conn).
func (s *Server) Client(t testing.TB, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.New(s.Conn(t), opts...)
	if err != nil {
		t.Fatalf("natstest: client: %v", err)
	}
	return c
}

// JetStream returns a JetStream context on a new connection.
func (s *Server) JetStream(t testing.TB) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(s.Conn(t))
	if err != nil {
		t.Fatalf("natstest: jetstream: %v", err)
	}
	return js
}

// StreamInfo returns the current information of the stream name (its
// state: messages, first and last sequence), failing the test when the
// stream cannot be read. opts are passed on (a subject filter, say).
func StreamInfo(t testing.TB, js jetstream.JetStream, name string, opts ...jetstream.StreamInfoOpt) *jetstream.StreamInfo {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatalf("natstest: stream %s: %v", name, err)
	}
	info, err := s.Info(ctx, opts...)
	if err != nil {
		t.Fatalf("natstest: info of stream %s: %v", name, err)
	}
	return info
}

// KeyValue returns the key-value bucket name, failing the test when it
// cannot be looked up.
func KeyValue(t testing.TB, js jetstream.JetStream, name string) jetstream.KeyValue {
	t.Helper()
	return lookup(t, "bucket", name, js.KeyValue)
}

// ObjectStore returns the object store name, failing the test when it
// cannot be looked up.
func ObjectStore(t testing.TB, js jetstream.JetStream, name string) jetstream.ObjectStore {
	t.Helper()
	return lookup(t, "object store", name, js.ObjectStore)
}

// lookup returns what get finds under name, failing the test when it
// finds nothing; what names the kind of thing in the failure.
func lookup[T any](t testing.TB, what, name string, get func(context.Context, string) (T, error)) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := get(ctx, name)
	if err != nil {
		t.Fatalf("natstest: %s %s: %v", what, name, err)
	}
	return v
}

// Stored returns every message stream holds under the subject filter now,
// oldest first, read with an ordered consumer. It fails the test when they
// cannot all be read.
func Stored(t testing.TB, js jetstream.JetStream, stream, filter string) []jetstream.Msg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	if err != nil {
		t.Fatalf("natstest: consume %s %s: %v", stream, filter, err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatalf("natstest: consumer info of %s %s: %v", stream, filter, err)
	}
	out := make([]jetstream.Msg, 0, info.NumPending)
	for range info.NumPending {
		m, err := c.Next(jetstream.FetchMaxWait(10 * time.Second))
		if err != nil {
			t.Fatalf("natstest: read %s %s: %v", stream, filter, err)
		}
		out = append(out, m)
	}
	return out
}

// Lifecycle decodes a stored lifecycle message (its headers and data) and
// parses its payload, failing the test when either step fails.
func Lifecycle(t testing.TB, h nats.Header, data []byte) (lifecycle.Event, lifecycle.Data) {
	t.Helper()
	e, err := lifecycle.Decode(h, data)
	if err != nil {
		t.Fatalf("natstest: decode a lifecycle message: %v", err)
	}
	d, err := lifecycle.Parse(e)
	if err != nil {
		t.Fatalf("natstest: parse %s: %v", e.Type(), err)
	}
	return e, d
}

// ConsumerInfo returns the current information of the consumer name on
// stream (pending, awaiting ack, redelivered), failing the test when it
// cannot be read.
func ConsumerInfo(t testing.TB, js jetstream.JetStream, stream, name string) *jetstream.ConsumerInfo {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := js.Consumer(ctx, stream, name)
	if err != nil {
		t.Fatalf("natstest: consumer %s of %s: %v", name, stream, err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatalf("natstest: info of consumer %s of %s: %v", name, stream, err)
	}
	return info
}
