// Command worker runs Agora sub-agents for dispatches taken from JetStream.
//
//	worker          serve until SIGINT/SIGTERM
//	worker --once   handle exactly one dispatch and exit: 0 finished or
//	                needs_input, the runtime's exit code for provider-failed,
//	                1 otherwise
//
// Settings come from AGORA_* variables (see the README).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/agora-dispatch/agora/internal/config"
	"github.com/agora-dispatch/agora/internal/logging"
	"github.com/agora-dispatch/agora/internal/subagentmcp"
	"github.com/agora-dispatch/agora/internal/telemetry"
	"github.com/agora-dispatch/agora/services/worker"
)

func main() {
	// A claude-code run's require_input MCP server is this binary.
	subagentmcp.ServeIfAsked()
	os.Exit(run())
}

func run() int {
	once := flag.Bool("once", false, "handle exactly one dispatch, then exit")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log, lerr := logging.New(os.Stderr)
	if lerr != nil {
		fmt.Fprintln(os.Stderr, "worker:", lerr)
		return 1
	}
	stopTraces, terr := telemetry.Start(ctx, "agora-worker", log)
	if terr != nil {
		fmt.Fprintln(os.Stderr, "worker:", terr)
		return 1
	}
	defer stopTraces()

	var cfg worker.Config
	if err := config.Load(&cfg); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	svc, err := worker.New(cfg, worker.Deps{Logger: log})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if !*once {
		if err := svc.Run(ctx); err != nil {
			log.Error("worker failed", "err", err)
			return 1
		}
		return 0
	}
	out, err := svc.RunOnce(ctx)
	if err != nil {
		log.Error("worker failed", "err", err)
		return 1
	}
	return worker.ExitCode(out)
}
