package dispatcher

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/agora-dispatch/agora/internal/config"
	"github.com/agora-dispatch/agora/internal/principal"
	"github.com/agora-dispatch/agora/internal/retention"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
)

// Config is the dispatcher's configuration, read from AGORA_* variables
// with config.Load. The zero value of every field means its default.
type Config struct {
	// NATSURL is the NATS server to connect to when Deps.Conn is nil.
	NATSURL string `envconfig:"NATS_URL" default:"nats://127.0.0.1:4222"`
	// NATSCreds is a NATS credentials file.
	NATSCreds string `envconfig:"NATS_CREDS"`
	// HTTPAddr is where Run serves the HTTP API; empty serves nothing (the
	// handler can still be mounted elsewhere with Handler). A non-loopback
	// address needs APITokens.
	HTTPAddr string `envconfig:"HTTP_ADDR"`
	// APITokens are the bearer tokens the HTTP API accepts, comma
	// separated: operators' tokens, each an admin that sees and cancels
	// every thread. Empty, with no PrincipalsFile, means no
	// authentication, allowed on loopback only.
	APITokens []string `envconfig:"API_TOKENS"`
	// PrincipalsFile is a YAML file of named principals, each proven by
	// its token's SHA-256 and scoped: the sub-agents it may dispatch and
	// whether it sees only its own threads (docs/security.md,
	// "Principals and scopes").
	PrincipalsFile string `envconfig:"PRINCIPALS_FILE"`
	// ID names this instance in event sources (/agora/dispatcher/<id>);
	// default host-pid.
	ID string `envconfig:"DISPATCHER_ID"`
	// Concurrency bounds the requests handled at once per door.
	Concurrency int `envconfig:"DISPATCHER_CONCURRENCY" default:"64"`
	// ShutdownTimeout is how long in-flight requests may go on after a stop
	// request before they are abandoned (and redelivered later).
	ShutdownTimeout time.Duration `envconfig:"DISPATCHER_SHUTDOWN_TIMEOUT" default:"30s"`
	// SSEKeepalive is the interval of keepalive comments on /v1/events.
	SSEKeepalive time.Duration `envconfig:"SSE_KEEPALIVE" default:"15s"`
	// Provision makes the command create the streams, consumers and
	// buckets before it starts (New and Run never provision).
	Provision bool `envconfig:"PROVISION"`
	// ProvisionReplicas is the replica count Provision gives every stream,
	// bucket and consumer (1 to 5; 3 on a 3-node cluster).
	ProvisionReplicas int `envconfig:"PROVISION_REPLICAS" default:"1"`
	// ReconcileGrace is how old an acceptance whose dispatch has not
	// started must be before the reconciler completes it, and how often it
	// looks.
	ReconcileGrace time.Duration `envconfig:"DISPATCHER_RECONCILE_GRACE" default:"30s"`
	// ReconcileLookback is how far back the first pass after start reads.
	ReconcileLookback time.Duration `envconfig:"DISPATCHER_RECONCILE_LOOKBACK" default:"168h"`
	// Retention is how long finished work stays readable: when a thread
	// ends, its dispatch records, thread index, question records and
	// partial-state objects expire after it (docs/storage.md,
	// "Retention"). Nothing that waits or runs expires.
	Retention time.Duration `envconfig:"RETENTION" default:"168h"`
	// SandboxFloor, SandboxAllowPaths and SandboxAllowHosts are the
	// operator's floor (subagent.Floor; docs/sandbox.md, "The operator's
	// floor"): the weakest sandbox mode a definition may name (strict,
	// standard or off), and the path prefixes and destinations its
	// sandbox block may add (empty: any; "none": none). A request whose
	// definition is below the floor is refused, naming the setting.
	SandboxFloor      string   `envconfig:"SANDBOX_FLOOR" default:"standard"`
	SandboxAllowPaths []string `envconfig:"SANDBOX_ALLOW_PATHS"`
	SandboxAllowHosts []string `envconfig:"SANDBOX_ALLOW_HOSTS"`
}

// Floor returns the operator's sandbox floor the configuration sets.
func (c Config) Floor() subagent.Floor {
	return subagent.Floor{Mode: c.SandboxFloor, Paths: c.SandboxAllowPaths, Hosts: c.SandboxAllowHosts}
}

func (c Config) withDefaults() Config {
	if c.NATSURL == "" {
		c.NATSURL = "nats://127.0.0.1:4222"
	}
	if c.ID == "" {
		h, _ := os.Hostname()
		if h == "" || lifecycle.ValidToken(h) != nil {
			h = "dispatcher"
		}
		c.ID = fmt.Sprintf("%s-%d", h, os.Getpid())
	}
	if c.Concurrency == 0 {
		c.Concurrency = 64
	}
	if c.ReconcileGrace == 0 {
		c.ReconcileGrace = 30 * time.Second
	}
	if c.ReconcileLookback == 0 {
		c.ReconcileLookback = 7 * 24 * time.Hour
	}
	if c.Retention == 0 {
		c.Retention = retention.Default
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = 30 * time.Second
	}
	if c.SSEKeepalive == 0 {
		c.SSEKeepalive = 15 * time.Second
	}
	c.APITokens = config.List(c.APITokens)
	return c
}

// Validate reports every problem at once, naming each variable.
func (c Config) Validate() error {
	var errs []error
	v := func(field string) string { return config.Var(c, field) }
	if c.HTTPAddr != "" {
		loop, err := loopback(c.HTTPAddr)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("%s=%q: %v", v("HTTPAddr"), c.HTTPAddr, err))
		case !loop && len(config.List(c.APITokens)) == 0 && c.PrincipalsFile == "":
			errs = append(errs, fmt.Errorf("%s=%q is not a loopback address: refusing to serve the API there without authentication; set %s (comma-separated bearer tokens) or %s, or listen on 127.0.0.1",
				v("HTTPAddr"), c.HTTPAddr, v("APITokens"), v("PrincipalsFile")))
		}
	}
	if _, err := principal.Load(nil, c.PrincipalsFile); err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", v("PrincipalsFile"), err))
	}
	if c.ID != "" {
		if err := lifecycle.ValidToken(c.ID); err != nil || strings.Contains(c.ID, "/") {
			errs = append(errs, fmt.Errorf("%s=%q: want letters, digits, '-' or '_' (no dots, slashes or spaces)", v("ID"), c.ID))
		}
	}
	if c.ReconcileGrace < 0 || (c.ReconcileGrace > 0 && c.ReconcileGrace < 100*time.Millisecond) {
		errs = append(errs, fmt.Errorf("%s=%s: want at least 100ms", v("ReconcileGrace"), c.ReconcileGrace))
	}
	if c.ReconcileLookback < 0 {
		errs = append(errs, fmt.Errorf("%s=%s: must not be negative", v("ReconcileLookback"), c.ReconcileLookback))
	}
	if c.Retention < 0 || (c.Retention > 0 && c.Retention < time.Second) {
		errs = append(errs, fmt.Errorf("%s=%s: want at least 1s (finished work is kept this long)", v("Retention"), c.Retention))
	}
	if c.Concurrency < 0 || c.Concurrency > 4096 {
		errs = append(errs, fmt.Errorf("%s=%d: want 1 to 4096", v("Concurrency"), c.Concurrency))
	}
	if c.ShutdownTimeout < 0 {
		errs = append(errs, fmt.Errorf("%s=%s: must not be negative", v("ShutdownTimeout"), c.ShutdownTimeout))
	}
	if c.SSEKeepalive < 0 || (c.SSEKeepalive > 0 && c.SSEKeepalive < 100*time.Millisecond) {
		errs = append(errs, fmt.Errorf("%s=%s: want at least 100ms", v("SSEKeepalive"), c.SSEKeepalive))
	}
	if err := c.Floor().Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// loopback reports whether a host:port address listens on loopback only.
// An empty host or an unspecified address (0.0.0.0, ::) listens everywhere.
func loopback(addr string) (bool, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false, err
	}
	if strings.EqualFold(host, "localhost") {
		return true, nil
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback(), nil
}
