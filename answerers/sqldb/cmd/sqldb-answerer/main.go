// Command sqldb-answerer answers the questions of one route with a SQL
// query (see answerers/sqldb).
//
// Settings: AGORA_NATS_URL, AGORA_NATS_CREDS, AGORA_ANSWERER_ROUTE (default
// data), AGORA_ANSWERER_CONCURRENCY (default 4), AGORA_SQLDB_DSN and
// AGORA_SQLDB_QUERY (required), AGORA_SQLDB_DRIVER (sqlite or pgx; default
// from the DSN), AGORA_SQLDB_TIMEOUT (default 10s).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/agora-dispatch/agora/answerers/sqldb"
	"github.com/agora-dispatch/agora/internal/config"
	"github.com/agora-dispatch/agora/internal/logging"
	"github.com/agora-dispatch/agora/internal/svc"
	"github.com/agora-dispatch/agora/internal/telemetry"
	"github.com/agora-dispatch/agora/pkg/answerer"
)

type settings struct {
	NATSURL     string        `envconfig:"NATS_URL" default:"nats://127.0.0.1:4222"`
	NATSCreds   string        `envconfig:"NATS_CREDS"`
	Route       string        `envconfig:"ANSWERER_ROUTE" default:"data"`
	Concurrency int           `envconfig:"ANSWERER_CONCURRENCY" default:"4"`
	DSN         string        `envconfig:"SQLDB_DSN" required:"true"`
	Query       string        `envconfig:"SQLDB_QUERY" required:"true"`
	Driver      string        `envconfig:"SQLDB_DRIVER"`
	Timeout     time.Duration `envconfig:"SQLDB_TIMEOUT" default:"10s"`
}

func main() { os.Exit(run()) }

func run() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log, lerr := logging.New(os.Stderr)
	if lerr != nil {
		fmt.Fprintln(os.Stderr, "sqldb-answerer:", lerr)
		return 1
	}
	stopTraces, terr := telemetry.Start(ctx, "agora-sqldb-answerer", log)
	if terr != nil {
		fmt.Fprintln(os.Stderr, "sqldb-answerer:", terr)
		return 1
	}
	defer stopTraces()
	var s settings
	if err := config.Load(&s); err != nil {
		fmt.Fprintln(os.Stderr, "sqldb-answerer:", err)
		return 1
	}
	a, err := sqldb.Open(sqldb.Config{DSN: s.DSN, Driver: s.Driver, Query: s.Query, Timeout: s.Timeout})
	if err != nil {
		fmt.Fprintln(os.Stderr, "sqldb-answerer:", err)
		return 1
	}
	defer a.Close()
	nc, err := svc.Connect("sqldb-answerer", "", s.NATSURL, s.NATSCreds, log)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer nc.Drain()
	if err := answerer.Serve(ctx, nc, s.Route, a, answerer.WithLogger(log), answerer.WithConcurrency(s.Concurrency)); err != nil {
		log.Error("sqldb answerer failed", "err", err)
		return 1
	}
	return 0
}
