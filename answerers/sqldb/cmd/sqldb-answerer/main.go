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
	"log/slog"
	"os"
	"time"

	"github.com/agora-dispatch/agora/answerers/sqldb"
	"github.com/agora-dispatch/agora/internal/svc"
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

func main() {
	os.Exit(svc.Main("sqldb-answerer", func(_ context.Context, s settings, log *slog.Logger) (svc.Runner, error) {
		a, err := sqldb.Open(sqldb.Config{DSN: s.DSN, Driver: s.Driver, Query: s.Query, Timeout: s.Timeout})
		if err != nil {
			return nil, err
		}
		return svc.RunFunc(func(ctx context.Context) error {
			defer a.Close()
			nc, err := svc.Connect("sqldb-answerer", "", s.NATSURL, s.NATSCreds, log)
			if err != nil {
				return err
			}
			defer nc.Drain()
			return answerer.Serve(ctx, nc, s.Route, a, answerer.WithLogger(log), answerer.WithConcurrency(s.Concurrency))
		}), nil
	}))
}
