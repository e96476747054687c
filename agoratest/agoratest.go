// Package agoratest runs a small Agora inside a process, for examples and
// tests of code built on the SDK (docs/sdk.md): an embedded NATS server
// with JetStream in a temporary directory, provisioned with Agora's
// streams, consumers and buckets as `agora dev` provisions them, and the
// services its Options ask for. No worker runs unless the caller starts
// one, so a dispatch stays queued.
package agoratest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/natsserver"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/services/dispatcher"
	"github.com/agora-dispatch/agora/services/router"
)

// Options says what runs beside the server.
type Options struct {
	// Dispatcher, when set, runs a dispatcher with this configuration.
	Dispatcher *dispatcher.Config
	// Router, when set, runs a router with this configuration.
	Router *router.Config
	// Subagents are stored in the registry (agora_subagents) before the
	// services start.
	Subagents []subagent.Definition
	// Logger receives the services' logs; default: discarded.
	Logger *slog.Logger
}

// Agora is a running server with the services Options asked for.
type Agora struct {
	// URL is the server's client URL (a free loopback port).
	URL string

	srv   *server.Server
	dir   string
	stops []func()
}

// readyTimeout bounds the wait for each service's start.
const readyTimeout = 30 * time.Second

// Start starts the server, provisions it and starts the services; ctx
// bounds the start only. Stop stops everything and removes the store.
func Start(ctx context.Context, opts Options) (_ *Agora, err error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	dir, err := os.MkdirTemp("", "agoratest-")
	if err != nil {
		return nil, fmt.Errorf("agoratest: %w", err)
	}
	a := &Agora{dir: dir}
	defer func() {
		if err != nil {
			a.Stop()
		}
	}()
	if a.srv, err = natsserver.Start(natsserver.Config{Port: -1, StoreDir: dir}); err != nil {
		return nil, fmt.Errorf("agoratest: %w", err)
	}
	a.URL = a.srv.ClientURL()
	nc, err := a.connect()
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("agoratest: %w", err)
	}
	if err := provision.Ensure(ctx, js, provision.Config{}); err != nil {
		return nil, fmt.Errorf("agoratest: provision: %w", err)
	}
	if len(opts.Subagents) > 0 {
		c, err := client.New(nc)
		if err != nil {
			return nil, fmt.Errorf("agoratest: %w", err)
		}
		for _, d := range opts.Subagents {
			if _, err := c.ApplySubagent(ctx, d); err != nil {
				return nil, fmt.Errorf("agoratest: %w", err)
			}
		}
	}
	if opts.Dispatcher != nil {
		nc, err := a.connect()
		if err != nil {
			return nil, err
		}
		d, err := dispatcher.New(*opts.Dispatcher, dispatcher.Deps{Conn: nc, Logger: opts.Logger})
		if err != nil {
			return nil, fmt.Errorf("agoratest: %w", err)
		}
		if err := a.run(ctx, "dispatcher", d.Run, d.Ready()); err != nil {
			return nil, err
		}
	}
	if opts.Router != nil {
		nc, err := a.connect()
		if err != nil {
			return nil, err
		}
		r, err := router.New(*opts.Router, router.Deps{Conn: nc, Logger: opts.Logger})
		if err != nil {
			return nil, fmt.Errorf("agoratest: %w", err)
		}
		if err := a.run(ctx, "router", r.Run, r.Ready()); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// connect opens a connection that Stop closes, after the services.
func (a *Agora) connect() (*nats.Conn, error) {
	nc, err := nats.Connect(a.URL)
	if err != nil {
		return nil, fmt.Errorf("agoratest: connect: %w", err)
	}
	a.stops = append(a.stops, nc.Close)
	return nc, nil
}

// run runs a service until Stop and waits until it is ready.
func (a *Agora) run(ctx context.Context, name string, run func(context.Context) error, ready <-chan struct{}) error {
	sctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(sctx) }()
	a.stops = append(a.stops, func() { cancel(); <-done })
	timer := time.NewTimer(readyTimeout)
	defer timer.Stop()
	select {
	case <-ready:
		return nil
	case err := <-done:
		done <- err // for the stop
		if err == nil {
			err = errors.New("stopped")
		}
		return fmt.Errorf("agoratest: %s: %w", name, err)
	case <-ctx.Done():
		return fmt.Errorf("agoratest: %s: %w", name, ctx.Err())
	case <-timer.C:
		return fmt.Errorf("agoratest: %s not ready within %s", name, readyTimeout)
	}
}

// Stop stops the services, the server and removes its store.
func (a *Agora) Stop() {
	for i := len(a.stops) - 1; i >= 0; i-- {
		a.stops[i]()
	}
	a.stops = nil
	if a.srv != nil {
		a.srv.Shutdown()
		a.srv.WaitForShutdown()
		a.srv = nil
	}
	_ = os.RemoveAll(a.dir)
}
