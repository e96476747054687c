package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/agora-dispatch/agora/internal/svc"
	"github.com/agora-dispatch/agora/internal/termsafe"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// Exit codes of the client verbs. A dispatch followed to its end exits
// with the code of its terminal kind.
const (
	exitOK         = 0
	exitError      = 1 // anything that went wrong, a refused request or answer
	exitFailed     = 2 // the dispatch (or thread) ended failed
	exitCancelled  = 3 // … ended cancelled
	exitNeedsInput = 4 // … stopped to ask a question (dispatch --round)
	exitNothing    = 5 // cancel: nothing to cancel, it had already ended
	exitDenied     = 6 // subagent check: the sandbox would deny a path the command needs
	exitInterrupt  = 130
)

// exitErr carries an exit code to main. A nil err exits silently: the
// verb has already said everything on stdout.
type exitErr struct {
	code int
	err  error
}

func (e *exitErr) Error() string {
	if e.err == nil {
		return ""
	}
	return e.err.Error()
}

func (e *exitErr) ExitCode() int { return e.code }
func (e *exitErr) Unwrap() error { return e.err }

// args checks a verb's positional arguments: the names it requires, then
// up to optional more. A missing one is named in words with what it is
// and an example; an extra one is named too.
//
//	args(0, arg{"SUBAGENT", "the sub-agent to run", "agora dispatch demo"})
func args(optional int, required ...arg) cobra.PositionalArgs {
	return func(cmd *cobra.Command, got []string) error {
		if len(got) < len(required) {
			a := required[len(got)]
			return fmt.Errorf("missing %s: %s, e.g. `%s` (see %s --help)", a.name, a.what, a.example, cmd.CommandPath())
		}
		if max := len(required) + optional; len(got) > max {
			return fmt.Errorf("%s takes %d argument(s), got %d: %q is one too many (quote an argument that has spaces)", cmd.CommandPath(), max, len(got), got[max])
		}
		return nil
	}
}

// arg is a required positional argument, for args.
type arg struct{ name, what, example string }

// exitWith ends a verb with code and nothing more to say.
func exitWith(code int) error { return &exitErr{code: code} }

// globals are the persistent flags every client verb shares.
type globals struct {
	natsURL string
	creds   string
	timeout time.Duration
	// conn is the connection connect opened last: a request that times
	// out is explained by the permission violation NATS reported on it.
	conn *nats.Conn
}

func addGlobalFlags(root *cobra.Command) *globals {
	g := &globals{}
	pf := root.PersistentFlags()
	pf.StringVar(&g.natsURL, "nats", envDefault("AGORA_NATS_URL", nats.DefaultURL), "NATS server URL of the client verbs (AGORA_NATS_URL)")
	pf.StringVar(&g.creds, "creds", os.Getenv("AGORA_NATS_CREDS"), "NATS credentials file of the client verbs (AGORA_NATS_CREDS)")
	pf.DurationVar(&g.timeout, "request-timeout", client.DefaultTimeout, "how long a client verb waits for each request to Agora")
	// The old name of --request-timeout, kept working; on `dispatch`,
	// --timeout is the sub-agent's time limit, as in the request.
	pf.DurationVar(&g.timeout, "timeout", client.DefaultTimeout, "")
	_ = pf.MarkDeprecated("timeout", "use --request-timeout (on dispatch, --timeout is the sub-agent's time limit)")
	return g
}

// connect opens a client, explaining a failure in terms of what to do.
// A connection lost later is retried for ever and reported on diag.
func (g *globals) connect(diag io.Writer) (*client.Client, error) {
	opts := []nats.Option{
		nats.Name("agora-cli"), nats.Timeout(min(g.timeout, 5*time.Second)),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				fmt.Fprintf(diag, "\nagora: lost the connection to NATS at %s (%v); reconnecting…\n", g.shownURL(), unprefix(err))
			}
		}),
		nats.ReconnectHandler(func(*nats.Conn) { fmt.Fprintf(diag, "agora: reconnected to NATS at %s\n", g.shownURL()) }),
	}
	inbox, err := svc.InboxPrefix()
	if err != nil {
		return nil, err
	}
	opts = append(opts, inbox...)
	if g.creds != "" {
		if _, err := os.Stat(g.creds); err != nil {
			return nil, fmt.Errorf("credentials file --creds %s: %w", g.creds, errors.Unwrap(err))
		}
		opts = append(opts, nats.UserCredentials(g.creds))
	}
	c, err := client.Connect(g.natsURL, client.WithTimeout(g.timeout), client.WithNATSOptions(opts...))
	if err != nil {
		return nil, g.connectError(err)
	}
	g.conn = c.Conn()
	return c, nil
}

// connectTo checks id, the dispatch or thread a verb names, before it
// connects as connect does.
func (g *globals) connectTo(id string, diag io.Writer) (*client.Client, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	return g.connect(diag)
}

// call starts a verb's one exchange with Agora: it connects, with the
// connection's diagnostics on diag, and bounds the exchange by --timeout
// from ctx. done closes the client and releases the context; the verb
// calls it when it ends.
func (g *globals) call(ctx context.Context, diag io.Writer) (*client.Client, context.Context, func(), error) {
	c, err := g.connect(diag)
	if err != nil {
		return nil, nil, nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, g.timeout)
	return c, ctx, func() { cancel(); c.Close() }, nil
}

// shownURL is the NATS URL for messages: a password in it is shown as
// xxxxx.
func (g *globals) shownURL() string {
	if u, err := url.Parse(g.natsURL); err == nil && u.User != nil {
		return u.Redacted()
	}
	return g.natsURL
}

func (g *globals) connectError(err error) error {
	var ne net.Error
	switch {
	case errors.Is(err, nats.ErrNoServers), errors.Is(err, syscall.ECONNREFUSED), errors.As(err, &ne):
		return fmt.Errorf("cannot reach NATS at %s — is `agora dev` running? (another server: --nats URL or AGORA_NATS_URL)", g.shownURL())
	case errors.Is(err, nats.ErrAuthorization), errors.Is(err, nats.ErrAuthExpired), errors.Is(err, nats.ErrAuthRevoked),
		strings.Contains(strings.ToLower(err.Error()), "authorization"):
		return fmt.Errorf("NATS at %s refused the connection (%v) — check --creds (AGORA_NATS_CREDS)", g.shownURL(), unprefix(err))
	}
	return fmt.Errorf("cannot connect to NATS at %s: %v", g.shownURL(), unprefix(err))
}

// refused is the permission violation NATS last reported on the
// connection, or nil: NATS drops what a user may not publish or subscribe
// to and tells the client only asynchronously, so a request it refused
// times out.
func (g *globals) refused() error {
	if g.conn == nil {
		return nil
	}
	if err := g.conn.LastError(); errors.Is(err, nats.ErrPermissionViolation) {
		return err
	}
	return nil
}

// refusedError says what a permission violation means for the CLI's user:
// a refused subscription to reply subjects is the reply prefix not set
// (docs/security.md, "Replies"); anything else is a grant the user lacks.
func (g *globals) refusedError(err error) error {
	msg := strings.TrimPrefix(unprefix(err), "permissions violation: ")
	if strings.Contains(strings.ToLower(msg), "subscription to \"") {
		prefix := cmp.Or(os.Getenv(svc.InboxPrefixVar), nats.InboxPrefix[:len(nats.InboxPrefix)-1])
		return fmt.Errorf("NATS at %s refused this user's subscription to its replies (%s): set %s to the reply prefix the user may subscribe to (the deploy's client user: %s=_INBOX_client; now %s)", g.shownURL(), msg, svc.InboxPrefixVar, svc.InboxPrefixVar, prefix)
	}
	return fmt.Errorf("NATS at %s refused the request (%s): this NATS user (--creds, AGORA_NATS_CREDS) is not granted it; docs/security.md lists what each user of the deploy may do", g.shownURL(), msg)
}

// apiServices names the service behind each Agora endpoint, for messages.
var apiServices = map[string]string{
	lifecycle.APIDispatch:        "dispatcher",
	lifecycle.APICancel:          "dispatcher",
	lifecycle.APIStatus:          "dispatcher",
	lifecycle.APIAnswer:          "router",
	lifecycle.APIDecisions:       "router",
	lifecycle.APIDecisionsForget: "router",
}

// explain turns an error of a pkg/client call on endpoint (an agora.api
// subject, or "" for stream and bucket reads) into a message that says
// what went wrong and what to do.
func (g *globals) explain(err error, endpoint string) error {
	var p *client.Problem
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.Canceled):
		return &exitErr{code: exitInterrupt, err: errors.New("interrupted")}
	case errors.Is(err, client.ErrUnavailable) && endpoint != "" && !errors.As(err, &p):
		return fmt.Errorf("no %s is answering %s — is `agora dev` running? (NATS at %s)", apiServices[endpoint], endpoint, g.shownURL())
	case (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)) && g.refused() != nil:
		return g.refusedError(g.refused())
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout):
		what := endpoint
		if what == "" {
			what = "NATS"
		}
		return fmt.Errorf("%s did not answer within %s (--request-timeout) — is Agora overloaded, or its %s stopped?", what, g.timeout, cmp.Or(apiServices[endpoint], "server"))
	case errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, nats.ErrDisconnected), errors.Is(err, nats.ErrNoServers):
		return fmt.Errorf("lost the connection to NATS at %s — is `agora dev` still running?", g.shownURL())
	case errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
		return fmt.Errorf("JetStream is not enabled on NATS at %s — Agora needs it: run `agora dev`, or nats-server -js", g.shownURL())
	case errors.Is(err, jetstream.ErrStreamNotFound), errors.Is(err, jetstream.ErrBucketNotFound):
		return fmt.Errorf("%v — NATS at %s has no Agora streams and buckets: is this Agora's server? (`agora dev` provisions them)", unprefix(err), g.shownURL())
	case errors.As(err, &p):
		perr := problemError(p, strings.TrimPrefix(endpoint, "agora.api."))
		if endpoint == lifecycle.APIDispatch && unknownSubagent(p) {
			perr = withRegistered(perr, registeredSubagents(context.Background(), g))
		}
		return perr
	}
	return errors.New(unprefix(err))
}

// unknownSubagent reports a dispatch refused because its sub-agent is not
// registered: the dispatcher names the field subagent.
func unknownSubagent(p *client.Problem) bool {
	for _, e := range p.Errors {
		if e.Field == "subagent" && strings.HasPrefix(e.Message, "no sub-agent named") {
			return true
		}
	}
	return false
}

// withRegistered adds the registered sub-agents' names to err.
func withRegistered(err error, names []string) error {
	if len(names) == 0 {
		return err
	}
	return fmt.Errorf("%w — registered: %s", err, strings.Join(names, ", "))
}

// problemError words a refused request, naming every field at fault.
func problemError(p *client.Problem, action string) error {
	if action == "" {
		action = "request"
	}
	if p.Status == http.StatusConflict && p.Detail != "" {
		// A dispatch id reused for a different request: the detail names
		// the id and the fields.
		return fmt.Errorf("%s refused: %s", action, p.Detail)
	}
	if len(p.Errors) == 0 {
		msg := strings.ToLower(p.Title)
		if p.Detail != "" {
			msg += ": " + p.Detail
		}
		return errors.New(msg)
	}
	parts := make([]string, len(p.Errors))
	for i, e := range p.Errors {
		parts[i] = e.Field + ": " + e.Message
	}
	return fmt.Errorf("%s refused: %s", action, strings.Join(parts, "; "))
}

// unprefix drops the "client: " package prefix from an error message.
func unprefix(err error) string {
	return strings.TrimPrefix(strings.TrimPrefix(err.Error(), "client: "), "nats: ")
}

// jsonLines writes one JSON object per line, nothing else.
type jsonLines struct{ enc *json.Encoder }

func newJSONLines(w io.Writer) *jsonLines {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return &jsonLines{enc: enc}
}

func (j *jsonLines) write(v any) error { return j.enc.Encode(v) }

// writeJSONLines writes each item as one JSON line, as line makes it
// (same: the item itself).
func writeJSONLines[T, L any](w io.Writer, items []T, line func(T) L) error {
	jl := newJSONLines(w)
	for _, it := range items {
		if err := jl.write(line(it)); err != nil {
			return err
		}
	}
	return nil
}

// same is writeJSONLines' line for an item written as it is.
func same[T any](v T) T { return v }

// isTerminal reports whether w is a terminal (a character device).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.,:/=@%+") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// keyValues parses repeated k=v flags.
func keyValues(flag string, items []string) (map[string]string, error) {
	if len(items) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(items))
	for _, it := range items {
		k, v, ok := strings.Cut(it, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--%s %q: want KEY=VALUE", flag, it)
		}
		m[k] = v
	}
	return m, nil
}

// prettyJSON indents raw JSON for people, keeping its member order; it
// returns raw as it is when it does not parse.
// safeOut and safeErr are the command's output and error streams with
// every control character that sub-agents' text may hold escaped, but the
// newlines and tabs of the CLI's own layout (internal/termsafe): every verb
// that shows what a run or a question says writes through them.
func safeOut(cmd *cobra.Command) io.Writer { return termsafe.NewWriter(cmd.OutOrStdout()) }
func safeErr(cmd *cobra.Command) io.Writer { return termsafe.NewWriter(cmd.ErrOrStderr()) }

func prettyJSON(raw json.RawMessage) string {
	var b bytes.Buffer
	if err := json.Indent(&b, raw, "", "  "); err != nil {
		return string(raw)
	}
	return b.String()
}

// ms formats a duration in milliseconds for people.
func ms(d int64) string {
	return (time.Duration(d) * time.Millisecond).Round(time.Millisecond).String()
}
