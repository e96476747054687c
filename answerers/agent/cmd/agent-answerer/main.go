// Command agent-answerer answers the questions of one route by dispatching
// a sub-agent (see answerers/agent).
//
// Settings: AGORA_NATS_URL, AGORA_NATS_CREDS, AGORA_ANSWERER_ROUTE (default
// agents), AGORA_ANSWERER_CONCURRENCY (default 4), AGORA_AGENT_SUBAGENT
// (required), AGORA_AGENT_TIMEOUT (default 10m).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/agora-dispatch/agora/answerers/agent"
	"github.com/agora-dispatch/agora/internal/config"
	"github.com/agora-dispatch/agora/internal/logging"
	"github.com/agora-dispatch/agora/internal/svc"
	"github.com/agora-dispatch/agora/internal/telemetry"
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
}

func main() { os.Exit(run()) }

func run() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log, lerr := logging.New(os.Stderr)
	if lerr != nil {
		fmt.Fprintln(os.Stderr, "agent-answerer:", lerr)
		return 1
	}
	stopTraces, terr := telemetry.Start(ctx, "agora-agent-answerer", log)
	if terr != nil {
		fmt.Fprintln(os.Stderr, "agent-answerer:", terr)
		return 1
	}
	defer stopTraces()
	var s settings
	if err := config.Load(&s); err != nil {
		fmt.Fprintln(os.Stderr, "agent-answerer:", err)
		return 1
	}
	nc, err := svc.Connect("agent-answerer", "", s.NATSURL, s.NATSCreds, log)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer nc.Drain()
	c, err := client.New(nc)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	a, err := agent.New(c, agent.Config{Subagent: s.Subagent, Timeout: s.Timeout})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := answerer.Serve(ctx, nc, s.Route, a, answerer.WithLogger(log), answerer.WithConcurrency(s.Concurrency)); err != nil {
		log.Error("agent answerer failed", "err", err)
		return 1
	}
	return 0
}
