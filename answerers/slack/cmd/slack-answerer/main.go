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
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/agora-dispatch/agora/answerers/slack"
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
		fmt.Fprintln(os.Stderr, "slack-answerer:", lerr)
		return 1
	}
	stopTraces, terr := telemetry.Start(ctx, "agora-slack-answerer", log)
	if terr != nil {
		fmt.Fprintln(os.Stderr, "slack-answerer:", terr)
		return 1
	}
	defer stopTraces()
	var cfg slack.Config
	if err := config.Load(&cfg); err != nil {
		fmt.Fprintln(os.Stderr, "slack-answerer:", err)
		return 1
	}
	if cfg.HTTPAddr == "" {
		cfg.HTTPAddr = "127.0.0.1:8082"
	}
	s, err := slack.New(cfg, slack.Deps{Logger: log})
	if err != nil {
		fmt.Fprintln(os.Stderr, "slack-answerer:", err)
		return 1
	}
	if err := s.Run(ctx); err != nil {
		log.Error("slack answerer failed", "err", err)
		return 1
	}
	return 0
}
