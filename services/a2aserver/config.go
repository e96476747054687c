package a2aserver

import (
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/agora-dispatch/agora/internal/config"
	"github.com/agora-dispatch/agora/internal/hook"
	"github.com/agora-dispatch/agora/internal/principal"
)

// Config is the A2A server's configuration, read from AGORA_* variables
// with config.Load. The zero value of every field means its default.
type Config struct {
	// APITokens are the bearer tokens /a2a accepts: the same variable as
	// the dispatcher's /v1 API. Empty, with no PrincipalsFile, means no
	// authentication (the caller is "local").
	APITokens []string `envconfig:"API_TOKENS"`
	// PrincipalsFile is the dispatcher's principals file (the same
	// variable): named, scoped principals, each owning the tasks it
	// starts (docs/security.md, "Principals and scopes").
	PrincipalsFile string `envconfig:"PRINCIPALS_FILE"`
	// PublicURL is where clients reach the listener, e.g.
	// https://agora.example.com; the agent card names
	// <PublicURL>/a2a. Empty: the URL of the request that read the card.
	PublicURL string `envconfig:"A2A_PUBLIC_URL"`
	// PushSecret signs every push notification (X-Agora-Signature, as the
	// webhook notifier signs its POSTs); at least 16 bytes. Empty: push
	// notifications are not offered (docs/a2a.md, "Push notifications").
	PushSecret string `envconfig:"A2A_PUSH_SECRET"`
	// PushAllowPrivate lets push notifications go to loopback, private,
	// link-local and other non-public addresses. For tests and trusted
	// set-ups only.
	PushAllowPrivate bool `envconfig:"A2A_PUSH_ALLOW_PRIVATE"`
	// PushAttempts is how many times one notification is POSTed before it
	// is dropped.
	PushAttempts int `envconfig:"A2A_PUSH_ATTEMPTS" default:"5"`
	// PushBackoff is the wait after the first failed POST; it doubles up
	// to 30s. A 429 or 503 with Retry-After waits what it says.
	PushBackoff time.Duration `envconfig:"A2A_PUSH_BACKOFF" default:"1s"`
	// PushTimeout bounds one POST.
	PushTimeout time.Duration `envconfig:"A2A_PUSH_TIMEOUT" default:"10s"`
}

// withDefaults trims APITokens.
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
	if _, err := principal.Load(nil, c.PrincipalsFile); err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", v("PrincipalsFile"), err))
	}
	if c.PublicURL != "" {
		u, err := url.Parse(c.PublicURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("%s=%q: want an http or https URL, as in https://agora.example.com", v("PublicURL"), c.PublicURL))
		}
	}
	if c.PushSecret != "" && len(c.PushSecret) < 16 {
		errs = append(errs, fmt.Errorf("%s: want a secret of at least 16 bytes (it signs every push notification)", v("PushSecret")))
	}
	errs = append(errs, hook.CheckDelivery(c.PushAttempts, c.PushBackoff, c.PushTimeout, v("PushAttempts"), v("PushBackoff"), v("PushTimeout"))...)
	return errors.Join(errs...)
}
