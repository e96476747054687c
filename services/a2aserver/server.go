// Package a2aserver serves Agora's sub-agents as an Agent2Agent (A2A,
// protocol 1.0) agent: an agent card at /.well-known/agent-card.json
// listing each sub-agent as a skill, and the JSON-RPC (POST /a2a) and
// HTTP+JSON (/a2a/message:send, /a2a/tasks/{id}, …) bindings, both
// through github.com/a2aproject/a2a-go/v2's server handlers.
//
// A task is a thread: its id is the thread id, and a message on it
// answers the question the thread waits on, through the router like any
// other door. Task state is read from Agora's own records through
// pkg/client, so a task outlives this process. With a push secret, a
// client may register webhooks on its tasks: every state change of the
// task is POSTed to them, signed. See docs/a2a.md.
package a2aserver

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2asrv"

	"github.com/agora-dispatch/agora/internal/principal"
	"github.com/agora-dispatch/agora/pkg/client"
)

// Paths the Handler serves.
const (
	// Path is the A2A endpoint: JSON-RPC at Path itself, HTTP+JSON under
	// Path + "/".
	Path = "/a2a"
	// CardPath is the public agent card.
	CardPath = "/.well-known/agent-card.json"
	// agentsPath + <sub-agent> (under Path) is one sub-agent's own
	// endpoint, with its card at CardPath below it.
	agentsPath = "/agents/"
)

// Deps are the A2A server's collaborators.
type Deps struct {
	// Client is the Agora client to act through; it stays the caller's.
	Client *client.Client
	// Logger receives structured logs; default slog.Default().
	Logger *slog.Logger
}

// Service is the A2A server. Create it with New, mount Handler, and run
// Run so that the executions following threads stop when it ends. Its
// methods are safe for concurrent use.
type Service struct {
	cfg        Config
	c          *client.Client
	log        *slog.Logger
	principals *principal.Set
	store      *store
	handler    a2asrv.RequestHandler

	// base ends when Run returns: every execution following a thread
	// ends then (the thread runs on; tasks/get still reads it).
	base context.Context
	stop context.CancelFunc
	// ready is closed once Run delivers push notifications.
	ready chan struct{}
	// cancels holds, per task this door is cancelling, a channel closed
	// once its canceled event is written (executor.Cancel).
	cancels sync.Map
}

// New checks cfg and builds the server on deps.Client.
func New(cfg Config, deps Deps) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.Client == nil {
		return nil, fmt.Errorf("a2aserver: Deps.Client is required")
	}
	cfg = cfg.withDefaults()
	s := &Service{cfg: cfg, c: deps.Client, log: deps.Logger}
	s.base, s.stop = context.WithCancel(context.Background())
	if s.log == nil {
		s.log = slog.Default()
	}
	var err error
	if s.principals, err = principal.Load(cfg.APITokens, cfg.PrincipalsFile); err != nil {
		return nil, fmt.Errorf("a2aserver: %w", err)
	}
	s.store = newStore(s)
	s.ready = make(chan struct{})
	caps := s.capabilities()
	opts := []a2asrv.RequestHandlerOption{
		a2asrv.WithTaskStore(s.store),
		a2asrv.WithLogger(s.log),
		a2asrv.WithCapabilityChecks(&caps),
		a2asrv.WithCallInterceptors(&interceptor{s: s}),
	}
	if s.pushOn() {
		opts = append(opts, a2asrv.WithPushNotifications(pushStore{s}, noSender{}))
	}
	s.handler = handler{RequestHandler: a2asrv.NewHandler(&executor{s: s}, opts...), s: s}
	return s, nil
}

// capabilities are what the agent card announces and the handler holds
// requests to: push notifications when a secret signs them.
func (s *Service) capabilities() a2a.AgentCapabilities {
	return a2a.AgentCapabilities{Streaming: true, PushNotifications: s.pushOn()}
}

// Ready is closed once Run delivers push notifications (at once when
// they are not offered).
func (s *Service) Ready() <-chan struct{} { return s.ready }

// Run delivers push notifications, when offered, and blocks until ctx
// ends; then it ends every execution still following a thread. The
// threads themselves run on.
func (s *Service) Run(ctx context.Context) error {
	defer s.stop()
	if !s.pushOn() {
		close(s.ready)
		<-ctx.Done()
		return nil
	}
	return s.runPush(ctx, func() { close(s.ready) })
}

// bound returns ctx, ended also when Run returns.
func (s *Service) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.base, cancel)
	return ctx, func() { stop(); cancel() }
}

// Handler serves the agent card at CardPath (no token needed) and the A2A
// bindings at Path: JSON-RPC on POST Path, HTTP+JSON under Path + "/".
// Each sub-agent is also an agent of its own at Path/agents/<name>, with
// its card at Path/agents/<name>/.well-known/agent-card.json: a message
// there starts that sub-agent without metadata.skill. With APITokens or
// PrincipalsFile set, every A2A request needs a bearer token, which names
// its principal as on /v1; else it is "local".
func (s *Service) Handler() http.Handler {
	jsonrpc := a2asrv.NewJSONRPCHandler(s.handler)
	rest := a2asrv.NewRESTHandler(s.handler)
	mux := http.NewServeMux()
	mux.Handle(CardPath, s.cardHandler(false))
	mux.Handle(Path, s.authenticated(jsonrpc))
	mux.Handle(Path+"/", s.authenticated(http.StripPrefix(Path, rest)))
	agent := Path + agentsPath + "{name}"
	mux.Handle(agent+CardPath, s.cardHandler(true))
	mux.Handle(agent, s.authenticated(withSkill(jsonrpc, false)))
	mux.Handle(agent+"/", s.authenticated(withSkill(rest, true)))
	return mux
}

// withSkill serves h for the sub-agent the path names: a message that
// starts a task there starts it. strip removes the sub-agent's prefix
// (for the HTTP+JSON binding's paths).
func withSkill(h http.Handler, strip bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("name")
		r = r.WithContext(context.WithValue(r.Context(), skillKey{}, name))
		next := h
		if strip {
			next = http.StripPrefix(Path+agentsPath+name, h)
		}
		next.ServeHTTP(w, r)
	})
}

type skillKey struct{}

// authenticated lets through requests that carry a token of a principal,
// with the principal in their context.
func (s *Service) authenticated(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		who, ok := s.principals.Authenticate(r.Header.Get("Authorization"))
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="agora"`)
			http.Error(w, "a bearer token is required: one of AGORA_API_TOKENS, or one whose SHA-256 a principal of AGORA_PRINCIPALS_FILE holds", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, who)))
	})
}

type principalKey struct{}

// principalOf is the principal of the request ctx belongs to; nil outside
// an authenticated request.
func principalOf(ctx context.Context) *principal.Principal {
	p, _ := ctx.Value(principalKey{}).(*principal.Principal)
	return p
}

// owned reports whether threads are recorded as their principal's (when
// callers authenticate), as MCP over HTTP does.
func (s *Service) owned() bool { return !s.principals.Open() }

// answeredBy is how answers and cancels through this door are recorded.
func answeredBy(who *principal.Principal) string { return "a2a:" + who.Name }

// interceptor checks a message before a2a-go starts an execution for it
// (a2asrv runs it inside every call), so that a bad skill, a bad part or
// a refused answer is the caller's error and never a failed task; it also
// tells a2a-go who the caller is.
type interceptor struct {
	a2asrv.PassthroughCallInterceptor
	s *Service
}

// Before implements a2asrv.CallInterceptor.
func (i *interceptor) Before(ctx context.Context, cc *a2asrv.CallContext, req *a2asrv.Request) (context.Context, any, error) {
	who := principalOf(ctx)
	if who == nil {
		return ctx, nil, a2a.ErrUnauthenticated
	}
	cc.User = a2asrv.NewAuthenticatedUser(who.Name, nil)
	m, ok := req.Payload.(*a2a.SendMessageRequest)
	if !ok || m == nil || m.Message == nil {
		return ctx, nil, nil
	}
	if m.Message.TaskID == "" {
		p, err := i.s.plan(ctx, who, m)
		if err != nil {
			return ctx, nil, err
		}
		return context.WithValue(ctx, planKey{}, p), nil, nil
	}
	r, err := i.s.answer(ctx, who, m.Message)
	if err != nil {
		return ctx, nil, err
	}
	return context.WithValue(ctx, resumeKey{}, r), nil, nil
}

// publicURL is where the request r reached this listener.
func (s *Service) publicURL(r *http.Request) string {
	if s.cfg.PublicURL != "" {
		return strings.TrimRight(s.cfg.PublicURL, "/")
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}
