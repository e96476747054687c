package main

import (
	"errors"
	"os"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/agora-dispatch/agora/internal/config"
	"github.com/agora-dispatch/agora/internal/logging"
	"github.com/agora-dispatch/agora/services/mcpserver"
)

func newMCPCmd(g *globals) *cobra.Command {
	var httpAddr string
	cmd := &cobra.Command{
		Use:   "mcp [--http ADDR]",
		Short: "Serve Agora's tools to an orchestrator agent over MCP (stdio, or HTTP with --http)",
		Long: `mcp serves Agora to an MCP client (Claude Code, or any other): tools to
dispatch sub-agents and follow their threads (agora_dispatch), answer and list
questions (agora_answer, agora_questions), and read status and events, cancel,
and list sub-agents. When a thread asks a question, the client's user is
asked for the answer (MCP input-required results, or elicitation). A client
that declares the MCP Tasks extension gets agora_dispatch's thread as a task
instead: tasks/get polls it, tasks/update answers its question, tasks/cancel
cancels it, across connections and restarts (docs/mcp.md, "Tasks").

Without --http it serves one session on stdin/stdout, answering as
mcp:<who the NATS credentials prove> (the creds file's user name, the URL's
user, or local on a server that takes anyone; $USER plays no part):

  claude mcp add agora -- agora mcp --nats nats://127.0.0.1:4222

With --http ADDR it serves the streamable HTTP transport at http://ADDR/mcp,
with the bearer tokens of AGORA_API_TOKENS (required on a non-loopback
address). agora dev serves the same at /mcp on its own listener.

Settings: AGORA_MCP_STATE_KEY (32 bytes, base64; seals the requestState),
AGORA_MCP_STATE_TTL (1h), AGORA_MCP_WAIT_CAP (5m: one call's longest wait
before it returns status running), AGORA_MCP_PROGRESS_EVERY (10s).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var cfg mcpserver.Config
			if err := config.Load(&cfg); err != nil {
				return err
			}
			cfg.NATSURL, cfg.NATSCreds, cfg.HTTPAddr = g.natsURL, g.creds, httpAddr
			if httpAddr != "" {
				if err := checkListenAddr("--http", httpAddr); err != nil {
					return err
				}
			}
			if err := cfg.Validate(); err != nil {
				return err
			}
			c, err := g.connect(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			defer c.Close()
			// stdout carries the protocol: logs go to stderr only.
			log, err := logging.New(os.Stderr)
			if err != nil {
				return err
			}
			svc, err := mcpserver.New(cmd.Context(), cfg, mcpserver.Deps{Client: c, Logger: log})
			if err != nil {
				return err
			}
			defer svc.Close()
			if httpAddr != "" {
				if err := svc.Run(cmd.Context()); errors.Is(err, syscall.EADDRINUSE) {
					return listenError("--http", httpAddr, "agora mcp", err)
				} else if err != nil {
					return err
				}
				return nil
			}
			// The session's user is who its NATS credentials prove.
			who, err := credentialName(g.natsURL, g.creds)
			if err != nil {
				return err
			}
			return svc.ServeStdio(cmd.Context(), who)
		},
	}
	cmd.Flags().StringVar(&httpAddr, "http", envDefault("AGORA_MCP_HTTP_ADDR", ""), "serve streamable HTTP at http://ADDR/mcp instead of stdio (AGORA_MCP_HTTP_ADDR)")
	return cmd
}
