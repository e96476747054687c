package inbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.yaml.in/yaml/v3"
	"golang.org/x/crypto/bcrypt"

	"github.com/agora-dispatch/agora/answerers/inbox"
	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/services/dispatcher"
	"github.com/agora-dispatch/agora/services/router"
	"github.com/agora-dispatch/agora/services/worker"
)

// waitFor bounds every wait: generous, the machine is shared.
const waitFor = 60 * time.Second

func quietLogger() *slog.Logger {
	if testing.Verbose() && os.Getenv("AGORA_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// testRoutes sends approvals, quick-*, ops-*, bot-* and memo-* sub-agents
// to their own routes (an answerer of bots suggests, taken at 0.9 and
// sent to human below; memo remembers its answers); the rest goes to
// human.
const testRoutes = `routes:
  - name: approvals
    match: {kind: approval}
    answerer: human
    deadline: 4h
  - name: quick
    match: {subagent: "quick-*"}
    answerer: human
    deadline: 1s
    on_expiry: fail
  - name: ops
    match: {subagent: "ops-*"}
    answerer: human
    fallback: human
  - name: bots
    match: {subagent: "bot-*"}
    answerer: bot
    auto_accept: 0.9
    fallback: human
  - name: memo
    match: {subagent: "memo-*"}
    answerer: human
    remember: 720h
  - name: human
    answerer: human
`

// asker asks its input as its question (the input is a valid sentinel) in
// every round below $ASK_ROUNDS (default 1), then finishes with its input,
// which carries the answer, as its output.
const asker = `if [ "$AGORA_ROUND" -lt "${ASK_ROUNDS:-1}" ]; then
  cp "$AGORA_INPUT_FILE" "$AGORA_NEEDS_INPUT_FILE"
else
  cp "$AGORA_INPUT_FILE" "$AGORA_OUTPUT_FILE"
fi`

// password is every test user's password.
const password = "correct horse battery staple"

// testUsers: alice and bob answer every route, carol only approvals.
var testUsers = []struct {
	name   string
	routes []string
}{{"alice", nil}, {"bob", nil}, {"carol", []string{"approvals"}}}

type options struct {
	dev         bool     // dev-token mode instead of the users file
	inboxRoutes []string // Config.Routes
	tls         bool
	noWorker    bool
	publicURL   string // Config.PublicURL
	linkKey     string // Config.LinkKey
	pendingRows int    // Config.PendingRows
}

// system is a real JetStream with the dispatcher, worker and router, and
// an inbox on an httptest server.
type system struct {
	t      *testing.T
	srv    *natstest.Server
	c      *client.Client
	inbox  *inbox.Server
	web    *httptest.Server
	bearer string // signs in as alice (users file) or dev
	cfg    inbox.Config
}

func start(t *testing.T, o options) *system {
	t.Helper()
	srv := natstest.StartProvisioned(t, provision.Config{})
	dir := t.TempDir()
	routes := filepath.Join(dir, "routes.yaml")
	if err := os.WriteFile(routes, []byte(testRoutes), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := inbox.Config{DevToken: o.dev, Routes: o.inboxRoutes, PublicURL: o.publicURL, LinkKey: o.linkKey, PendingRows: o.pendingRows}
	if !o.dev {
		var users []inbox.User
		for _, u := range testUsers {
			h, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.MinCost)
			if err != nil {
				t.Fatal(err)
			}
			users = append(users, inbox.User{Name: u.name, Bcrypt: string(h), Routes: u.routes})
		}
		b, err := yaml.Marshal(users)
		if err != nil {
			t.Fatal(err)
		}
		cfg.UsersFile = filepath.Join(dir, "users.yaml")
		if err := os.WriteFile(cfg.UsersFile, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// Connections first: cleanups run last-in first-out, so the services
	// stop before their connections close.
	dconn, wconn, rconn, iconn := srv.Conn(t), srv.Conn(t), srv.Conn(t), srv.Conn(t)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	run := func(name string, f func(context.Context) error) {
		wg.Go(func() {
			if err := f(ctx); err != nil {
				t.Errorf("%s: %v", name, err)
			}
		})
	}
	d, err := dispatcher.New(dispatcher.Config{ShutdownTimeout: 5 * time.Second}, dispatcher.Deps{Conn: dconn, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	run("dispatcher", d.Run)
	if !o.noWorker {
		w, err := worker.New(worker.Config{WorkspaceRoot: t.TempDir(), Concurrency: 4, PullExpiry: 500 * time.Millisecond, KillGrace: 500 * time.Millisecond, ShutdownTimeout: 5 * time.Second},
			worker.Deps{Conn: wconn, Logger: quietLogger()})
		if err != nil {
			t.Fatal(err)
		}
		run("worker", w.Run)
	}
	r, err := router.New(router.Config{RoutesFile: routes, Tick: 100 * time.Millisecond, RecordWait: 500 * time.Millisecond, ShutdownTimeout: 5 * time.Second},
		router.Deps{Conn: rconn, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	run("router", r.Run)
	in, err := inbox.New(cfg, inbox.Deps{Conn: iconn, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	run("inbox", in.Run)
	for _, ready := range []<-chan struct{}{d.Ready(), r.Ready(), in.Ready()} {
		select {
		case <-ready:
		case <-time.After(waitFor):
			t.Fatal("services not ready")
		}
	}
	var web *httptest.Server
	if o.tls {
		web = httptest.NewTLSServer(in.Handler())
	} else {
		web = httptest.NewServer(in.Handler())
	}
	// Close the web server before the inbox stops (cleanups run in reverse).
	t.Cleanup(web.Close)
	c, err := client.New(dconn)
	if err != nil {
		t.Fatal(err)
	}
	s := &system{t: t, srv: srv, c: c, inbox: in, web: web, cfg: cfg}
	for _, name := range []string{"asker", "ops-asker", "quick-asker", "memo-asker", "bot-asker"} {
		s.shell(name, asker)
	}
	if o.dev {
		s.bearer = in.DevToken()
	} else {
		s.bearer = s.apiLogin("alice", password)
	}
	return s
}

// bucket opens a KV bucket of the test's Agora.
func (s *system) bucket(name string) jetstream.KeyValue {
	s.t.Helper()
	js, err := jetstream.New(s.srv.Conn(s.t))
	if err != nil {
		s.t.Fatal(err)
	}
	kv, err := js.KeyValue(s.t.Context(), name)
	if err != nil {
		s.t.Fatal(err)
	}
	return kv
}

// shell registers an exec sub-agent running script with sh -c.
func (s *system) shell(name, script string) {
	s.t.Helper()
	kv := s.bucket(lifecycle.BucketSubagents)
	b, _ := json.Marshal(subagent.Definition{Name: name, Runtime: subagent.RuntimeExec, Command: []string{"sh", "-c", script}, Timeout: "1m", EnvAllow: []string{"ASK_ROUNDS"}})
	if _, err := kv.Put(s.t.Context(), name, b); err != nil {
		s.t.Fatal(err)
	}
}

// sentinel is what an asker sub-agent asks: its input.
type sentinel struct {
	Question string   `json:"question"`
	Options  []string `json:"options,omitempty"`
	Context  string   `json:"context,omitempty"`
	Kind     string   `json:"kind,omitempty"`
}

// ask dispatches sub-agent sa asking q in its first rounds (1 unless
// rounds says more) and waits until the inbox shows the question.
func (s *system) ask(sa string, q sentinel, rounds int) (*client.Dispatch, string) {
	s.t.Helper()
	in, _ := json.Marshal(q)
	req := lifecycle.Request{Subagent: sa, Input: in, Target: "repo/agora", Labels: map[string]string{"team": "core"}}
	if rounds > 1 {
		req.Env = map[string]string{"ASK_ROUNDS": string(rune('0' + rounds))}
	}
	return s.dispatchAsked(req)
}

// dispatchAsked dispatches req and waits until the inbox shows its
// question pending; it returns the dispatch and the question's id.
func (s *system) dispatchAsked(req lifecycle.Request) (*client.Dispatch, string) {
	s.t.Helper()
	d, err := s.c.Dispatch(s.t.Context(), req)
	if err != nil {
		s.t.Fatalf("dispatch %s: %v", req.Subagent, err)
	}
	qid := lifecycle.QuestionID(d.DispatchID)
	s.waitQuestion(qid, func(q *inbox.Question) bool { return q.Pending() })
	return d, qid
}

// waitQuestion waits until the inbox's API shows question qid and ok holds.
func (s *system) waitQuestion(qid string, ok func(*inbox.Question) bool) *inbox.Detail {
	s.t.Helper()
	deadline := time.Now().Add(waitFor)
	var last string
	for time.Now().Before(deadline) {
		status, body := s.apiCall(http.MethodGet, "/inbox/api/questions/"+qid, nil, map[string]string{"Authorization": "Bearer " + s.bearer})
		if status == http.StatusOK {
			var d inbox.Detail
			if err := json.Unmarshal([]byte(body), &d); err != nil {
				s.t.Fatalf("detail %s: %v", body, err)
			}
			if ok(d.Question) {
				return &d
			}
		}
		last = body
		time.Sleep(50 * time.Millisecond)
	}
	s.t.Fatalf("question %s never got there; last %s", qid, last)
	return nil
}

// nextRoundQuestion waits for the question the thread asks in round n.
func (s *system) nextRoundQuestion(threadID string, n int) string {
	s.t.Helper()
	var qid string
	testkit.Eventually(s.t, waitFor, fmt.Sprintf("thread %s to ask in round %d", threadID, n), func() bool {
		qs, err := s.c.Questions(s.t.Context(), client.QuestionFilter{ThreadID: threadID})
		if err != nil {
			s.t.Fatal(err)
		}
		for _, q := range qs {
			if q.Round == n {
				qid = q.QuestionID
				return true
			}
		}
		return false
	})
	s.waitQuestion(qid, func(q *inbox.Question) bool { return true })
	return qid
}

// finished waits for the thread's end and returns its finished output.
func (s *system) finished(threadID string) map[string]json.RawMessage {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(s.t.Context(), waitFor)
	defer cancel()
	end, err := s.c.Follow(ctx, threadID, nil)
	if err != nil {
		s.t.Fatalf("Follow %s: %v", threadID, err)
	}
	fin, ok := end.Data.(*lifecycle.Finished)
	if !ok {
		s.t.Fatalf("thread %s ended %T %+v", threadID, end.Data, end.Data)
	}
	var out map[string]json.RawMessage
	if err := json.Unmarshal(fin.Output, &out); err != nil {
		s.t.Fatalf("output %s: %v", fin.Output, err)
	}
	return out
}

// listAPI GETs /inbox/api/questions?query as the signed-in bearer and
// decodes the list; anything but 200 fails the test.
func (s *system) listAPI(query string) inbox.List {
	s.t.Helper()
	status, body := s.apiCall(http.MethodGet, "/inbox/api/questions?"+query, nil, map[string]string{"Authorization": "Bearer " + s.bearer})
	if status != http.StatusOK {
		s.t.Fatalf("list ?%s: %d %s", query, status, body)
	}
	var l inbox.List
	if err := json.Unmarshal([]byte(body), &l); err != nil {
		s.t.Fatalf("list ?%s: %v: %s", query, err, body)
	}
	return l
}

func (s *system) apiCall(method, path string, body any, header map[string]string) (int, string) {
	s.t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			s.t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(s.t.Context(), method, s.web.URL+path, rd)
	if err != nil {
		s.t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	return send(s.t, s.web.Client(), req)
}

// apiLogin signs in through the API and returns the bearer token.
func (s *system) apiLogin(name, pw string) string {
	s.t.Helper()
	status, body := s.apiCall(http.MethodPost, "/inbox/api/login", inbox.LoginRequest{Name: name, Password: pw}, nil)
	if status != http.StatusOK {
		s.t.Fatalf("api login %s: %d %s", name, status, body)
	}
	var rep inbox.LoginReply
	if err := json.Unmarshal([]byte(body), &rep); err != nil || rep.Token == "" || rep.User != name {
		s.t.Fatalf("api login reply %s: %v", body, err)
	}
	return rep.Token
}

// browser is a cookie-keeping HTTP client that does not follow redirects.
type browser struct {
	t    *testing.T
	s    *system
	hc   *http.Client
	csrf string
	// base is the inbox's server (s.web's by default); cookies are kept
	// per host, so the same browser visits another replica on this host
	// signed in.
	base string
}

func (s *system) browser() *browser {
	s.t.Helper()
	jar, err := cookiejar.New(nil)
	if err != nil {
		s.t.Fatal(err)
	}
	hc := *s.web.Client()
	hc.Jar = jar
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &browser{t: s.t, s: s, hc: &hc, base: s.web.URL}
}

type page struct {
	status   int
	body     string
	location string
	header   http.Header
}

func (b *browser) do(req *http.Request) page {
	b.t.Helper()
	resp, err := b.hc.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if m := csrfRE.FindStringSubmatch(string(body)); m != nil && m[1] != "" {
		b.csrf = m[1]
	}
	return page{status: resp.StatusCode, body: string(body), location: resp.Header.Get("Location"), header: resp.Header}
}

var csrfRE = regexp.MustCompile(`<meta name="csrf-token" content="([^"]*)">`)

func (b *browser) get(path string) page {
	b.t.Helper()
	req, err := http.NewRequestWithContext(b.t.Context(), http.MethodGet, b.base+path, nil)
	if err != nil {
		b.t.Fatal(err)
	}
	return b.do(req)
}

// post sends a form; the page's CSRF token is added unless form has one.
func (b *browser) post(path string, form url.Values) page {
	b.t.Helper()
	if _, ok := form["csrf"]; !ok {
		form.Set("csrf", b.csrf)
	}
	req, err := http.NewRequestWithContext(b.t.Context(), http.MethodPost, b.base+path, strings.NewReader(form.Encode()))
	if err != nil {
		b.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return b.do(req)
}

// api sends a JSON API call with the session cookie (and the CSRF header
// when csrf is true).
func (b *browser) api(method, path string, body any, csrf bool) page {
	b.t.Helper()
	var rd io.Reader
	if body != nil {
		j, _ := json.Marshal(body)
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequestWithContext(b.t.Context(), method, b.base+path, rd)
	if err != nil {
		b.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if csrf {
		req.Header.Set(inbox.CSRFHeader, b.csrf)
	}
	return b.do(req)
}

// login signs in through the login page (name and password, or the dev
// token as password when name is empty).
func (b *browser) login(name, pw string) {
	b.t.Helper()
	p := b.get("/inbox/login")
	if p.status != http.StatusOK {
		b.t.Fatalf("login page: %d", p.status)
	}
	form := url.Values{"next": {"/inbox/"}}
	if name == "" {
		form.Set("token", pw)
	} else {
		form.Set("name", name)
		form.Set("password", pw)
	}
	p = b.post("/inbox/login", form)
	if p.status != http.StatusSeeOther || p.location != "/inbox/" {
		b.t.Fatalf("login %s: %d %s %s", name, p.status, p.location, p.body)
	}
	if p = b.get("/inbox/"); p.status != http.StatusOK {
		b.t.Fatalf("after login: %d", p.status)
	}
}

// cookie returns the browser's cookie named name for the inbox.
func (b *browser) cookie(name string) *http.Cookie {
	u, _ := url.Parse(b.base + "/inbox/")
	for _, c := range b.hc.Jar.Cookies(u) {
		if c.Name == name {
			return c
		}
	}
	return nil
}

func mustContain(t *testing.T, what, body string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(body, w) {
			t.Errorf("%s lacks %q:\n%s", what, w, clipBody(body))
		}
	}
}

func mustNotContain(t *testing.T, what, body string, bads ...string) {
	t.Helper()
	for _, w := range bads {
		if strings.Contains(body, w) {
			t.Errorf("%s contains %q:\n%s", what, w, clipBody(body))
		}
	}
}

func clipBody(s string) string {
	if len(s) > 4000 {
		return s[:4000] + "…"
	}
	return s
}

// replica is another inbox process on the same NATS server.
type replica struct {
	in   *inbox.Server
	web  *httptest.Server
	stop func()
}

// replica starts another inbox with the system's configuration, changed
// by mut when not nil. stop ends it (as a process exit would); the test's
// cleanup stops it too.
func (s *system) replica(mut func(*inbox.Config)) *replica {
	s.t.Helper()
	cfg := s.cfg
	if mut != nil {
		mut(&cfg)
	}
	nc := s.srv.Conn(s.t)
	in, err := inbox.New(cfg, inbox.Deps{Conn: nc, Logger: quietLogger()})
	if err != nil {
		s.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := in.Run(ctx); err != nil {
			s.t.Errorf("inbox replica: %v", err)
		}
	}()
	select {
	case <-in.Ready():
	case <-time.After(waitFor):
		s.t.Fatal("inbox replica not ready")
	}
	web := httptest.NewServer(in.Handler())
	var once sync.Once
	stop := func() { once.Do(func() { web.Close(); cancel(); <-done }) }
	s.t.Cleanup(stop)
	return &replica{in: in, web: web, stop: stop}
}

// apiLoginAt signs in through the API of the inbox at base.
func (s *system) apiLoginAt(base, name, pw string) string {
	s.t.Helper()
	b, _ := json.Marshal(inbox.LoginRequest{Name: name, Password: pw})
	resp, err := http.Post(base+"/inbox/api/login", "application/json", bytes.NewReader(b))
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	var rep inbox.LoginReply
	if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil || resp.StatusCode != http.StatusOK || rep.Token == "" {
		s.t.Fatalf("api login %s at %s: %d %v", name, base, resp.StatusCode, err)
	}
	return rep.Token
}

// apiGet is a GET with a bearer token.
func apiGet(t *testing.T, u, token string) (int, string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, u, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	return send(t, http.DefaultClient, req)
}

// send sends req with hc and returns the response's status and body.
func send(t *testing.T, hc *http.Client, req *http.Request) (int, string) {
	t.Helper()
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }

// lifecycleQuestion is a free-text question record with only an id, for
// minting links outside the inbox.
func lifecycleQuestion(qid string) lifecycle.Question { return lifecycle.Question{QuestionID: qid} }
