package a2aserver

import (
	"errors"
	"fmt"
	"net/url"

	"github.com/agora-dispatch/agora/internal/config"
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
	return errors.Join(errs...)
}
