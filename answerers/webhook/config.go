package webhook

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"time"

	"github.com/agora-dispatch/agora/internal/config"
	"github.com/agora-dispatch/agora/internal/hook"
	"github.com/agora-dispatch/agora/pkg/seal"
)

// Config is the webhook notifier's configuration, read from AGORA_*
// variables with config.Load.
type Config struct {
	// NATSURL is the NATS server to connect to when Deps has no
	// connection.
	NATSURL string `envconfig:"NATS_URL" default:"nats://127.0.0.1:4222"`
	// NATSCreds is a NATS credentials file.
	NATSCreds string `envconfig:"NATS_CREDS"`
	// Routes are the routes whose questions are posted (comma-separated).
	Routes []string `envconfig:"WEBHOOK_ROUTES"`
	// URL receives one POST per question.
	URL string `envconfig:"WEBHOOK_URL"`
	// Secret signs every POST (X-Agora-Signature); at least 16 bytes.
	Secret string `envconfig:"WEBHOOK_SECRET"`
	// LinkKey is the key of signed answer links, shared with the inbox
	// that serves them (AGORA_ANSWER_LINK_KEY). Empty: the body has no
	// links; answers come through the answer door.
	LinkKey string `envconfig:"ANSWER_LINK_KEY"`
	// InboxURL is the inbox as people open it (the links point there and
	// the body names the question's page). Required with LinkKey.
	InboxURL string `envconfig:"WEBHOOK_INBOX_URL"`
	// Audience is who the links are minted for: it becomes answered_by.
	// Default "webhook:<host of URL>".
	Audience string `envconfig:"WEBHOOK_AUDIENCE"`
	// AudienceLabel names a question label (a dispatch label such as
	// assignee) whose value, when set, is the audience instead.
	AudienceLabel string `envconfig:"WEBHOOK_AUDIENCE_LABEL"`
	// Attempts is how many times a question is posted before it is
	// declined to the route's fallback.
	Attempts int `envconfig:"WEBHOOK_ATTEMPTS" default:"5"`
	// Backoff is the wait after the first failed attempt; it doubles up to
	// 30s. A 429 or 503 with Retry-After waits what it says.
	Backoff time.Duration `envconfig:"WEBHOOK_BACKOFF" default:"1s"`
	// Timeout bounds one POST.
	Timeout time.Duration `envconfig:"WEBHOOK_TIMEOUT" default:"10s"`
	// HTTPAddr serves /healthz and /metrics when set.
	HTTPAddr string `envconfig:"WEBHOOK_HTTP_ADDR"`
}

var routeRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// withDefaults gives every zero field its documented default (its
// default tag, or for Audience the one its comment names) and trims Routes.
func (c Config) withDefaults() Config {
	c = config.Defaults(c)
	c.Routes = config.List(c.Routes)
	if c.Audience == "" {
		if u, err := url.Parse(c.URL); err == nil {
			c.Audience = "webhook:" + u.Host
		}
	}
	return c
}

// Validate reports every problem at once, naming each variable.
func (c Config) Validate() error {
	var errs []error
	v := func(field string) string { return config.Var(c, field) }
	c = c.withDefaults()
	if len(c.Routes) == 0 {
		errs = append(errs, fmt.Errorf("%s: name the routes whose questions are posted (comma-separated)", v("Routes")))
	}
	for _, r := range c.Routes {
		if !routeRE.MatchString(r) {
			errs = append(errs, fmt.Errorf("%s: route %q: want 1-64 letters, digits, '-' or '_'", v("Routes"), r))
		}
	}
	if u, err := url.Parse(c.URL); c.URL == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		errs = append(errs, fmt.Errorf("%s=%q: want the http or https URL that receives the questions", v("URL"), c.URL))
	}
	if len(c.Secret) < 16 {
		errs = append(errs, fmt.Errorf("%s: want a secret of at least 16 bytes (it signs every POST)", v("Secret")))
	}
	if c.LinkKey != "" {
		if _, err := seal.DecodeKey(c.LinkKey); err != nil {
			errs = append(errs, fmt.Errorf("%s: %v", v("LinkKey"), err))
		}
		if u, err := url.Parse(c.InboxURL); c.InboxURL == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("%s=%q: with %s, want the inbox's http or https URL (the links point there)", v("InboxURL"), c.InboxURL, v("LinkKey")))
		}
	}
	errs = append(errs, hook.CheckDelivery(c.Attempts, c.Backoff, c.Timeout, v("Attempts"), v("Backoff"), v("Timeout"))...)
	if c.HTTPAddr != "" {
		if _, _, err := net.SplitHostPort(c.HTTPAddr); err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: want host:port", v("HTTPAddr"), c.HTTPAddr))
		}
	}
	return errors.Join(errs...)
}
