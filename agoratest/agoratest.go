// Package agoratest runs a small Agora inside a process, for examples and
// tests of code built on the SDK (docs/sdk.md): an embedded NATS server
// with JetStream in a temporary directory, provisioned with Agora's
// streams, consumers and buckets as `agora dev` provisions them, and the
// services its Options ask for. No worker runs unless the caller starts
// one, so a dispatch stays queued.
package agoratest

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/agora-dispatch/agora/internal/natsserver"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/services/dispatcher"
	"github.com/agora-dispatch/agora/services/router"
	"github.com/agora-dispatch/agora/stack"
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

	st *stack.Stack
}

// readyTimeout bounds the wait for the services to start.
const readyTimeout = 30 * time.Second

// Start starts the server, provisions it and starts the services; ctx
// bounds the start only. Stop stops everything and removes the store.
func Start(ctx context.Context, opts Options) (*Agora, error) {
	st, err := stack.Start(ctx, stack.Options{
		Server:       natsserver.Config{Port: -1},
		Provision:    &provision.Config{},
		Subagents:    opts.Subagents,
		Dispatcher:   opts.Dispatcher,
		Router:       opts.Router,
		Logger:       opts.Logger,
		ReadyTimeout: readyTimeout,
	})
	if err != nil {
		return nil, fmt.Errorf("agoratest: %w", err)
	}
	return &Agora{URL: st.URL(), st: st}, nil
}

// Stop stops the services, the server and removes its store.
func (a *Agora) Stop() { _ = a.st.Close() }
