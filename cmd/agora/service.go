package main

import (
	"context"
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/agora-dispatch/agora/internal/svc"
	"github.com/agora-dispatch/agora/services/auditlog"
	"github.com/agora-dispatch/agora/services/dispatcher"
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
	}
	return &cobra.Command{
		Use:       "service worker|router|dispatcher|auditlog",
		Short:     "Run one service from its AGORA_* settings",
		Hidden:    true,
		Args:      cobra.MatchAll(cobra.ExactArgs(1), cobra.OnlyValidArgs),
		ValidArgs: []string{"worker", "router", "dispatcher", "auditlog"},
		RunE: func(_ *cobra.Command, args []string) error {
			if code := mains[args[0]](); code != 0 {
				return &exitErr{code: code}
			}
			return nil
		},
	}
}
