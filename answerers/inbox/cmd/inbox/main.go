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
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/agora-dispatch/agora/answerers/inbox"
	"github.com/agora-dispatch/agora/internal/config"
	"github.com/agora-dispatch/agora/internal/logging"
	"github.com/agora-dispatch/agora/internal/telemetry"
)

func main() { os.Exit(run()) }

func run() int {
	if len(os.Args) > 1 {
		if os.Args[1] != "hash-password" {
			fmt.Fprintf(os.Stderr, "inbox: unknown command %q (the only one is hash-password; settings come from AGORA_* variables)\n", os.Args[1])
			return 2
		}
		return hashPassword()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log, lerr := logging.New(os.Stderr)
	if lerr != nil {
		fmt.Fprintln(os.Stderr, "inbox:", lerr)
		return 1
	}
	stopTraces, terr := telemetry.Start(ctx, "agora-inbox", log)
	if terr != nil {
		fmt.Fprintln(os.Stderr, "inbox:", terr)
		return 1
	}
	defer stopTraces()
	var cfg inbox.Config
	if err := config.Load(&cfg); err != nil {
		fmt.Fprintln(os.Stderr, "inbox:", err)
		return 1
	}
	if cfg.HTTPAddr == "" {
		cfg.HTTPAddr = "127.0.0.1:8081"
	}
	s, err := inbox.New(cfg, inbox.Deps{Logger: log})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if tok := s.DevToken(); tok != "" {
		scheme := "http"
		if cfg.TLSCert != "" {
			scheme = "https"
		}
		fmt.Fprintf(os.Stderr, "inbox: sign in at %s://%s%s/login?token=%s\n", scheme, cfg.HTTPAddr, inbox.Prefix, tok)
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for range hup {
			if err := s.ReloadUsers(); err != nil {
				log.Error("users file not reloaded; keeping the previous users", "err", err)
			}
		}
	}()
	if err := s.Run(ctx); err != nil {
		log.Error("inbox failed", "err", err)
		return 1
	}
	return 0
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
