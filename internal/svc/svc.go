// Package svc holds the wiring every Agora service repeats: connecting to
// NATS from its settings and choosing where its metrics go.
package svc

import (
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
)

// Connect opens a NATS connection for a service instance that reconnects
// forever. creds, when set, is a credentials file. The error names the
// setting to fix (AGORA_NATS_URL) and the usual cause.
func Connect(service, id, url, creds string) (*nats.Conn, error) {
	name := "agora-" + service
	if id != "" {
		name += " " + id
	}
	opts := []nats.Option{nats.Name(name), nats.MaxReconnects(-1)}
	if creds != "" {
		opts = append(opts, nats.UserCredentials(creds))
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, fmt.Errorf("%s: cannot reach NATS at %s (AGORA_NATS_URL): %w — is `agora dev` or a NATS server running?", service, url, err)
	}
	return nc, nil
}

// Registry returns where a service registers its metrics and what serves
// them: reg itself when given (and its Gatherer, if it is one), otherwise a
// new registry of the service's own.
func Registry(reg prometheus.Registerer) (prometheus.Registerer, prometheus.Gatherer) {
	if reg == nil {
		r := prometheus.NewRegistry()
		return r, r
	}
	g, _ := reg.(prometheus.Gatherer)
	return reg, g
}
