// Package mcpserver is Agora's Model Context Protocol server for
// orchestrator agents (Claude Code, or any MCP client): tools to dispatch
// sub-agents and follow their threads, answer and list questions, read
// status and events, cancel, and list sub-agents. When a followed thread
// stops on a question, agora_dispatch asks the client's user for the
// answer: as an input-required result (protocol 2026-07-28, with a sealed,
// bound, expiring and single-use requestState), through elicitation for
// older clients, or as a needs_input result the model answers with
// agora_answer. A client that declares the MCP Tasks extension gets
// agora_dispatch's thread as a task instead, read with tasks/get,
// answered with tasks/update and cancelled with tasks/cancel. It talks
// to Agora only through pkg/client. See docs/mcp.md.
package mcpserver

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/buildinfo"
	"github.com/agora-dispatch/agora/internal/principal"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/seal"
)

// Deps are the MCP server's collaborators.
type Deps struct {
	// Client is the Agora client to act through; it stays the caller's.
	// When nil, New connects to Config.NATSURL and Close closes it.
	Client *client.Client
	// Logger receives structured logs; default slog.Default().
	Logger *slog.Logger
}

// Service is an MCP server. Create it with New; serve it with ServeStdio
// (one session on stdin/stdout), Handler (streamable HTTP, for mounting) or
// Run (HTTP on Config.HTTPAddr). Its methods are safe for concurrent use.
type Service struct {
	cfg    Config
	c      *client.Client
	own    bool
	log    *slog.Logger
	seal   *sealer
	states jetstream.KeyValue
	// principals are who may call over HTTP (internal/principal).
	principals *principal.Set
}

// New checks cfg and connects. It fails when the agora_mcp_states bucket
// does not exist (run agora dev, or provision the streams first).
func New(ctx context.Context, cfg Config, deps Deps) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	s := &Service{cfg: cfg, c: deps.Client, log: deps.Logger}
	if s.log == nil {
		s.log = slog.Default()
	}
	var err error
	if s.principals, err = principal.Load(cfg.APITokens, cfg.PrincipalsFile); err != nil {
		return nil, fmt.Errorf("mcpserver: %w", err)
	}
	key := make([]byte, 32)
	if cfg.StateKey != "" {
		key, _ = seal.DecodeKey(cfg.StateKey)
	} else if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	if s.seal, err = newSealer(key); err != nil {
		return nil, err
	}
	if s.c == nil {
		opts := []nats.Option{nats.Name("agora mcp")}
		if cfg.NATSCreds != "" {
			opts = append(opts, nats.UserCredentials(cfg.NATSCreds))
		}
		if s.c, err = client.Connect(cfg.NATSURL, client.WithNATSOptions(opts...)); err != nil {
			return nil, fmt.Errorf("mcpserver: cannot reach NATS at %s: %w", cfg.NATSURL, err)
		}
		s.own = true
	}
	js, err := jetstream.New(s.c.Conn())
	if err != nil {
		s.Close()
		return nil, err
	}
	if s.states, err = js.KeyValue(ctx, lifecycle.BucketMCPStates); err != nil {
		s.Close()
		return nil, fmt.Errorf("mcpserver: bucket %s: %w (run `agora dev`, or provision the streams first)", lifecycle.BucketMCPStates, err)
	}
	return s, nil
}

// Close closes the connection New opened, if any.
func (s *Service) Close() {
	if s.own {
		_ = s.c.Close()
	}
}

// newTools returns the tool handlers of one principal: every tool call
// through them acts, answers and is recorded as that principal, and sees,
// follows and cancels what its scope allows (owner.go). owned records the
// threads it dispatches as the principal's (an authenticated HTTP
// caller's).
func (s *Service) newTools(who *principal.Principal, owned bool) *tools {
	return &tools{s: s, principal: who.Name, who: who, owned: owned}
}

// server builds the MCP server of t's principal. It declares the Tasks
// extension, whose requests reach t before the server (taskwire.go).
func (s *Service) server(t *tools) *mcp.Server {
	caps := &mcp.ServerCapabilities{Logging: &mcp.LoggingCapabilities{}}
	caps.AddExtension(tasksExtension, nil)
	srv := mcp.NewServer(&mcp.Implementation{Name: "agora", Title: "Agora", Version: buildinfo.Version()}, &mcp.ServerOptions{
		Instructions: instructions,
		Logger:       s.log,
		Capabilities: caps,
	})
	t.register(srv)
	return srv
}

// ServeStdio serves one MCP session on stdin and stdout until the client
// disconnects or ctx ends. principal names the user behind the session
// (answers are recorded as "mcp:<principal>").
func (s *Service) ServeStdio(ctx context.Context, principal string) error {
	t := s.newTools(local(principal), false)
	err := s.server(t).Run(ctx, taskTransport{Transport: &mcp.StdioTransport{}, t: t})
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// Serve serves one MCP session on transport (tests use in-memory
// transports); see ServeStdio.
func (s *Service) Serve(ctx context.Context, transport mcp.Transport, principal string) (*mcp.ServerSession, error) {
	t := s.newTools(local(principal), false)
	return s.server(t).Connect(ctx, taskTransport{Transport: transport, t: t}, nil)
}

// local is the principal of a session its own user runs (stdio, or a
// transport in the same process): it holds the NATS credentials
// already, so it is an admin of what they reach.
func local(name string) *principal.Principal {
	return &principal.Principal{Name: name, Admin: true}
}

// sessionlessProtocol is the first protocol version without sessions: a
// request of it names its version in the MCP-Protocol-Version header and
// carries its client's details in _meta (docs/mcp.md).
const sessionlessProtocol = "2026-07-28"

// Handler serves the streamable HTTP transport on one path for both
// generations of the protocol: a request whose MCP-Protocol-Version header
// is 2026-07-28 or later goes to a handler without sessions, every other
// request (initialize, and the older protocols after it) to one with
// sessions (Mcp-Session-Id). With APITokens or PrincipalsFile set, every
// request needs a bearer token, which names its principal
// (internal/principal: "token-<first 8 hex of its SHA-256>" for
// AGORA_API_TOKENS, the file's name otherwise), else it is "local".
// Requests of the Tasks extension (tasks.go) are answered before either
// handler sees them: of 2026-07-28, or on a session of their principal.
func (s *Service) Handler() http.Handler {
	owned := !s.principals.Open()
	getServer := func(r *http.Request) *mcp.Server {
		return s.server(s.newTools(principalOf(r.Context()), owned))
	}
	open := &sessionCount{m: map[string][]*mcp.Server{}}
	getSessionServer := func(r *http.Request) *mcp.Server {
		p := principalOf(r.Context())
		srv := s.server(s.newTools(p, owned))
		if r.Header.Get("Mcp-Session-Id") == "" {
			open.add(p.Name, srv) // it may start a session
		}
		return srv
	}
	sessions := mcp.NewStreamableHTTPHandler(getSessionServer, &mcp.StreamableHTTPOptions{Logger: s.log, SessionTimeout: s.cfg.SessionIdle})
	// Without a session the POST is the whole call: when its client goes
	// away, the call (an agora_dispatch following a thread, say) ends too.
	sessionless := mcp.NewStreamableHTTPHandler(getServer, &mcp.StreamableHTTPOptions{Logger: s.log, Stateless: true,
		PropagateRequestCancellation: true})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		who, ok := s.principals.Authenticate(r.Header.Get("Authorization"))
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="agora"`)
			http.Error(w, "a bearer token is required: one of AGORA_API_TOKENS, or one whose SHA-256 a principal of AGORA_PRINCIPALS_FILE holds", http.StatusUnauthorized)
			return
		}
		principal := who.Name
		// Versions are dates, so they compare as strings (as the SDK does).
		v := r.Header.Get("MCP-Protocol-Version")
		if req, ok := peekTaskCall(r); ok && (v == sessionlessProtocol || v < sessionlessProtocol && open.has(principal, r.Header.Get("Mcp-Session-Id"))) {
			s.serveTaskHTTP(w, r, s.newTools(who, owned), req, v)
			return
		}
		var h http.Handler = sessions
		if v >= sessionlessProtocol {
			h = sessionless
		} else if r.Method == http.MethodPost && r.Header.Get("Mcp-Session-Id") == "" {
			if n := open.live(principal); n >= s.cfg.MaxSessions {
				w.Header().Set("Retry-After", strconv.Itoa(int(s.cfg.SessionIdle.Seconds())))
				http.Error(w, fmt.Sprintf("%d MCP sessions of this principal are open (AGORA_MCP_MAX_SESSIONS=%d): end one (DELETE /mcp with its Mcp-Session-Id) or let one idle past AGORA_MCP_SESSION_IDLE=%s", n, s.cfg.MaxSessions, s.cfg.SessionIdle), http.StatusTooManyRequests)
				return
			}
		}
		if owned {
			// The SDK binds a session to the user of the request that made
			// it and refuses the session to a request of another user (403
			// "session user mismatch"); it learns the user from the token
			// information its bearer middleware puts in the context.
			h = auth.RequireBearerToken(func(context.Context, string, *http.Request) (*auth.TokenInfo, error) {
				return &auth.TokenInfo{UserID: principal}, nil
			}, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true})(h)
		}
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, who)))
	})
}

// sessionCount keeps, per principal, the servers made for requests that
// may start a session, to count the sessions still open (the SDK ends
// idle ones after SessionIdle, and a DELETE ends one).
type sessionCount struct {
	mu sync.Mutex
	m  map[string][]*mcp.Server
}

func (c *sessionCount) add(principal string, srv *mcp.Server) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.m[principal] = append(c.m[principal], srv)
}

// has reports whether session id is one principal has open.
func (c *sessionCount) has(principal, id string) bool {
	if id == "" {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, srv := range c.m[principal] {
		for ss := range srv.Sessions() {
			if ss.ID() == id {
				return true
			}
		}
	}
	return false
}

// live returns how many sessions principal has open, forgetting servers
// that have none: the slice keeps only those that do, its tail cleared so
// that a forgotten server (and what it holds) can be collected.
func (c *sessionCount) live(principal string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	all := c.m[principal]
	kept := all[:0]
	n := 0
	for _, srv := range all {
		k := 0
		for range srv.Sessions() {
			k++
		}
		if k > 0 {
			kept = append(kept, srv)
			n += k
		}
	}
	clear(all[len(kept):])
	if len(kept) == 0 {
		delete(c.m, principal)
	} else {
		c.m[principal] = kept
	}
	return n
}

type principalKey struct{}

func principalOf(ctx context.Context) *principal.Principal {
	if p, ok := ctx.Value(principalKey{}).(*principal.Principal); ok {
		return p
	}
	return local(principal.Local)
}

// Run serves Handler at /mcp on Config.HTTPAddr until ctx ends, then shuts
// the listener down; it returns at once when HTTPAddr is empty.
func (s *Service) Run(ctx context.Context) error {
	if s.cfg.HTTPAddr == "" {
		return nil
	}
	ln, err := net.Listen("tcp", s.cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("mcpserver: AGORA_MCP_HTTP_ADDR=%s: %w", s.cfg.HTTPAddr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", s.Handler())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	s.log.Info("mcp listening", "url", "http://"+ln.Addr().String()+"/mcp")
	select {
	case <-ctx.Done():
	case err := <-errc:
		if !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("mcpserver: http: %w", err)
		}
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	return nil
}

// instructions tell the model how the tools fit together.
const instructions = `Agora runs sub-agents for you. A sub-agent that hits ambiguity stops and asks a question instead of guessing; the question goes to a person (or another answerer), and the sub-agent resumes with the answer.

Use agora_subagents to see what can run, agora_dispatch to run one and follow it to its end. When it asks a question, you are asked for the answer through your client; if your client cannot ask, agora_dispatch returns status "needs_input": answer with agora_answer, then call agora_dispatch with the thread_id to keep following. A long run returns status "running": call agora_dispatch again with the thread_id. agora_status, agora_events, agora_questions and agora_cancel inspect and control threads.`
