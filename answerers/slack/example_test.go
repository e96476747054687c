package slack_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"

	"github.com/nats-io/nats.go"

	"github.com/agora-dispatch/agora/answerers/slack"
)

// The Slack answerer mounted on a listener shared with other handlers, as
// agora dev can: Handler serves /slack/interactions (Slack's request URL),
// Run posts the questions of the settings file's routes and keeps their
// messages true.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer nc.Drain()
	s, err := slack.New(slack.Config{
		BotToken:      os.Getenv("AGORA_SLACK_BOT_TOKEN"),
		SigningSecret: os.Getenv("AGORA_SLACK_SIGNING_SECRET"),
		SettingsFile:  "answerers/slack/settings.example.yaml",
		InboxURL:      "http://127.0.0.1:8080/inbox",
	}, slack.Deps{Conn: nc})
	if err != nil {
		fmt.Println(err)
		return
	}
	mux := http.NewServeMux()
	mux.Handle("/slack/", s.Handler())
	srv := &http.Server{Addr: "127.0.0.1:8080", Handler: mux}
	go func() {
		if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Println(err)
		}
	}()
	if err := s.Run(ctx); err != nil { // blocks until ctx ends
		fmt.Println(err)
	}
	_ = srv.Shutdown(context.Background())
}
