package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/agora-dispatch/agora/internal/svc"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/services/a2aserver"
	"github.com/agora-dispatch/agora/services/auditlog"
	"github.com/agora-dispatch/agora/services/dispatcher"
	"github.com/agora-dispatch/agora/services/mcpserver"
	"github.com/agora-dispatch/agora/services/router"
	"github.com/agora-dispatch/agora/services/worker"
)

// newServiceCmd runs one service from its AGORA_* settings through the
// helper its own main uses (svc.Main): `agora chaos` starts its processes
// with it.
func newServiceCmd() *cobra.Command {
	mains := map[string]func() int{
		"worker": func() int {
			return svc.Main("worker", func(_ context.Context, cfg worker.Config, log *slog.Logger) (svc.Runner, error) {
				return worker.New(cfg, worker.Deps{Logger: log})
			})
		},
		"router": func() int {
			return svc.Main("router", func(_ context.Context, cfg router.Config, log *slog.Logger) (svc.Runner, error) {
				return router.New(cfg, router.Deps{Logger: log})
			})
		},
		"auditlog": func() int {
			return svc.Main("auditlog", func(_ context.Context, cfg auditlog.Config, log *slog.Logger) (svc.Runner, error) {
				return auditlog.New(cfg, auditlog.Deps{Logger: log})
			})
		},
		"dispatcher": func() int {
			return svc.Main("dispatcher", func(_ context.Context, cfg dispatcher.Config, log *slog.Logger) (svc.Runner, error) {
				return dispatcher.New(cfg, dispatcher.Deps{Logger: log})
			})
		},
		"mcp": func() int {
			return svc.Main("mcp", func(ctx context.Context, cfg mcpserver.Config, log *slog.Logger) (svc.Runner, error) {
				if cfg.HTTPAddr == "" {
					return nil, errors.New("mcp: AGORA_MCP_HTTP_ADDR is required (the process serves HTTP only; agora mcp serves stdio)")
				}
				ms, err := mcpserver.New(ctx, cfg, mcpserver.Deps{Logger: log})
				if err != nil {
					return nil, err
				}
				return svc.RunFunc(func(ctx context.Context) error {
					defer ms.Close()
					return ms.Run(ctx)
				}), nil
			})
		},
		"a2a": func() int { return svc.Main("a2a", buildA2A) },
	}
	return &cobra.Command{
		Use:       "service worker|router|dispatcher|auditlog|mcp|a2a",
		Short:     "Run one service from its AGORA_* settings",
		Hidden:    true,
		Args:      cobra.MatchAll(cobra.ExactArgs(1), cobra.OnlyValidArgs),
		ValidArgs: []string{"worker", "router", "dispatcher", "auditlog", "mcp", "a2a"},
		RunE: func(_ *cobra.Command, args []string) error {
			if code := mains[args[0]](); code != 0 {
				return &exitErr{code: code}
			}
			return nil
		},
	}
}

// a2aConfig is `agora service a2a`'s settings: the door's own, the NATS
// server it acts through and the address it serves HTTP on.
type a2aConfig struct {
	a2aserver.Config
	NATSURL   string `envconfig:"NATS_URL" default:"nats://127.0.0.1:4222"`
	NATSCreds string `envconfig:"NATS_CREDS"`
	// HTTPAddr is where the agent card and /a2a are served.
	HTTPAddr string `envconfig:"A2A_HTTP_ADDR" default:"127.0.0.1:8091"`
}

// Validate reports every problem at once: the door's settings, and a
// listener reachable from other hosts without tokens.
func (c a2aConfig) Validate() error {
	errs := []error{c.Config.Validate()}
	host, _, err := net.SplitHostPort(c.HTTPAddr)
	switch {
	case err != nil:
		errs = append(errs, fmt.Errorf("AGORA_A2A_HTTP_ADDR=%q: want host:port, as in 127.0.0.1:8091", c.HTTPAddr))
	case len(c.APITokens) == 0 && c.PrincipalsFile == "" && !loopbackHost(host):
		errs = append(errs, fmt.Errorf("AGORA_A2A_HTTP_ADDR=%s is reachable from other hosts: set AGORA_API_TOKENS or AGORA_PRINCIPALS_FILE, or listen on 127.0.0.1", c.HTTPAddr))
	}
	return errors.Join(errs...)
}

// buildA2A builds the A2A door as a process of its own (`agora service
// a2a`, as `agora chaos` runs it): its card and bindings on
// AGORA_A2A_HTTP_ADDR, acting through a client of its own.
func buildA2A(_ context.Context, cfg a2aConfig, log *slog.Logger) (svc.Runner, error) {
	opts := []nats.Option{nats.Name("agora a2a")}
	if cfg.NATSCreds != "" {
		opts = append(opts, nats.UserCredentials(cfg.NATSCreds))
	}
	c, err := client.Connect(cfg.NATSURL, client.WithNATSOptions(opts...))
	if err != nil {
		return nil, fmt.Errorf("a2a: cannot reach NATS at %s: %w", cfg.NATSURL, err)
	}
	as, err := a2aserver.New(cfg.Config, a2aserver.Deps{Client: c, Logger: log})
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	return svc.RunFunc(func(ctx context.Context) error {
		defer c.Close()
		ln, err := net.Listen("tcp", cfg.HTTPAddr)
		if err != nil {
			return fmt.Errorf("a2a: AGORA_A2A_HTTP_ADDR=%s: %w", cfg.HTTPAddr, err)
		}
		mux := http.NewServeMux()
		h := as.Handler()
		mux.Handle(a2aserver.Path, h)
		mux.Handle(a2aserver.Path+"/", h)
		mux.Handle(a2aserver.CardPath, h)
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		run, stop := context.WithCancel(ctx)
		defer stop()
		ran := make(chan error, 1)
		go func() { ran <- as.Run(run) }()
		served := make(chan error, 1)
		go func() { served <- srv.Serve(ln) }()
		log.Info("a2a listening", "url", "http://"+ln.Addr().String()+a2aserver.Path)
		var serr error
		select {
		case <-ctx.Done():
		case serr = <-served:
		}
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		stop()
		rerr := <-ran
		if serr != nil && !errors.Is(serr, http.ErrServerClosed) {
			return errors.Join(fmt.Errorf("a2a: http: %w", serr), rerr)
		}
		return rerr
	}), nil
}
