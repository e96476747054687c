// Command slack-answerer asks people in Slack the questions of the routes
// its settings file names (see answerers/slack and docs/slack.md).
//
// Settings: AGORA_NATS_URL, AGORA_NATS_CREDS, AGORA_SLACK_BOT_TOKEN
// (required), AGORA_SLACK_SIGNING_SECRET and/or AGORA_SLACK_APP_TOKEN
// (Socket Mode), AGORA_SLACK_SETTINGS (required:
// the routes and their channels), AGORA_SLACK_INBOX_URL (links to the
// inbox), AGORA_SLACK_HTTP_ADDR (default 127.0.0.1:8082: Slack's
// interactivity requests at /slack/interactions, and /metrics),
// AGORA_SLACK_POST_ATTEMPTS, AGORA_SLACK_RETRY_BACKOFF,
// AGORA_SLACK_MAX_RETRY_AFTER, AGORA_SLACK_CONTEXT_CHARS,
// AGORA_SLACK_SHUTDOWN_TIMEOUT.
package main

import (
	"context"
	"log/slog"
	"os"

	"github.com/agora-dispatch/agora/answerers/slack"
	"github.com/agora-dispatch/agora/internal/svc"
)

func main() {
	os.Exit(svc.Main("slack-answerer", func(_ context.Context, cfg slack.Config, log *slog.Logger) (svc.Runner, error) {
		if cfg.HTTPAddr == "" {
			cfg.HTTPAddr = "127.0.0.1:8082"
		}
		return slack.New(cfg, slack.Deps{Logger: log})
	}))
}
