package webhook_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/agora-dispatch/agora/answerers/inbox"
	"github.com/agora-dispatch/agora/answerers/webhook"
	"github.com/agora-dispatch/agora/harness/systemtest"
	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/answerlink"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/seal"
)

const secret = "a-webhook-secret-for-tests"

const routes = `routes:
  - name: hooks
    match: {subagent: "hook-*"}
    answerer: webhook
    fallback: human
  - name: human
    answerer: human
`

// asker asks its input as its question in round 0 and finishes with its
// input (which carries the answer) in round 1.
const asker = `if [ "$AGORA_ROUND" -lt 1 ]; then
  printf '{"question":"Which function?","options":["A","B"],"kind":"decision","context":"two candidates"}' > "$AGORA_NEEDS_INPUT_FILE"
else
  cp "$AGORA_INPUT_FILE" "$AGORA_OUTPUT_FILE"
fi`

// receiver is the webhook's target: it verifies each POST's signature,
// keeps the bodies, and answers as respond says for the n-th request.
type receiver struct {
	t       *testing.T
	srv     *httptest.Server
	respond func(n int, w http.ResponseWriter)
	mu      sync.Mutex
	bodies  []webhook.Body
	ids     []string
	bad     []string
}

func newReceiver(t *testing.T, respond func(n int, w http.ResponseWriter)) *receiver {
	r := &receiver{t: t, respond: respond}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		if err := webhook.Verify(secret, req.Header.Get(webhook.SignatureHeader), b, time.Now(), 5*time.Minute); err != nil {
			r.bad = append(r.bad, err.Error())
		}
		if ct := req.Header.Get("Content-Type"); ct != "application/json" || req.Method != http.MethodPost {
			r.bad = append(r.bad, req.Method+" "+ct)
		}
		var body webhook.Body
		if err := json.Unmarshal(b, &body); err != nil {
			r.bad = append(r.bad, "body: "+err.Error())
		}
		r.bodies = append(r.bodies, body)
		r.ids = append(r.ids, req.Header.Get(webhook.EventIDHeader))
		n := len(r.bodies)
		r.mu.Unlock()
		r.respond(n, w)
	}))
	t.Cleanup(r.srv.Close)
	t.Cleanup(func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if len(r.bad) > 0 {
			t.Errorf("bad requests: %q", r.bad)
		}
	})
	return r
}

func (r *receiver) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.bodies)
}

func (r *receiver) last() webhook.Body {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.bodies[len(r.bodies)-1]
}

type harness struct {
	sys *systemtest.System
	reg *prometheus.Registry
}

func start(t *testing.T, cfg webhook.Config) *harness {
	t.Helper()
	sys := systemtest.Start(t, systemtest.Options{Routes: routes})
	sys.Shell("hook-asker", asker)
	reg := prometheus.NewRegistry()
	cfg.Routes, cfg.Secret = []string{"hooks"}, secret
	if cfg.Backoff == 0 {
		cfg.Backoff = 50 * time.Millisecond
	}
	w, err := webhook.New(cfg, webhook.Deps{Conn: sys.Server.Conn(t), Logger: systemtest.Logger(), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	sys.Go("webhook", w.Run)
	select {
	case <-w.Ready():
	case <-time.After(time.Minute):
		t.Fatal("webhook not ready")
	}
	return &harness{sys: sys, reg: reg}
}

func (h *harness) ask(t *testing.T) string {
	t.Helper()
	d, err := h.sys.Client.Dispatch(t.Context(), lifecycle.Request{Subagent: "hook-asker", Labels: map[string]string{"assignee": "dana@example.com"}})
	if err != nil {
		t.Fatal(err)
	}
	return d.DispatchID
}

func (h *harness) route(t *testing.T, qid string) string {
	t.Helper()
	q, err := h.sys.Client.Question(t.Context(), qid)
	if err != nil {
		return ""
	}
	return q.Route
}

// A question arrives signed, with its links; following a link in the inbox
// answers it, and the thread resumes with the answer.
func TestPostsSignedQuestionWithLinksThatAnswer(t *testing.T) {
	key := seal.NewKey()
	rcv := newReceiver(t, func(int, http.ResponseWriter) {})
	sys := systemtest.Start(t, systemtest.Options{Routes: routes})
	sys.Shell("hook-asker", asker)
	in, err := inbox.New(inbox.Config{DevToken: true, LinkKey: key}, inbox.Deps{Conn: sys.Server.Conn(t), Logger: systemtest.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	sys.Go("inbox", in.Run)
	<-in.Ready()
	// The inbox that serves the links, on the same system.
	inboxWeb := httptest.NewServer(in.Handler())
	t.Cleanup(inboxWeb.Close)

	reg := prometheus.NewRegistry()
	w, err := webhook.New(webhook.Config{Routes: []string{"hooks"}, URL: rcv.srv.URL, Secret: secret, LinkKey: key,
		InboxURL: inboxWeb.URL + "/inbox", AudienceLabel: "assignee"}, webhook.Deps{Conn: sys.Server.Conn(t), Logger: systemtest.Logger(), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	sys.Go("webhook", w.Run)
	<-w.Ready()
	h := &harness{sys: sys, reg: reg}

	id := h.ask(t)
	qid := lifecycle.QuestionID(id)
	testkit.Eventually(t, 30*time.Second, "the question posted", func() bool { return rcv.count() == 1 })
	b := rcv.last()
	if b.Type != "question.asked" || b.QuestionID != qid || b.DispatchID != id || b.ThreadID != id || b.Route != "hooks" ||
		b.Subagent != "hook-asker" || b.Question != "Which function?" || b.Context != "two candidates" || b.Kind != "decision" ||
		b.Labels["assignee"] != "dana@example.com" || b.Audience != "dana@example.com" || b.QuestionURL != inboxWeb.URL+"/inbox/questions/"+qid ||
		b.LinksExpireAt == nil || b.AskedAt.IsZero() {
		t.Errorf("body = %+v", b)
	}
	if rcv.ids[0] != qid {
		t.Errorf("%s = %q, want the question id", webhook.EventIDHeader, rcv.ids[0])
	}
	if len(b.Options) != 2 || b.OpenURL != "" {
		t.Fatalf("options %+v, open %q: want A and B with links and no free text (a decision)", b.Options, b.OpenURL)
	}
	m, _ := answerlink.New(key)
	for _, o := range b.Options {
		tok, ok := strings.CutPrefix(o.URL, inboxWeb.URL+answerlink.Path)
		c, err := m.Open(tok, time.Now())
		if !ok || err != nil || c.QuestionID != qid || c.Option != o.Option || c.Audience != "dana@example.com" || c.Route != "hooks" || c.MintedBy != "webhook:hooks" {
			t.Errorf("link of %s: %q opens as %+v, %v", o.Option, o.URL, c, err)
		}
	}
	// A person follows link B: the inbox asks to confirm, then answers.
	resp, err := http.PostForm(b.Options[1].URL, url.Values{})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST link: %d", resp.StatusCode)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	end, err := sys.Client.Follow(ctx, id, nil)
	if err != nil {
		t.Fatal(err)
	}
	fin, ok := end.Data.(*lifecycle.Finished)
	if !ok || !strings.Contains(string(fin.Output), `"answer":"B"`) || !strings.Contains(string(fin.Output), `"answered_by":"dana@example.com (link from webhook:hooks)"`) {
		t.Errorf("thread ended %T %s", end.Data, fin.Output)
	}
	if n := testkit.Counter(t, h.reg, "agora_webhook_deliveries_total", map[string]string{"result": "delivered"}); n != 1 {
		t.Errorf("delivered = %v, want 1", n)
	}
}

// Failures are retried with backoff, honouring Retry-After, until the
// receiver takes the question: one delivery, the same event id each time.
func TestRetriesThenDelivers(t *testing.T) {
	var times []time.Time
	var mu sync.Mutex
	rcv := newReceiver(t, func(n int, w http.ResponseWriter) {
		mu.Lock()
		times = append(times, time.Now())
		mu.Unlock()
		switch n {
		case 1:
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
		case 2:
			w.WriteHeader(http.StatusBadGateway)
		default:
			w.WriteHeader(http.StatusNoContent)
		}
	})
	h := start(t, webhook.Config{URL: rcv.srv.URL})
	qid := lifecycle.QuestionID(h.ask(t))
	testkit.Eventually(t, 30*time.Second, "delivered", func() bool {
		return testkit.Counter(t, h.reg, "agora_webhook_deliveries_total", map[string]string{"result": "delivered"}) == 1
	})
	if n := rcv.count(); n != 3 {
		t.Errorf("%d POSTs, want 3", n)
	}
	for _, id := range rcv.ids {
		if id != qid {
			t.Errorf("event id %q, want %q on every attempt", id, qid)
		}
	}
	mu.Lock()
	if gap := times[1].Sub(times[0]); gap < 900*time.Millisecond {
		t.Errorf("retried %s after a Retry-After of 1s", gap)
	}
	mu.Unlock()
	if n := testkit.Counter(t, h.reg, "agora_webhook_retries_total", nil); n != 2 {
		t.Errorf("retries = %v, want 2", n)
	}
	if r := h.route(t, qid); r != "hooks" {
		t.Errorf("question on route %q, want it left on hooks", r)
	}
}

// A receiver that refuses the question (a 4xx) or keeps failing sends it
// to the route's fallback, so it is never stuck.
func TestFailureDeclinesToTheFallback(t *testing.T) {
	for name, tc := range map[string]struct {
		status, attempts, posts int
	}{
		"refused":            {http.StatusBadRequest, 5, 1},
		"attempts exhausted": {http.StatusInternalServerError, 3, 3},
	} {
		t.Run(name, func(t *testing.T) {
			rcv := newReceiver(t, func(_ int, w http.ResponseWriter) { w.WriteHeader(tc.status) })
			h := start(t, webhook.Config{URL: rcv.srv.URL, Attempts: tc.attempts})
			qid := lifecycle.QuestionID(h.ask(t))
			testkit.Eventually(t, 30*time.Second, "moved to the fallback", func() bool { return h.route(t, qid) == "human" })
			if n := rcv.count(); n != tc.posts {
				t.Errorf("%d POSTs, want %d", n, tc.posts)
			}
			testkit.Eventually(t, 30*time.Second, "counted", func() bool {
				return testkit.Counter(t, h.reg, "agora_webhook_declined_total", map[string]string{"route": "hooks"}) == 1
			})
			q, err := h.sys.Client.Question(t.Context(), qid)
			if err != nil || q.Status != "asked" {
				t.Errorf("question %+v, %v: want it still asked, on the fallback", q, err)
			}
		})
	}
}

// A receiver that redirects (a 307 keeps the method and the body) is not
// followed: the signed body and its signature never reach the other URL,
// and the question goes to the fallback as for a refusal.
func TestRedirectsAreNeverFollowed(t *testing.T) {
	other := newReceiver(t, func(_ int, w http.ResponseWriter) { w.WriteHeader(http.StatusNoContent) })
	rcv := newReceiver(t, func(_ int, w http.ResponseWriter) {
		w.Header().Set("Location", other.srv.URL+"/stolen")
		w.WriteHeader(http.StatusTemporaryRedirect)
	})
	h := start(t, webhook.Config{URL: rcv.srv.URL, Attempts: 3})
	qid := lifecycle.QuestionID(h.ask(t))
	testkit.Eventually(t, 30*time.Second, "moved to the fallback", func() bool { return h.route(t, qid) == "human" })
	if n := other.count(); n != 0 {
		t.Errorf("the redirect's target got %d POSTs, want none", n)
	}
	if n := rcv.count(); n != 1 {
		t.Errorf("%d POSTs to the receiver, want 1 (a redirect is not retried)", n)
	}
}

// A question answered elsewhere while a POST waits to be retried is not
// posted again.
func TestAnsweredElsewhereIsNotPosted(t *testing.T) {
	rcv := newReceiver(t, func(_ int, w http.ResponseWriter) {
		w.Header().Set("Retry-After", "2")
		w.WriteHeader(http.StatusTooManyRequests)
	})
	h := start(t, webhook.Config{URL: rcv.srv.URL})
	qid := lifecycle.QuestionID(h.ask(t))
	testkit.Eventually(t, 30*time.Second, "first POST", func() bool { return rcv.count() == 1 })
	if _, err := h.sys.Client.Answer(t.Context(), qid, lifecycle.Answer{Answer: "A", AnsweredBy: "alice"}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, "skipped", func() bool {
		return testkit.Counter(t, h.reg, "agora_webhook_deliveries_total", map[string]string{"result": "skipped"}) == 1
	})
	if n := rcv.count(); n != 1 {
		t.Errorf("%d POSTs, want 1: the question was answered before the retry", n)
	}
}

func TestVerify(t *testing.T) {
	body := []byte(`{"question_id":"q-1"}`)
	now := time.Now()
	good := webhook.Sign(secret, body, now)
	for name, tc := range map[string]struct {
		secret, header string
		body           []byte
		want           error
	}{
		"good":           {secret, good, body, nil},
		"two signatures": {secret, good + ",v1=00", body, nil},
		"wrong secret":   {"another-secret-of-16+", good, body, webhook.ErrMismatch},
		"body changed":   {secret, good, []byte(`{"question_id":"q-2"}`), webhook.ErrMismatch},
		"stale":          {secret, webhook.Sign(secret, body, now.Add(-10*time.Minute)), body, webhook.ErrStale},
		"future":         {secret, webhook.Sign(secret, body, now.Add(10*time.Minute)), body, webhook.ErrStale},
		"empty":          {secret, "", body, webhook.ErrMalformed},
		"no v1":          {secret, "t=" + strings.Split(strings.TrimPrefix(good, "t="), ",")[0], body, webhook.ErrMalformed},
		"garbage":        {secret, "sig", body, webhook.ErrMalformed},
	} {
		if err := webhook.Verify(tc.secret, tc.header, tc.body, now, 5*time.Minute); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
}

func TestConfig(t *testing.T) {
	ok := webhook.Config{Routes: []string{"hooks"}, URL: "https://example.com/hook", Secret: secret}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	for name, tc := range map[string]struct {
		mut  func(*webhook.Config)
		want string
	}{
		"no routes":     {func(c *webhook.Config) { c.Routes = nil }, "AGORA_WEBHOOK_ROUTES"},
		"bad route":     {func(c *webhook.Config) { c.Routes = []string{"a b"} }, "route \"a b\""},
		"no url":        {func(c *webhook.Config) { c.URL = "" }, "AGORA_WEBHOOK_URL"},
		"ftp url":       {func(c *webhook.Config) { c.URL = "ftp://x/y" }, "AGORA_WEBHOOK_URL"},
		"short secret":  {func(c *webhook.Config) { c.Secret = "short" }, "AGORA_WEBHOOK_SECRET"},
		"bad link key":  {func(c *webhook.Config) { c.LinkKey = "c2hvcnQ="; c.InboxURL = "https://x/inbox" }, "AGORA_ANSWER_LINK_KEY"},
		"key, no inbox": {func(c *webhook.Config) { c.LinkKey = seal.NewKey() }, "AGORA_WEBHOOK_INBOX_URL"},
		"attempts":      {func(c *webhook.Config) { c.Attempts = -1 }, "AGORA_WEBHOOK_ATTEMPTS"},
	} {
		c := ok
		tc.mut(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error naming %s", name, err, tc.want)
		}
	}
}
