package svc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/agora-dispatch/agora/internal/config"
	"github.com/agora-dispatch/agora/internal/logging"
	"github.com/agora-dispatch/agora/internal/telemetry"
)

// Runner is a built service: Run serves until ctx ends, then shuts down
// gracefully and returns. A Runner that also has a Reload() error method
// rereads its files on SIGHUP (see Main); Reload logs its own outcome.
type Runner interface {
	Run(ctx context.Context) error
}

// RunFunc is a function that serves as a Runner.
type RunFunc func(ctx context.Context) error

// Run calls f.
func (f RunFunc) Run(ctx context.Context) error { return f(ctx) }

// Exit is an error a Runner returns to end the process with this exit
// code without being reported as a failure (a worker's --once outcome).
type Exit int

func (e Exit) Error() string { return "exit status " + strconv.Itoa(int(e)) }

// Main is the whole of a service's main: it stops on SIGINT or SIGTERM,
// makes the logger (internal/logging), loads cfg from its AGORA_*
// variables (internal/config; a bad log setting and bad settings are
// reported together), starts tracing as "agora-"+name (internal/telemetry),
// builds the service with build, runs it — calling its Reload on SIGHUP
// when it has one — and returns the process's exit code: 0 when Run ends
// without error, 1 when anything fails (the error on stderr before the
// logger exists or before Run, logged after), or the code of an Exit. It
// blocks until the service has stopped; traces are flushed before it
// returns.
func Main[C any](name string, build func(ctx context.Context, cfg C, log *slog.Logger) (Runner, error)) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fail := func(err error) int {
		msg := err.Error()
		if !strings.HasPrefix(msg, name+":") {
			msg = name + ": " + msg
		}
		fmt.Fprintln(os.Stderr, msg)
		return 1
	}
	// Every bad setting is named at once: the log settings with the rest.
	log, lerr := logging.New(os.Stderr)
	var cfg C
	if err := errors.Join(lerr, config.Load(&cfg)); err != nil {
		return fail(err)
	}
	stopTraces, err := telemetry.Start(ctx, "agora-"+name, log)
	if err != nil {
		return fail(err)
	}
	defer stopTraces()
	r, err := build(ctx, cfg, log)
	if err != nil {
		return fail(err)
	}
	if rl, ok := r.(interface{ Reload() error }); ok {
		ReloadOnHangup(ctx, rl.Reload)
	}
	err = r.Run(ctx)
	if code, ok := errors.AsType[Exit](err); ok {
		return int(code)
	}
	if err != nil {
		log.Error(name+" failed", "err", err)
		return 1
	}
	return 0
}

// ReloadOnHangup calls reload on every SIGHUP until ctx ends; reload
// reports its own outcome. It takes SIGHUP over before it returns (so one
// no longer ends the process) and hands it back when ctx ends; the calls
// run one at a time on a goroutine of its own.
func ReloadOnHangup(ctx context.Context, reload func() error) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		defer signal.Stop(hup)
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				_ = reload()
			}
		}
	}()
}
