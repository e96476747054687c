package router

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/agora-dispatch/agora/internal/config"
	"github.com/agora-dispatch/agora/internal/retention"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// Config is the router's configuration, read from AGORA_* variables with
// config.Load. The zero value of every field means its default.
type Config struct {
	// NATSURL is the NATS server to connect to when Deps.Conn is nil.
	NATSURL string `envconfig:"NATS_URL" default:"nats://127.0.0.1:4222"`
	// NATSCreds is a NATS credentials file.
	NATSCreds string `envconfig:"NATS_CREDS"`
	// RoutesFile is the routing file (docs/router.md, "The routing file").
	// Empty: every question goes to the route `human` (DefaultRoutes).
	RoutesFile string `envconfig:"ROUTER_CONFIG"`
	// HTTPAddr serves /metrics and /healthz when set.
	HTTPAddr string `envconfig:"ROUTER_HTTP_ADDR"`
	// ID names this instance in event sources (/agora/router/<id>);
	// default host-pid.
	ID string `envconfig:"ROUTER_ID"`
	// Tick is how often stored deadlines, escalation steps and unpublished
	// events are checked.
	Tick time.Duration `envconfig:"ROUTER_TICK" default:"1s"`
	// CancelSweep is how often the router looks for cancel marks on the
	// records of paused dispatches, besides at start and after each
	// reconnect (docs/answering.md); it reads one record per waiting
	// question, so it is kept rare.
	CancelSweep time.Duration `envconfig:"ROUTER_CANCEL_SWEEP" default:"10m"`
	// Concurrency bounds the needs_input events, answers and deadline
	// actions handled at once.
	Concurrency int `envconfig:"ROUTER_CONCURRENCY" default:"16"`
	// RecordWait is how long a needs_input event waits for its dispatch
	// record (which holds the request settings a re-dispatch copies)
	// before the question is asked without it.
	RecordWait time.Duration `envconfig:"ROUTER_RECORD_WAIT" default:"10s"`
	// ShutdownTimeout is how long in-flight work may go on after a stop
	// request.
	ShutdownTimeout time.Duration `envconfig:"ROUTER_SHUTDOWN_TIMEOUT" default:"30s"`
	// Retention is how long finished work stays readable (the dispatcher's
	// AGORA_RETENTION): the delete markers the router leaves in
	// agora_decisions, when a question ends or a decision is forgotten,
	// expire after it (docs/storage.md, "Retention").
	Retention time.Duration `envconfig:"RETENTION" default:"168h"`
}

func (c Config) withDefaults() Config {
	if c.NATSURL == "" {
		c.NATSURL = "nats://127.0.0.1:4222"
	}
	if c.ID == "" {
		h, _ := os.Hostname()
		if h == "" || lifecycle.ValidToken(h) != nil || strings.Contains(h, "/") {
			h = "router"
		}
		c.ID = fmt.Sprintf("%s-%d", h, os.Getpid())
	}
	if c.Tick == 0 {
		c.Tick = time.Second
	}
	if c.CancelSweep == 0 {
		c.CancelSweep = 10 * time.Minute
	}
	if c.Concurrency == 0 {
		c.Concurrency = 16
	}
	if c.RecordWait == 0 {
		c.RecordWait = 10 * time.Second
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = 30 * time.Second
	}
	if c.Retention == 0 {
		c.Retention = retention.Default
	}
	return c
}

// Validate reports every problem at once, naming each variable.
func (c Config) Validate() error {
	var errs []error
	v := func(field string) string { return config.Var(c, field) }
	if c.ID != "" {
		if err := lifecycle.ValidToken(c.ID); err != nil || strings.Contains(c.ID, "/") {
			errs = append(errs, fmt.Errorf("%s=%q: want letters, digits, '-' or '_' (no dots, slashes or spaces)", v("ID"), c.ID))
		}
	}
	if c.Tick < 0 || (c.Tick > 0 && c.Tick < 10*time.Millisecond) {
		errs = append(errs, fmt.Errorf("%s=%s: want at least 10ms", v("Tick"), c.Tick))
	}
	if c.CancelSweep < 0 || (c.CancelSweep > 0 && c.CancelSweep < 10*time.Millisecond) {
		errs = append(errs, fmt.Errorf("%s=%s: want at least 10ms", v("CancelSweep"), c.CancelSweep))
	}
	if c.Concurrency < 0 || c.Concurrency > 4096 {
		errs = append(errs, fmt.Errorf("%s=%d: want 1 to 4096", v("Concurrency"), c.Concurrency))
	}
	if c.RecordWait < 0 {
		errs = append(errs, fmt.Errorf("%s=%s: must not be negative", v("RecordWait"), c.RecordWait))
	}
	if c.ShutdownTimeout < 0 {
		errs = append(errs, fmt.Errorf("%s=%s: must not be negative", v("ShutdownTimeout"), c.ShutdownTimeout))
	}
	if c.Retention < 0 || (c.Retention > 0 && c.Retention < time.Second) {
		errs = append(errs, fmt.Errorf("%s=%s: want at least 1s (finished work is kept this long)", v("Retention"), c.Retention))
	}
	if c.RoutesFile != "" {
		if _, err := os.Stat(c.RoutesFile); err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: %v", v("RoutesFile"), c.RoutesFile, err))
		}
	}
	return errors.Join(errs...)
}
