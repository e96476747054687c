package testkit

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/agora-dispatch/agora/internal/config"
)

// ServiceMain runs a service as a test binary's own program, for tests
// that need it in a process of its own (to SIGKILL it, or to have it kill
// itself): its Config read from the environment as the service's main
// reads it, the service made by newService with a text logger on stderr,
// run until SIGTERM or an interrupt. It returns the exit code.
func ServiceMain[C any, S interface{ Run(context.Context) error }](newService func(C, *slog.Logger) (S, error)) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	var cfg C
	if err := config.Load(&cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	svc, err := newService(cfg, slog.New(slog.NewTextHandler(os.Stderr, nil)))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := svc.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}
