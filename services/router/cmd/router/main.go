// Command router runs Agora's router: it turns needs_input events into
// questions for answerers, validates answers and re-dispatches them, and
// runs deadlines, escalation and expiry (see services/router).
//
// Settings come from AGORA_* variables: AGORA_NATS_URL, AGORA_NATS_CREDS,
// AGORA_ROUTER_CONFIG (the routing file), AGORA_ROUTER_HTTP_ADDR,
// AGORA_ROUTER_TICK, … SIGHUP reloads the routing file; an invalid file is
// logged and the routes in use stay.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/agora-dispatch/agora/internal/config"
	"github.com/agora-dispatch/agora/internal/logging"
	"github.com/agora-dispatch/agora/internal/telemetry"
	"github.com/agora-dispatch/agora/services/router"
)

func main() { os.Exit(run()) }

func run() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log, lerr := logging.New(os.Stderr)
	if lerr != nil {
		fmt.Fprintln(os.Stderr, "router:", lerr)
		return 1
	}
	stopTraces, terr := telemetry.Start(ctx, "agora-router", log)
	if terr != nil {
		fmt.Fprintln(os.Stderr, "router:", terr)
		return 1
	}
	defer stopTraces()

	var cfg router.Config
	if err := config.Load(&cfg); err != nil {
		fmt.Fprintln(os.Stderr, "router:", err)
		return 1
	}
	svc, err := router.New(cfg, router.Deps{Logger: log})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				_ = svc.Reload() // logged by Reload; the old routes stay
			}
		}
	}()
	if err := svc.Run(ctx); err != nil {
		log.Error("router failed", "err", err)
		return 1
	}
	return 0
}
