// Command webhook-answerer posts the questions of its routes to a URL as
// signed JSON (see answerers/webhook and docs/webhook.md).
//
// Settings: AGORA_NATS_URL, AGORA_NATS_CREDS, AGORA_WEBHOOK_ROUTES,
// AGORA_WEBHOOK_URL, AGORA_WEBHOOK_SECRET, AGORA_ANSWER_LINK_KEY,
// AGORA_WEBHOOK_INBOX_URL, AGORA_WEBHOOK_AUDIENCE,
// AGORA_WEBHOOK_AUDIENCE_LABEL, AGORA_WEBHOOK_ATTEMPTS,
// AGORA_WEBHOOK_BACKOFF, AGORA_WEBHOOK_TIMEOUT, AGORA_WEBHOOK_HTTP_ADDR.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/agora-dispatch/agora/answerers/webhook"
	"github.com/agora-dispatch/agora/internal/config"
	"github.com/agora-dispatch/agora/internal/logging"
	"github.com/agora-dispatch/agora/internal/telemetry"
)

func main() { os.Exit(run()) }

func run() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log, lerr := logging.New(os.Stderr)
	if lerr != nil {
		fmt.Fprintln(os.Stderr, "webhook-answerer:", lerr)
		return 1
	}
	stopTraces, terr := telemetry.Start(ctx, "agora-webhook-answerer", log)
	if terr != nil {
		fmt.Fprintln(os.Stderr, "webhook-answerer:", terr)
		return 1
	}
	defer stopTraces()
	var cfg webhook.Config
	if err := config.Load(&cfg); err != nil {
		fmt.Fprintln(os.Stderr, "webhook-answerer:", err)
		return 1
	}
	s, err := webhook.New(cfg, webhook.Deps{Logger: log})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := s.Run(ctx); err != nil {
		log.Error("webhook failed", "err", err)
		return 1
	}
	return 0
}
