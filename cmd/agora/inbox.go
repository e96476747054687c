package main

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/agora-dispatch/agora/answerers/inbox"
	"github.com/agora-dispatch/agora/internal/config"
	"github.com/agora-dispatch/agora/internal/logging"
)

func newInboxCmd(g *globals) *cobra.Command {
	var addr string
	var devToken bool
	cmd := &cobra.Command{
		Use:   "inbox",
		Short: "Serve the web inbox where people answer questions",
		Long: `inbox serves the human inbox against a running Agora (agora dev or a cluster).
Sign-in: a users file (AGORA_INBOX_USERS) or --dev-token, which prints one
generated login URL. Other settings: AGORA_INBOX_ROUTES, AGORA_INBOX_SESSION_TTL,
AGORA_INBOX_TLS_CERT, AGORA_INBOX_TLS_KEY.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkListenAddr("--http", addr); err != nil {
				return err
			}
			// Flags win over the environment; config.Load then validates
			// the whole set and names every bad variable.
			os.Setenv("AGORA_NATS_URL", g.natsURL)
			os.Setenv("AGORA_NATS_CREDS", g.creds)
			os.Setenv("AGORA_INBOX_HTTP_ADDR", addr)
			if devToken {
				os.Setenv("AGORA_INBOX_DEV_TOKEN", "true")
			}
			var cfg inbox.Config
			if err := config.Load(&cfg); err != nil {
				return fmt.Errorf("%w (or pass --dev-token)", err)
			}
			// The sign-in link is printed once the listener accepts, so it
			// works at once, with the port the listener really got.
			var tok string
			stderr := cmd.ErrOrStderr()
			log, err := logging.New(os.Stderr)
			if err != nil {
				return err
			}
			s, err := inbox.New(cfg, inbox.Deps{Logger: log, Listening: func(base string) {
				if tok != "" {
					fmt.Fprintf(stderr, "inbox: sign in at %s\n", inbox.LoginLink(strings.TrimSuffix(base, inbox.Prefix), tok))
				}
			}})
			if err != nil {
				return err
			}
			tok = s.DevToken()
			if err := s.Run(cmd.Context()); errors.Is(err, syscall.EADDRINUSE) {
				return listenError("--http", addr, "agora inbox", err)
			} else if err != nil {
				return err
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&addr, "http", envDefault("AGORA_INBOX_HTTP_ADDR", "127.0.0.1:8081"), "listen address (AGORA_INBOX_HTTP_ADDR)")
	cmd.Flags().BoolVar(&devToken, "dev-token", false, "sign in with one generated token instead of a users file (AGORA_INBOX_DEV_TOKEN=true)")
	return cmd
}
