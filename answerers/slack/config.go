package slack

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/agora-dispatch/agora/internal/config"
)

// Config is the Slack answerer's configuration, read from AGORA_*
// variables with config.Load. The zero value of every field but the
// secrets and the settings file means its default.
type Config struct {
	// NATSURL is the NATS server to connect to when Deps has no
	// connection.
	NATSURL string `envconfig:"NATS_URL" default:"nats://127.0.0.1:4222"`
	// NATSCreds is a NATS credentials file.
	NATSCreds string `envconfig:"NATS_CREDS"`
	// BotToken is the app's bot token (xoxb-…). It travels only in the
	// Authorization header of Web API calls and never reaches a log line.
	BotToken string `envconfig:"SLACK_BOT_TOKEN"`
	// SigningSecret is the app's signing secret: every interactivity
	// request over HTTP must carry a valid signature made with it.
	// Required unless AppToken is set.
	SigningSecret string `envconfig:"SLACK_SIGNING_SECRET"`
	// AppToken is an app-level token (xapp-…, scope connections:write):
	// Run then also receives interactions over Socket Mode, so Slack
	// needs no public URL. Without SigningSecret, Handler refuses every
	// HTTP interaction.
	AppToken string `envconfig:"SLACK_APP_TOKEN"`
	// SettingsFile is the YAML file naming the routes served and where
	// each one's questions go (see Settings).
	SettingsFile string `envconfig:"SLACK_SETTINGS"`
	// InboxURL is the inbox's base URL (as in https://agora.example.com/inbox):
	// messages link each question to <InboxURL>/questions/<question_id>.
	// Empty: no link.
	InboxURL string `envconfig:"SLACK_INBOX_URL"`
	// HTTPAddr makes Run serve Handler (and /metrics) on this address.
	// Empty: the caller mounts Handler on its own server (agora dev).
	HTTPAddr string `envconfig:"SLACK_HTTP_ADDR"`
	// APIURL is the Slack Web API's base URL, ending in a slash.
	APIURL string `envconfig:"SLACK_API_URL" default:"https://slack.com/api/"`
	// PostAttempts is how many times a message is posted before the
	// question is declined to the route's fallback.
	PostAttempts int `envconfig:"SLACK_POST_ATTEMPTS" default:"5"`
	// RetryBackoff is the wait after a failed call that named none (a 5xx,
	// a network error); it doubles up to 30s. A 429 waits its Retry-After.
	RetryBackoff time.Duration `envconfig:"SLACK_RETRY_BACKOFF" default:"1s"`
	// MaxRetryAfter caps one Retry-After wait; a longer one counts as a
	// failed attempt after waiting the cap.
	MaxRetryAfter time.Duration `envconfig:"SLACK_MAX_RETRY_AFTER" default:"2m"`
	// ContextChars is how much of a question's context a message shows.
	ContextChars int `envconfig:"SLACK_CONTEXT_CHARS" default:"500"`
	// ShutdownTimeout bounds the wait for in-flight work on stop.
	ShutdownTimeout time.Duration `envconfig:"SLACK_SHUTDOWN_TIMEOUT" default:"10s"`
}

// withDefaults gives every zero field its documented default (its
// default tag).
func (c Config) withDefaults() Config { return config.Defaults(c) }

// Validate reports every problem at once, naming each variable. It does
// not read the settings file (New does).
func (c Config) Validate() error {
	var errs []error
	v := func(field string) string { return config.Var(c, field) }
	if c.BotToken == "" {
		errs = append(errs, fmt.Errorf("%s: required (the app's bot token, xoxb-…)", v("BotToken")))
	}
	if c.SigningSecret == "" && c.AppToken == "" {
		errs = append(errs, fmt.Errorf("%s (HTTP interactivity) or %s (Socket Mode): set at least one", v("SigningSecret"), v("AppToken")))
	}
	if c.AppToken != "" && !strings.HasPrefix(c.AppToken, "xapp-") {
		errs = append(errs, fmt.Errorf("%s: want an app-level token (xapp-…)", v("AppToken")))
	}
	if c.SettingsFile == "" {
		errs = append(errs, fmt.Errorf("%s: required (the routes and their channels)", v("SettingsFile")))
	}
	if c.InboxURL != "" {
		if u, err := url.Parse(c.InboxURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("%s=%q: want an http or https URL, as in https://agora.example.com/inbox", v("InboxURL"), c.InboxURL))
		}
	}
	if c.APIURL != "" {
		if u, err := url.Parse(c.APIURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || !bytes.HasSuffix([]byte(c.APIURL), []byte("/")) {
			errs = append(errs, fmt.Errorf("%s=%q: want an http or https URL ending in /", v("APIURL"), c.APIURL))
		}
	}
	if c.HTTPAddr != "" {
		if _, _, err := net.SplitHostPort(c.HTTPAddr); err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: want host:port, as in 127.0.0.1:8082 or :8082", v("HTTPAddr"), c.HTTPAddr))
		}
	}
	if c.PostAttempts < 0 || c.PostAttempts > 100 {
		errs = append(errs, fmt.Errorf("%s=%d: want 1 to 100", v("PostAttempts"), c.PostAttempts))
	}
	if c.RetryBackoff < 0 {
		errs = append(errs, fmt.Errorf("%s=%s: negative", v("RetryBackoff"), c.RetryBackoff))
	}
	if c.MaxRetryAfter < 0 {
		errs = append(errs, fmt.Errorf("%s=%s: negative", v("MaxRetryAfter"), c.MaxRetryAfter))
	}
	if c.ContextChars < 0 || c.ContextChars > 2500 {
		errs = append(errs, fmt.Errorf("%s=%d: want 1 to 2500 (a section holds 3000 characters)", v("ContextChars"), c.ContextChars))
	}
	if c.ShutdownTimeout < 0 {
		errs = append(errs, fmt.Errorf("%s=%s: negative", v("ShutdownTimeout"), c.ShutdownTimeout))
	}
	return errors.Join(errs...)
}

// Settings is the settings file: the routes this answerer serves.
//
//	routes:
//	  approvals:
//	    channel: C0123456789          # post every question here
//	    allow: [U0ALICE, U0BOB]       # optional: only they may answer
//	  reviews:
//	    direct:                       # a direct message to one person…
//	      label: assignee             # …named by this question label
//	      users: {alice: U0ALICE}     # label value → Slack user id
//	    channel: C0REVIEWS            # optional: when the label names no one
type Settings struct {
	Routes map[string]RouteSettings `yaml:"routes"`
}

// RouteSettings says where one route's questions go and who may answer
// them.
type RouteSettings struct {
	// Channel is a channel id (or name) to post in. With Direct set, the
	// channel takes the questions whose label names no one in Users.
	Channel string `yaml:"channel,omitempty"`
	// Direct sends each question as a direct message to the person its
	// label names.
	Direct *Direct `yaml:"direct,omitempty"`
	// Allow lists the Slack user ids who may answer; empty: anyone who
	// sees the message.
	Allow []string `yaml:"allow,omitempty"`
}

// Direct chooses the recipient of a direct message from a question label.
type Direct struct {
	// Label is the question label naming the person, as in assignee.
	Label string `yaml:"label"`
	// Users maps the label's values to Slack user ids.
	Users map[string]string `yaml:"users"`
}

var (
	routeRE   = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
	userIDRE  = regexp.MustCompile(`^[UW][A-Z0-9]{2,30}$`)
	channelRE = regexp.MustCompile(`^([CGD][A-Z0-9]{2,30}|#[a-z0-9._-]{1,80})$`)
)

// LoadSettings reads and checks a settings file; the error lists every
// problem.
func LoadSettings(path string) (Settings, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Settings{}, fmt.Errorf("slack: settings file: %w", err)
	}
	return ParseSettings(b)
}

// ParseSettings decodes and checks a settings file's content. Unknown
// fields are errors.
func ParseSettings(b []byte) (Settings, error) {
	var s Settings
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&s); err != nil && !errors.Is(err, io.EOF) {
		return Settings{}, fmt.Errorf("slack: settings file: %w", err)
	}
	var errs []error
	if len(s.Routes) == 0 {
		errs = append(errs, errors.New("no routes: name at least one under routes:"))
	}
	for _, name := range s.RouteNames() {
		r := s.Routes[name]
		bad := func(format string, a ...any) {
			errs = append(errs, fmt.Errorf("route %s: "+format, append([]any{name}, a...)...))
		}
		if !routeRE.MatchString(name) {
			bad("want 1-64 letters, digits, '-' or '_'")
		}
		if r.Channel == "" && r.Direct == nil {
			bad("set channel, direct, or both")
		}
		if r.Channel != "" && !channelRE.MatchString(r.Channel) {
			bad("channel %q: want a channel id (C…, G…, D…) or #name", r.Channel)
		}
		if d := r.Direct; d != nil {
			if d.Label == "" {
				bad("direct: label is required (the question label naming the person)")
			}
			if len(d.Users) == 0 {
				bad("direct: users is empty")
			}
			for k, u := range d.Users {
				if !userIDRE.MatchString(u) {
					bad("direct: users: %s: %q is not a Slack user id (U…)", k, u)
				}
			}
		}
		for _, u := range r.Allow {
			if !userIDRE.MatchString(u) {
				bad("allow: %q is not a Slack user id (U…)", u)
			}
		}
	}
	if len(errs) > 0 {
		return Settings{}, fmt.Errorf("slack: settings file: %w", errors.Join(errs...))
	}
	return s, nil
}

// RouteNames returns the routes served, sorted.
func (s Settings) RouteNames() []string {
	names := make([]string, 0, len(s.Routes))
	for n := range s.Routes {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// allows reports whether Slack user id may answer on this route.
func (r RouteSettings) allows(user string) bool {
	return len(r.Allow) == 0 || slices.Contains(r.Allow, user)
}

// destination is where a question goes: a channel, or a user id for a
// direct message; "" with a reason when nowhere.
func (r RouteSettings) destination(labels map[string]string) (string, string) {
	if d := r.Direct; d != nil {
		if v, ok := labels[d.Label]; ok {
			if u, ok := d.Users[v]; ok {
				return u, ""
			}
			if r.Channel == "" {
				return "", fmt.Sprintf("no Slack user for %s=%s", d.Label, v)
			}
		} else if r.Channel == "" {
			return "", fmt.Sprintf("the question has no %s label naming whom to ask", d.Label)
		}
	}
	return r.Channel, ""
}
