package auditlog

import (
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/agora-dispatch/agora/internal/config"
	"github.com/agora-dispatch/agora/pkg/audit"
)

// Config is the audit writer's configuration, read from AGORA_* variables
// with config.Load. The zero value of every field means its default.
type Config struct {
	// NATSURL is the NATS server to connect to when Deps.Conn is nil.
	NATSURL string `envconfig:"NATS_URL" default:"nats://127.0.0.1:4222"`
	// NATSCreds is a NATS credentials file.
	NATSCreds string `envconfig:"NATS_CREDS"`
	// CheckpointEvery writes a checkpoint entry after every this many
	// entries (whenever seq is a multiple of it).
	CheckpointEvery int `envconfig:"AUDIT_CHECKPOINT_EVERY" default:"1000"`
	// CheckpointInterval writes a checkpoint entry this long after the
	// last entry when anything was written or read since the last
	// checkpoint.
	CheckpointInterval time.Duration `envconfig:"AUDIT_CHECKPOINT_INTERVAL" default:"1h"`
	// SigningKeyFile is a PEM file of an Ed25519 private key (PKCS #8,
	// `openssl genpkey -algorithm ed25519`); when set, every checkpoint
	// is signed with it (docs/audit.md).
	SigningKeyFile string `envconfig:"AUDIT_SIGNING_KEY_FILE"`
	// HTTPAddr serves /metrics and /healthz when set.
	HTTPAddr string `envconfig:"AUDIT_HTTP_ADDR"`
}

func (c Config) withDefaults() Config { return config.Defaults(c) }

// Validate reports every problem at once, naming each variable.
func (c Config) Validate() error {
	var errs []error
	v := func(field string) string { return config.Var(c, field) }
	c = c.withDefaults()
	if c.CheckpointEvery < 1 {
		errs = append(errs, fmt.Errorf("%s=%d: want at least 1", v("CheckpointEvery"), c.CheckpointEvery))
	}
	if c.CheckpointInterval < time.Second {
		errs = append(errs, fmt.Errorf("%s=%s: want at least 1s", v("CheckpointInterval"), c.CheckpointInterval))
	}
	if c.SigningKeyFile != "" {
		if _, err := audit.ReadPrivateKey(c.SigningKeyFile); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", v("SigningKeyFile"), err))
		}
	}
	if c.HTTPAddr != "" {
		if _, _, err := net.SplitHostPort(c.HTTPAddr); err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: want host:port", v("HTTPAddr"), c.HTTPAddr))
		}
	}
	return errors.Join(errs...)
}
