// Command agent-answerer answers the questions of one route by dispatching
// a sub-agent (see answerers/agent).
//
// Settings: AGORA_NATS_URL, AGORA_NATS_CREDS, AGORA_ANSWERER_ROUTE (default
// agents), AGORA_ANSWERER_CONCURRENCY (default 4), AGORA_AGENT_SUBAGENT
// (required), AGORA_AGENT_TIMEOUT (default 10m).
package main

import (
	"context"
	"log/slog"
	"os"
	"time"

	"github.com/agora-dispatch/agora/answerers/agent"
	"github.com/agora-dispatch/agora/internal/svc"
	"github.com/agora-dispatch/agora/pkg/answerer"
	"github.com/agora-dispatch/agora/pkg/client"
)

type settings struct {
	NATSURL     string        `envconfig:"NATS_URL" default:"nats://127.0.0.1:4222"`
	NATSCreds   string        `envconfig:"NATS_CREDS"`
	Route       string        `envconfig:"ANSWERER_ROUTE" default:"agents"`
	Concurrency int           `envconfig:"ANSWERER_CONCURRENCY" default:"4"`
	Subagent    string        `envconfig:"AGENT_SUBAGENT" required:"true"`
	Timeout     time.Duration `envconfig:"AGENT_TIMEOUT" default:"10m"`
	// Caller is the NATS user this answerer connects as when it is granted
	// only its own API subjects (deploy/nats: answerer-agents); its
	// dispatches are then that principal's (docs/security.md, "The NATS API").
	Caller string `envconfig:"AGENT_CALLER"`
}

func main() {
	os.Exit(svc.Main("agent-answerer", func(_ context.Context, s settings, log *slog.Logger) (svc.Runner, error) {
		return svc.RunFunc(func(ctx context.Context) error {
			nc, err := svc.Connect("agent-answerer", "", s.NATSURL, s.NATSCreds, log)
			if err != nil {
				return err
			}
			defer nc.Drain()
			var opts []client.Option
			if s.Caller != "" {
				opts = append(opts, client.WithCaller(s.Caller))
			}
			c, err := client.New(nc, opts...)
			if err != nil {
				return err
			}
			a, err := agent.New(c, agent.Config{Subagent: s.Subagent, Timeout: s.Timeout})
			if err != nil {
				return err
			}
			return answerer.Serve(ctx, nc, s.Route, a, answerer.WithLogger(log), answerer.WithConcurrency(s.Concurrency))
		}), nil
	}))
}
