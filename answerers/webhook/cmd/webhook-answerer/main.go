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
	"log/slog"
	"os"

	"github.com/agora-dispatch/agora/answerers/webhook"
	"github.com/agora-dispatch/agora/internal/svc"
)

func main() {
	os.Exit(svc.Main("webhook-answerer", func(_ context.Context, cfg webhook.Config, log *slog.Logger) (svc.Runner, error) {
		return webhook.New(cfg, webhook.Deps{Logger: log})
	}))
}
