package svc

import (
	"log/slog"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
)

// Deps are a service's collaborators, beside its Config. Every field is
// optional.
type Deps struct {
	// Conn is an existing NATS connection, which stays the caller's; when
	// nil, New connects to Config.NATSURL and Run closes that connection.
	Conn *nats.Conn
	// Logger receives structured logs; default slog.Default().
	Logger *slog.Logger
	// Registerer receives the service's metrics; default a new registry
	// served on /metrics by the service's Handler.
	Registerer prometheus.Registerer
}
