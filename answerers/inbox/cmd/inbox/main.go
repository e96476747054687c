// Command inbox serves Agora's web inbox, where people answer the
// questions sub-agents ask (see answerers/inbox).
//
// Settings: AGORA_NATS_URL, AGORA_NATS_CREDS, AGORA_INBOX_HTTP_ADDR
// (default 127.0.0.1:8081), AGORA_INBOX_USERS (a users file) or
// AGORA_INBOX_DEV_TOKEN=true (print one generated token),
// AGORA_INBOX_ROUTES, AGORA_INBOX_SESSION_TTL, AGORA_INBOX_LOGIN_ATTEMPTS,
// AGORA_INBOX_LOGIN_WINDOW, AGORA_INBOX_TRUST_PROXY, AGORA_INBOX_PENDING_ROWS, AGORA_ANSWER_LINK_KEY
// (signed answer links), AGORA_INBOX_TLS_CERT and AGORA_INBOX_TLS_KEY.
// SIGHUP reloads the users file; an invalid file keeps the previous one.
//
// `inbox hash-password` reads a password on standard input and prints its
// bcrypt hash for the users file.
package main

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/agora-dispatch/agora/answerers/inbox"
	"github.com/agora-dispatch/agora/internal/svc"
)

func main() {
	if len(os.Args) > 1 {
		if os.Args[1] != "hash-password" {
			fmt.Fprintf(os.Stderr, "inbox: unknown command %q (the only one is hash-password; settings come from AGORA_* variables)\n", os.Args[1])
			os.Exit(2)
		}
		os.Exit(hashPassword())
	}
	os.Exit(svc.Main("inbox", func(_ context.Context, cfg inbox.Config, log *slog.Logger) (svc.Runner, error) {
		if cfg.HTTPAddr == "" {
			cfg.HTTPAddr = "127.0.0.1:8081"
		}
		s, err := inbox.New(cfg, inbox.Deps{Logger: log})
		if err != nil {
			return nil, err
		}
		if tok := s.DevToken(); tok != "" {
			scheme := "http"
			if cfg.TLSCert != "" {
				scheme = "https"
			}
			fmt.Fprintf(os.Stderr, "inbox: sign in at %s\n", inbox.LoginLink(scheme+"://"+cfg.HTTPAddr, tok))
		}
		return reloader{s, log}, nil
	}))
}

// reloader rereads the inbox's users file on SIGHUP; an invalid file keeps
// the previous users.
type reloader struct {
	*inbox.Server
	log *slog.Logger
}

func (r reloader) Reload() error {
	err := r.ReloadUsers()
	if err != nil {
		r.log.Error("users file not reloaded; keeping the previous users", "err", err)
	}
	return err
}

func hashPassword() int {
	sc := bufio.NewScanner(os.Stdin)
	if !sc.Scan() {
		fmt.Fprintln(os.Stderr, "inbox: hash-password: give the password on standard input")
		return 1
	}
	h, err := inbox.HashPassword(strings.TrimRight(sc.Text(), "\r\n"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(h)
	return 0
}
