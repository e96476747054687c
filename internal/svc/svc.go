// Package svc holds the wiring every Agora service repeats: its main
// (Main: signals, logging, settings, tracing, build, run, reload),
// connecting to NATS from its settings and choosing where its metrics go.
package svc

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/agora-dispatch/agora/pkg/client"
)

// Connect opens a NATS connection for a service instance that reconnects
// forever and logs its connection events to log (ConnectionEvents). creds,
// when set, is a credentials file. The error names the setting to fix
// (AGORA_NATS_URL) and the usual cause.
func Connect(service, id, url, creds string, log *slog.Logger) (*nats.Conn, error) {
	name := "agora-" + service
	if id != "" {
		name += " " + id
	}
	opts := append([]nats.Option{nats.Name(name), nats.MaxReconnects(-1)}, ConnectionEvents(log)...)
	inbox, err := InboxPrefix()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", service, err)
	}
	opts = append(opts, inbox...)
	if creds != "" {
		o, err := credentials(creds)
		if err != nil {
			return nil, fmt.Errorf("%s: AGORA_NATS_CREDS=%s: %w", service, creds, err)
		}
		opts = append(opts, o)
	}
	nc, err := nats.Connect(url, opts...)
	// A server that is there but slow to answer (busy, restarting its
	// JetStream) gets a few more tries; nothing listening fails at once.
	for deadline := time.Now().Add(connectPatience); timedOut(err) && time.Now().Before(deadline); {
		if log != nil {
			log.Warn("NATS is slow to answer: connecting again", "url", url, "err", err)
		}
		nc, err = nats.Connect(url, opts...)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: cannot reach NATS at %s (AGORA_NATS_URL): %w — is `agora dev` or a NATS server running?", service, url, err)
	}
	return nc, nil
}

// connectPatience is how long Connect keeps trying a server whose
// connection times out.
const connectPatience = 15 * time.Second

// timedOut reports a connection attempt that timed out, as opposed to one
// refused.
func timedOut(err error) bool {
	var ne net.Error
	return errors.Is(err, nats.ErrTimeout) || (errors.As(err, &ne) && ne.Timeout())
}

// InboxPrefixVar names the setting of the prefix of a connection's reply
// subjects (docs/security.md, "Replies"): with one of its own per NATS
// user, _INBOX_<user>, a user subscribes to its own replies only.
const InboxPrefixVar = "AGORA_NATS_INBOX_PREFIX"

// InboxPrefix returns the connection option of AGORA_NATS_INBOX_PREFIX,
// none when it is not set (the replies then come on _INBOX.>), or an
// error naming the setting when it is not a subject prefix.
func InboxPrefix() ([]nats.Option, error) {
	p := os.Getenv(InboxPrefixVar)
	if p == "" {
		return nil, nil
	}
	for _, tok := range strings.Split(p, ".") {
		if tok == "" || tok == "*" || tok == ">" || strings.ContainsAny(tok, " \t\r\n") {
			return nil, fmt.Errorf("%s=%q: want a subject prefix with no wildcard, space or empty token, such as _INBOX_worker (the reply subjects the NATS user may subscribe to)", InboxPrefixVar, p)
		}
	}
	return []nats.Option{nats.CustomInboxPrefix(p)}, nil
}

// Conn returns the connection a service built from its deps uses: nc
// when it is set, which stays the caller's (own is false); otherwise one
// Connect opens, which the service closes when it stops (own is true).
func Conn(nc *nats.Conn, service, id, url, creds string, log *slog.Logger) (conn *nats.Conn, own bool, err error) {
	if nc != nil {
		return nc, false, nil
	}
	if nc, err = Connect(service, id, url, creds, log); err != nil {
		return nil, false, err
	}
	return nc, true, nil
}

// Client returns the Agora client a service built from its deps works
// through and that client's connection: c when it is set, which stays the
// caller's; otherwise a client on the connection Conn returns for nc, with
// Conn's own. A connection of its own is closed again when no client can
// be made.
func Client(c *client.Client, nc *nats.Conn, service, url, creds string, log *slog.Logger) (_ *client.Client, _ *nats.Conn, own bool, err error) {
	if c != nil {
		return c, c.Conn(), false, nil
	}
	if nc, own, err = Conn(nc, service, "", url, creds, log); err != nil {
		return nil, nil, false, err
	}
	if c, err = client.New(nc); err != nil {
		if own {
			nc.Close()
		}
		return nil, nil, false, fmt.Errorf("%s: %w", service, err)
	}
	return c, nc, own, nil
}

// Logger returns the logger of a service built from its deps: log, or
// slog.Default() when it is nil, with attrs added (the service's name and
// instance id).
func Logger(log *slog.Logger, attrs ...any) *slog.Logger {
	if log == nil {
		log = slog.Default()
	}
	return log.With(attrs...)
}

// ConnectionEvents logs what happens to a NATS connection: disconnects,
// reconnects, closes, servers discovered and asynchronous errors — among
// them permission violations, which a client otherwise sees only as a
// request timing out. nil logs to slog.Default().
func ConnectionEvents(log *slog.Logger) []nats.Option {
	if log == nil {
		log = slog.Default()
	}
	return []nats.Option{
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			log.Warn("nats disconnected; reconnecting", "err", err, "nats_url", nc.ConnectedUrlRedacted())
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("nats reconnected", "nats_url", nc.ConnectedUrlRedacted(), "reconnects", nc.Stats().Reconnects)
		}),
		nats.ClosedHandler(func(nc *nats.Conn) {
			if err := nc.LastError(); err != nil {
				log.Warn("nats connection closed", "err", err)
			}
		}),
		nats.DiscoveredServersHandler(func(nc *nats.Conn) {
			log.Info("nats servers discovered", "servers", nc.DiscoveredServers())
		}),
		nats.ErrorHandler(func(nc *nats.Conn, sub *nats.Subscription, err error) {
			attrs := []any{"err", err}
			if sub != nil {
				attrs = append(attrs, "subject", sub.Subject)
			}
			if errors.Is(err, nats.ErrPermissionViolation) || strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
				log.Error("nats permission violation: this service's NATS user may not do this", attrs...)
				return
			}
			log.Warn("nats error", attrs...)
		}),
	}
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

// credentials reads a NATS credentials file once, at start, and keeps its
// JWT and seed in memory: reconnects do not read the file again, so it can
// be removed or made unreadable after start, and nothing a service starts
// later (a sub-agent) finds it open or needs it readable.
func credentials(file string) (nats.Option, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	jwt, err := nkeys.ParseDecoratedJWT(b)
	if err != nil {
		return nil, fmt.Errorf("not a credentials file: %w", err)
	}
	kp, err := nkeys.ParseDecoratedNKey(b)
	if err != nil {
		return nil, fmt.Errorf("not a credentials file: %w", err)
	}
	seed, err := kp.Seed()
	if err != nil {
		return nil, err
	}
	return nats.UserJWTAndSeed(jwt, string(seed)), nil
}
