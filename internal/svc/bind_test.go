package svc_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/internal/svc"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// A service that starts while JetStream is unreachable (a cluster still
// electing, a server restarting) binds once it is back, instead of exiting.
func TestBindRetriesUntilJetStreamAnswers(t *testing.T) {
	srv := natstest.StartProvisioned(t, provision.Config{})
	nc := srv.Conn(t, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	js, _ := jetstream.New(nc)
	srv.Stop()
	restarted := make(chan struct{})
	go func() {
		defer close(restarted)
		time.Sleep(time.Second)
		srv.Restart(t)
	}()
	// The server's cleanup reads what Restart wrote: wait for it first.
	t.Cleanup(func() { <-restarted })
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	attempts := 0
	start := time.Now()
	err := svc.Bind(ctx, slog.New(slog.NewTextHandler(io.Discard, nil)), 500*time.Millisecond, func(ctx context.Context) error {
		attempts++
		_, err := js.Stream(ctx, lifecycle.StreamLifecycle)
		return err
	})
	if err != nil {
		t.Fatalf("bind: %v", err)
	}
	if attempts < 2 || time.Since(start) < time.Second {
		t.Fatalf("bound after %d attempts in %s: the server was down, want retries", attempts, time.Since(start))
	}
}

// A stream that does not exist is no passing fault: Bind stops at once and
// says how to provision.
func TestBindMissingStreamFailsAtOnce(t *testing.T) {
	srv := natstest.Start(t)
	js, _ := jetstream.New(srv.Conn(t))
	start := time.Now()
	err := svc.Bind(t.Context(), slog.New(slog.NewTextHandler(io.Discard, nil)), 0, func(ctx context.Context) error {
		_, err := js.Stream(ctx, lifecycle.StreamLifecycle)
		return err
	})
	if err == nil || !strings.Contains(err.Error(), "provision") || time.Since(start) > 2*time.Second {
		t.Fatalf("err = %v after %s, want the provisioning hint at once", err, time.Since(start))
	}
}
