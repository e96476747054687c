package mcpserver

import (
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/agora-dispatch/agora/internal/config"
	"github.com/agora-dispatch/agora/internal/principal"
	"github.com/agora-dispatch/agora/pkg/seal"
)

// Config is the MCP server's configuration, read from AGORA_* variables
// with config.Load. The zero value of every field means its default.
type Config struct {
	// NATSURL is the NATS server to connect to when Deps has no client.
	NATSURL string `envconfig:"NATS_URL" default:"nats://127.0.0.1:4222"`
	// NATSCreds is a NATS credentials file.
	NATSCreds string `envconfig:"NATS_CREDS"`
	// HTTPAddr makes Run serve the streamable HTTP transport at /mcp on
	// this address. A non-loopback address needs APITokens.
	HTTPAddr string `envconfig:"MCP_HTTP_ADDR"`
	// APITokens are the bearer tokens the HTTP transport accepts (the
	// same variable as the dispatcher's /v1 API). Empty means no
	// authentication, allowed on loopback only.
	APITokens []string `envconfig:"API_TOKENS"`
	// PrincipalsFile is the dispatcher's principals file (the same
	// variable): named, scoped principals, each seeing only its own
	// threads unless its scope says more (docs/security.md, "Principals
	// and scopes").
	PrincipalsFile string `envconfig:"PRINCIPALS_FILE"`
	// StateKey seals the requestState of input-required results: 32
	// bytes, base64 (standard or URL alphabet). Empty: a random key per
	// process, so states do not survive a restart (agora dev keeps one in
	// its data folder).
	StateKey string `envconfig:"MCP_STATE_KEY"`
	// StateTTL is how long a requestState may be answered.
	StateTTL time.Duration `envconfig:"MCP_STATE_TTL" default:"1h"`
	// WaitCap bounds one agora_dispatch call: past it the tool returns
	// {status: "running", thread_id} and the model calls again with the
	// thread_id to keep following.
	WaitCap time.Duration `envconfig:"MCP_WAIT_CAP" default:"5m"`
	// ProgressEvery is how often a following call sends a progress
	// notification when nothing happens, so clients do not time out.
	ProgressEvery time.Duration `envconfig:"MCP_PROGRESS_EVERY" default:"10s"`
	// SessionIdle closes an HTTP session (protocols before 2026-07-28)
	// that has seen no request for this long; MaxSessions bounds the
	// sessions one principal has open at once (docs/mcp.md).
	SessionIdle time.Duration `envconfig:"MCP_SESSION_IDLE" default:"30m"`
	MaxSessions int           `envconfig:"MCP_MAX_SESSIONS" default:"32"`
}

// withDefaults gives every zero field its documented default (its
// default tag) and trims APITokens.
func (c Config) withDefaults() Config {
	c = config.Defaults(c)
	c.APITokens = config.List(c.APITokens)
	return c
}

// Validate reports every problem at once, each naming its variable.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	v := func(field string) string { return config.Var(c, field) }
	if c.HTTPAddr != "" {
		host, _, err := net.SplitHostPort(c.HTTPAddr)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("%s=%q: want host:port, as in 127.0.0.1:8090", v("HTTPAddr"), c.HTTPAddr))
		case !loopback(host) && len(c.APITokens) == 0 && c.PrincipalsFile == "":
			errs = append(errs, fmt.Errorf("%s=%s is reachable from other hosts: set %s (bearer tokens) or %s, or listen on 127.0.0.1", v("HTTPAddr"), c.HTTPAddr, v("APITokens"), v("PrincipalsFile")))
		}
	}
	if _, err := principal.Load(nil, c.PrincipalsFile); err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", v("PrincipalsFile"), err))
	}
	if c.StateKey != "" {
		if _, err := seal.DecodeKey(c.StateKey); err != nil {
			errs = append(errs, fmt.Errorf("%s: %v", v("StateKey"), err))
		}
	}
	if c.StateTTL < time.Minute || c.StateTTL > 24*time.Hour {
		errs = append(errs, fmt.Errorf("%s=%s: want 1m to 24h", v("StateTTL"), c.StateTTL))
	}
	if c.WaitCap < time.Second {
		errs = append(errs, fmt.Errorf("%s=%s: want at least 1s", v("WaitCap"), c.WaitCap))
	}
	if c.SessionIdle < 10*time.Millisecond {
		errs = append(errs, fmt.Errorf("%s=%s: want at least 10ms", v("SessionIdle"), c.SessionIdle))
	}
	if c.MaxSessions < 1 {
		errs = append(errs, fmt.Errorf("%s=%d: want at least 1", v("MaxSessions"), c.MaxSessions))
	}
	if c.ProgressEvery < 100*time.Millisecond {
		errs = append(errs, fmt.Errorf("%s=%s: want at least 100ms", v("ProgressEvery"), c.ProgressEvery))
	}
	return errors.Join(errs...)
}

// loopback reports whether a listen host is reachable only from this
// machine.
func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
