// Command dispatcher runs Agora's front door: the AGORA_REQUESTS intake,
// the `agora` NATS micro service, the HTTP API (when AGORA_HTTP_ADDR is
// set), the status projection and cancel. It serves until SIGINT or
// SIGTERM, then shuts down gracefully.
//
// Settings come from AGORA_* variables (see the README); with
// AGORA_PROVISION=true it first creates the streams, consumers and buckets.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/config"
	"github.com/agora-dispatch/agora/internal/logging"
	"github.com/agora-dispatch/agora/internal/provision"
	agorasvc "github.com/agora-dispatch/agora/internal/svc"
	"github.com/agora-dispatch/agora/internal/telemetry"
	"github.com/agora-dispatch/agora/services/dispatcher"
)

func main() { os.Exit(run()) }

func run() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// Every bad setting is named at once: the log settings with the rest.
	log, lerr := logging.New(os.Stderr)
	var cfg dispatcher.Config
	if err := errors.Join(lerr, config.Load(&cfg)); err != nil {
		fmt.Fprintln(os.Stderr, "dispatcher:", err)
		return 1
	}
	stopTraces, terr := telemetry.Start(ctx, "agora-dispatcher", log)
	if terr != nil {
		fmt.Fprintln(os.Stderr, "dispatcher:", terr)
		return 1
	}
	defer stopTraces()
	svc, err := dispatcher.New(cfg, dispatcher.Deps{Logger: log})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if cfg.Provision {
		if err := ensure(ctx, cfg); err != nil {
			log.Error("provisioning failed", "err", err)
			return 1
		}
	}
	if err := svc.Run(ctx); err != nil {
		log.Error("dispatcher failed", "err", err)
		return 1
	}
	return 0
}

// ensure provisions streams, consumers and buckets on a connection of its
// own.
func ensure(ctx context.Context, cfg dispatcher.Config) error {
	url := cfg.NATSURL
	if url == "" {
		url = nats.DefaultURL
	}
	nc, err := agorasvc.Connect("dispatcher-provision", cfg.ID, url, cfg.NATSCreds, nil)
	if err != nil {
		return fmt.Errorf("provision: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return provision.Ensure(ctx, js, provision.Config{Replicas: cfg.ProvisionReplicas, Retention: cfg.Retention,
		Changed: func(what string) { slog.Info("provisioned: " + what) }})
}
