// Package inbox is Agora's answerer for people: a web inbox where they read
// the questions sub-agents ask and answer them (docs/wire.md, "Questions and
// answers"; docs/inbox.md).
//
// The inbox reads the agora_questions bucket directly: a watch keeps an
// in-memory view of every question record current, renders the pages from
// it, and feeds live updates to open pages through Server-Sent Events (a
// new question appears; one answered elsewhere, expired or withdrawn
// disappears). It therefore does not use pkg/answerer's consumer of
// question.asked events: a person is not a handler that must answer each
// delivered question within an acknowledgement window, and the bucket
// already holds what the inbox must show, including the questions that
// were closed elsewhere. Answers go through the router (client.Answer),
// which says at once whether the answer won; the answer's answered_by is
// the signed-in user. An inbox restricted to routes (Config.Routes)
// answers through the question's route endpoint, agora.api.answer.<route>,
// the one its route's NATS user may request; an inbox for every route uses
// the generic agora.api.answer, for trusted users only.
//
// Everything is served under Prefix (/inbox), so the handler can be
// mounted on a shared listener:
//
//	GET  /inbox/                            pending questions, newest first (query: route, kind, subagent)
//	GET  /inbox/questions/{id}              one question, its earlier rounds, its thread and its decision trail
//	POST /inbox/questions/{id}/answer       the question page's form (answer, decision, comment, csrf)
//	POST /inbox/questions/{id}/reverse      reverses an accepted suggestion (answer, decision, comment, csrf)
//	GET  /inbox/history                     answered, expired and withdrawn questions (query: status, route, kind, subagent)
//	GET  /inbox/events                      Server-Sent Events for the pages (query: route, kind, subagent, question)
//	GET  /inbox/login, POST /inbox/login    sign in; POST /inbox/logout signs out
//	GET  /inbox/api/questions               JSON list (query: status=pending|answered|expired|withdrawn|closed|all, route, kind, subagent, thread, limit, cursor)
//	GET  /inbox/api/questions/{id}          JSON Detail: the question, its earlier rounds, its thread, its trail
//	POST /inbox/api/questions/{id}/answer   JSON {"answer", "decision", "comment"} → client.AnswerReply
//	POST /inbox/api/questions/{id}/reverse  JSON {"answer", "decision", "comment"} → client.ReverseReply
//	POST /inbox/api/login                   JSON {"name", "password"} or {"token"} → a bearer token
//	POST /inbox/api/questions/{id}/links    JSON {"audience", "ttl"} → the question's signed answer links
//	GET  /inbox/decisions                   remembered decisions (query: route), each with a forget button
//	POST /inbox/decisions/{id}/forget       the forget button (csrf)
//	GET  /inbox/api/decisions               JSON DecisionList (query: route)
//	DELETE /inbox/api/decisions/{id}        forgets one → the forgotten client.Decision
//	GET  /inbox/a/{token}, POST             a signed answer link: GET confirms, POST answers once
//	GET  /inbox/static/…, GET /inbox/healthz
//
// People sign in from a users file (name, bcrypt hash, allowed routes) or,
// for agora dev, with one token generated at start. Sessions are kept in
// the KV bucket agora_inbox_sessions, so they survive restarts and are
// shared by replicas (docs/inbox.md). Pages need the session
// cookie (HttpOnly, SameSite=Strict, Secure over TLS) and every form
// carries a CSRF token; the JSON API takes the cookie plus the X-CSRF-Token
// header, or a bearer token. Without a sign-in pages redirect to the login
// page and the API answers 401; a question on a route the user may not
// answer is 403.
package inbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/agora-dispatch/agora/internal/config"
	"github.com/agora-dispatch/agora/internal/svc"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// Prefix is the path under which Handler serves everything.
const Prefix = "/inbox"

// Deps are the inbox's collaborators. Every field is optional.
type Deps struct {
	// Client is the Agora client to read and answer through; it stays the
	// caller's. When nil, Conn is used.
	Client *client.Client
	// Conn is an existing NATS connection, which stays the caller's; when
	// both are nil, New connects to Config.NATSURL and Run closes that
	// connection.
	Conn *nats.Conn
	// Logger receives structured logs; default slog.Default().
	Logger *slog.Logger
	// Registerer receives the inbox's metrics; default a new registry.
	Registerer prometheus.Registerer
	// Listening, when set, is called by Run with the inbox's base URL
	// (scheme, the listener's real address, Prefix) once its HTTP listener
	// accepts connections, so a caller prints a link that works at once.
	Listening func(baseURL string)
}

// Server is an inbox. Create it with New; Handler serves the pages and the
// API, Run keeps the questions current (and serves HTTP itself when
// Config.HTTPAddr is set). A Server is safe for concurrent use.
type Server struct {
	cfg     Config
	c       *client.Client
	nc      *nats.Conn
	ownConn bool
	log     *slog.Logger
	metrics *metrics
	// listening is Deps.Listening.
	listening func(baseURL string)

	users    atomic.Pointer[map[string]*user] // users-file mode; ReloadUsers swaps it
	devToken string                           // dev-token mode
	devUser  *user
	sessions *sessions
	logins   *limiter
	links    *linkDoor       // nil without Config.LinkKey
	routes   map[string]bool // the routes shown; nil: all

	store *store
	// records and questionsStream are the agora_questions bucket and its
	// stream, set by Run: closed questions are read from them.
	records         jetstream.KeyValue
	questionsStream jetstream.Stream
	pages           map[string]*template.Template
	assets          map[string]asset
	handler         http.Handler
	running         atomic.Bool
	stopping        chan struct{}
	stopOnce        sync.Once
}

// New checks cfg, loads the users file (or generates the dev token) and
// prepares an inbox. It connects to NATS when deps has neither Client nor
// Conn; it does not touch JetStream until Run.
func New(cfg Config, deps Deps) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("inbox: config: %w", err)
	}
	cfg = cfg.withDefaults()
	s := &Server{cfg: cfg, log: svc.Logger(deps.Logger, "service", "inbox"), listening: deps.Listening, store: newStore(), stopping: make(chan struct{}),
		logins: newLimiter(cfg.LoginAttempts, cfg.LoginWindow, cfg.TrustProxy)}
	s.sessions = newSessions(cfg.SessionTTL, s.log)
	if cfg.LinkKey != "" {
		d, err := newLinkDoor(cfg.LinkKey)
		if err != nil {
			return nil, err
		}
		s.links = d
	}
	if len(cfg.Routes) > 0 {
		s.routes = map[string]bool{}
		for _, r := range cfg.Routes {
			s.routes[r] = true
		}
	}
	if cfg.DevToken {
		s.devToken = randomToken()
		s.devUser = &user{name: DevUser}
	} else if err := s.loadUsers(); err != nil {
		return nil, err
	}
	reg := deps.Registerer
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m, err := newMetrics(reg, s.store, s.sessions)
	if err != nil {
		return nil, err
	}
	s.metrics = m
	s.assets = loadAssets()
	if s.pages, err = parsePages(s.staticURL); err != nil {
		return nil, err
	}

	s.handler = s.routesHandler()
	if s.c, s.nc, s.ownConn, err = svc.Client(deps.Client, deps.Conn, "inbox", cfg.NATSURL, cfg.NATSCreds, s.log); err != nil {
		return nil, err
	}
	return s, nil
}

// loadUsers reads the users file into s.users.
func (s *Server) loadUsers() error {
	list, err := LoadUsers(s.cfg.UsersFile)
	if err != nil {
		return fmt.Errorf("%w (%s)", err, config.Var(s.cfg, "UsersFile"))
	}
	users := map[string]*user{}
	for _, u := range list {
		if cost, _ := bcryptCost(u.Bcrypt); cost < minBcryptCost {
			s.log.Warn("users file: weak bcrypt hash; use cost 10 or more", "user", u.Name, "cost", cost)
		}
		users[u.Name] = &user{name: u.Name, hash: []byte(u.Bcrypt), routes: u.Routes}
	}
	s.users.Store(&users)
	return nil
}

// ReloadUsers reads the users file again (the inbox's command calls it on
// SIGHUP). An invalid file changes nothing and the error names every
// problem. A user no longer in the file is signed out on their next
// request; changed routes and passwords take effect at once. In dev-token
// mode it does nothing.
func (s *Server) ReloadUsers() error {
	if s.cfg.UsersFile == "" {
		return nil
	}
	if err := s.loadUsers(); err != nil {
		return err
	}
	s.log.Info("users file reloaded", "users", len(*s.users.Load()))
	return nil
}

// userNamed returns the user of a session as the users file says now.
func (s *Server) userNamed(name string) (*user, bool) {
	if s.devUser != nil {
		return s.devUser, name == s.devUser.name
	}
	u, ok := (*s.users.Load())[name]
	return u, ok
}

// DevToken returns the token that signs in as DevUser in dev-token mode,
// for the caller to print; "" in users-file mode. LoginLink makes it a
// link that signs in with one click.
func (s *Server) DevToken() string { return s.devToken }

// LoginLink is the sign-in link to print for the inbox served at base
// (scheme and host, e.g. "http://127.0.0.1:8080") in dev-token mode:
// base/inbox/login#token=<token>. The token rides in the fragment, which
// a browser never sends, so it reaches no server log, proxy or Referer;
// the login page's script moves it into the sign-in form and submits it
// (a POST with the form's CSRF token, as a typed sign-in). Without
// JavaScript the page asks for the token to be pasted. With no token it
// is the inbox's front page.
func LoginLink(base, token string) string {
	if token == "" {
		return base + Prefix + "/"
	}
	return base + Prefix + "/login#token=" + url.QueryEscape(token)
}

// Ready is closed once Run has loaded every question record.
func (s *Server) Ready() <-chan struct{} { return s.store.ready }

// Handler serves the pages, the live event streams and the JSON API under
// Prefix. It may be mounted before Run starts: pages wait (up to a few
// seconds) for the questions to be loaded. Event streams end when Run
// stops.
func (s *Server) Handler() http.Handler { return s.handler }

// Run keeps the view of the questions current until ctx ends: it watches
// the agora_questions bucket, feeding the live event streams, and restarts
// the watch (reloading every record) when it breaks. When Config.HTTPAddr
// is set it also serves Handler there. Run fails at once when the bucket
// does not exist or the first load fails. On cancel it ends the event
// streams, shuts the HTTP server down, and closes the connection New
// opened; it returns nil after a clean stop. Run may be called once.
func (s *Server) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("inbox: Run called twice")
	}
	defer s.closeConn()
	defer s.stop()
	js, err := jetstream.New(s.nc)
	if err != nil {
		return fmt.Errorf("inbox: jetstream: %w", err)
	}
	kv, err := s.openBuckets(ctx, js)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}

	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	sessionsDone := make(chan struct{})
	go func() {
		defer close(sessionsDone)
		s.sessions.watch(wctx)
	}()
	defer func() { stopWatch(); <-sessionsDone }()
	watchDone := make(chan struct{})
	if loaded, err := s.load(ctx, wctx, kv, watchDone); !loaded {
		stopWatch()
		<-watchDone
		return err
	}
	s.log.Info("inbox started", "pending", s.store.pendingCount(), "routes", s.cfg.Routes, "dev_token", s.devToken != "")

	srv, httpErr, public, err := s.serveHTTP()
	if err != nil {
		stopWatch()
		<-watchDone
		return err
	}
	if public != "" {
		// Tell clients where people answer (the CLI's printed links).
		unannounce, err := s.announce(public)
		if err != nil {
			s.log.Warn("inbox URL not announced over NATS; CLI links use AGORA_INBOX_URL or their default", "url", public, "err", err)
		}
		defer unannounce()
	}

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-httpErr:
		s.log.Error("http server failed; stopping", "err", runErr)
	}
	s.stop() // ends the event streams, so Shutdown does not wait for them
	if srv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = srv.Shutdown(sctx)
		cancel()
	}
	stopWatch()
	<-watchDone
	s.log.Info("inbox stopped")
	return runErr
}

// openBuckets binds the inbox to the questions bucket, its stream, the
// sessions bucket and, with answer links on, the links bucket; it returns
// the questions bucket.
func (s *Server) openBuckets(ctx context.Context, js jetstream.JetStream) (jetstream.KeyValue, error) {
	bucket := func(name string) (jetstream.KeyValue, error) {
		bctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		kv, err := js.KeyValue(bctx, name)
		if err != nil {
			return nil, fmt.Errorf("inbox: bucket %s: %w (run `agora dev`, or provision the streams first)", name, err)
		}
		return kv, nil
	}
	kv, err := bucket(lifecycle.BucketQuestions)
	if err != nil {
		return nil, err
	}
	skv, err := bucket(lifecycle.BucketInboxSessions)
	var lkv jetstream.KeyValue
	if err == nil && s.links != nil {
		lkv, err = bucket(lifecycle.BucketAnswerLinks)
	}
	if err != nil {
		return nil, err
	}
	if s.links != nil {
		s.links.open(lkv)
	}
	s.sessions.open(skv)
	s.records = kv
	sctx, scancel := context.WithTimeout(ctx, 15*time.Second)
	defer scancel()
	if s.questionsStream, err = js.Stream(sctx, "KV_"+lifecycle.BucketQuestions); err != nil {
		return nil, fmt.Errorf("inbox: bucket %s: %w", lifecycle.BucketQuestions, err)
	}
	return kv, nil
}

// load starts the watch of the questions bucket on wctx, which closes
// watchDone when it ends, and waits until it has loaded every question
// (loaded), it failed, or ctx ended (no error then: Run returns nil).
func (s *Server) load(ctx, wctx context.Context, kv jetstream.KeyValue, watchDone chan struct{}) (loaded bool, err error) {
	done := make(chan struct{})
	var once sync.Once
	firstErr := make(chan error, 1)
	go func() {
		defer close(watchDone)
		s.watchLoop(wctx, kv, func() { once.Do(func() { close(done) }) }, done, firstErr)
	}()
	select {
	case <-done:
		return true, nil
	case err := <-firstErr:
		return false, err
	case <-ctx.Done():
		return false, nil
	}
}

// serveHTTP serves the pages and the API when Config.HTTPAddr is set. It
// returns the server (nil without one), the channel of its failure, and
// the URL to announce: Config.PublicURL, or else the listener's.
func (s *Server) serveHTTP() (*http.Server, <-chan error, string, error) {
	public := s.cfg.PublicURL // announced over NATS
	if s.cfg.HTTPAddr == "" {
		return nil, nil, public, nil
	}
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	var serve func(net.Listener) error
	scheme := "http"
	if s.cfg.TLSCert != "" {
		serve = func(ln net.Listener) error { return srv.ServeTLS(ln, s.cfg.TLSCert, s.cfg.TLSKey) }
		scheme = "https"
	}
	addr, httpErr, err := svc.ServeHTTP("inbox", config.Var(s.cfg, "HTTPAddr"), s.cfg.HTTPAddr, srv, serve)
	if err != nil {
		return nil, nil, "", err
	}
	base := scheme + "://" + addr.String() + Prefix
	s.log.Info("http listening", "url", base+"/")
	if s.listening != nil {
		s.listening(base)
	}
	return srv, httpErr, cmp.Or(public, base), nil
}

// watchLoop runs the bucket watch, restarting it with backoff. An error
// before the first load is handed to firstErr and ends the loop.
func (s *Server) watchLoop(ctx context.Context, kv jetstream.KeyValue, onLoaded func(), loaded <-chan struct{}, firstErr chan<- error) {
	const maxBackoff = 30 * time.Second
	backoff := 500 * time.Millisecond
	for {
		started := time.Now()
		err := s.store.watchOnce(ctx, kv, onLoaded)
		if ctx.Err() != nil {
			return
		}
		select {
		case <-loaded:
		default:
			firstErr <- err
			return
		}
		if time.Since(started) > time.Minute {
			backoff = 500 * time.Millisecond
		}
		s.log.Warn("the watch of the questions bucket broke; restarting it", "err", err, "retry_in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

func (s *Server) stop() { s.stopOnce.Do(func() { close(s.stopping) }) }

func (s *Server) closeConn() {
	if !s.ownConn {
		return
	}
	if err := s.nc.Drain(); err != nil {
		s.nc.Close()
	}
}

// shows reports whether this inbox shows questions on route.
func (s *Server) shows(route string) bool { return s.routes == nil || s.routes[route] }

// visible reports whether u sees q: the inbox shows its route and u may
// answer there.
func (s *Server) visible(u *user, q *Question) bool { return s.shows(q.Route) && u.may(q.Route) }

// awaitReady waits for the first load of the questions, for requests that
// come before Run has loaded them.
func (s *Server) awaitReady(ctx context.Context) bool {
	select {
	case <-s.store.ready:
		return true
	default:
	}
	t := time.NewTimer(readyWait)
	defer t.Stop()
	select {
	case <-s.store.ready:
		return true
	case <-ctx.Done():
	case <-t.C:
	}
	return false
}

// readyWait bounds how long a request waits for the first load.
const readyWait = 10 * time.Second
