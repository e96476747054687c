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
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/internal/svc"
	"github.com/agora-dispatch/agora/services/dispatcher"
)

func main() {
	os.Exit(svc.Main("dispatcher", func(ctx context.Context, cfg dispatcher.Config, log *slog.Logger) (svc.Runner, error) {
		s, err := dispatcher.New(cfg, dispatcher.Deps{Logger: log})
		if err != nil {
			return nil, err
		}
		if cfg.Provision {
			if err := ensure(ctx, cfg, log); err != nil {
				return nil, fmt.Errorf("provisioning failed: %w", err)
			}
		}
		return s, nil
	}))
}

// ensure provisions streams, consumers and buckets on a connection of its
// own.
func ensure(ctx context.Context, cfg dispatcher.Config, log *slog.Logger) error {
	url := cfg.NATSURL
	if url == "" {
		url = nats.DefaultURL
	}
	nc, err := svc.Connect("dispatcher-provision", cfg.ID, url, cfg.NATSCreds, nil)
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
		Changed: func(what string) { log.Info("provisioned: " + what) }})
}
