// Command agora is Agora's command-line interface: `agora dev` runs
// everything in one process on an embedded NATS server; the other verbs are
// clients and tools.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/agora-dispatch/agora/internal/subagentmcp"
	"github.com/agora-dispatch/agora/internal/termsafe"
)

func main() {
	// `agora` is the worker's binary in `agora dev`: it serves a
	// claude-code run's require_input MCP server when asked to.
	subagentmcp.ServeIfAsked()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRoot().ExecuteContext(ctx)
	stop()
	if err != nil {
		var ec exitCoder
		code := 1
		if asExit(err, &ec) {
			code = ec.ExitCode()
		}
		if msg := err.Error(); msg != "" {
			fmt.Fprintln(termsafe.NewWriter(os.Stderr), "agora:", msg)
		}
		os.Exit(code)
	}
}
