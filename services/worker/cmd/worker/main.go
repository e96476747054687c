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
	"log/slog"
	"os"

	"github.com/agora-dispatch/agora/internal/subagentmcp"
	"github.com/agora-dispatch/agora/internal/svc"
	"github.com/agora-dispatch/agora/services/worker"
)

func main() {
	// A claude-code run's require_input MCP server is this binary.
	subagentmcp.ServeIfAsked()
	once := flag.Bool("once", false, "handle exactly one dispatch, then exit")
	flag.Parse()
	os.Exit(svc.Main("worker", func(_ context.Context, cfg worker.Config, log *slog.Logger) (svc.Runner, error) {
		s, err := worker.New(cfg, worker.Deps{Logger: log})
		if err != nil || !*once {
			return s, err
		}
		return svc.RunFunc(func(ctx context.Context) error {
			out, err := s.RunOnce(ctx)
			if err != nil {
				return err
			}
			return svc.Exit(worker.ExitCode(out))
		}), nil
	}))
}
