package inbox_test

import (
	"bufio"
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/internal/testkit"

	"go.yaml.in/yaml/v3"
	"golang.org/x/crypto/bcrypt"

	"github.com/agora-dispatch/agora/answerers/inbox"
)

// A sign-in outlives the inbox process: the session is in the
// agora_inbox_sessions bucket, so a new process (or another replica) knows
// the cookie and the API token.
func TestSessionsSurviveRestart(t *testing.T) {
	s := start(t, options{noWorker: true})
	a := s.replica(nil)
	b := s.browser()
	b.base = a.web.URL
	b.login("alice", password)
	token := s.apiLoginAt(a.web.URL, "alice", password)
	a.stop()

	c := s.replica(nil)
	b.base = c.web.URL
	p := b.get("/inbox/")
	if p.status != http.StatusOK {
		t.Fatalf("after a restart the cookie gives %d %s, want 200", p.status, p.location)
	}
	mustContain(t, "pending page after restart", p.body, `title="Signed in as alice"`)
	status, body := apiGet(t, c.web.URL+"/inbox/api/questions", token)
	if status != http.StatusOK {
		t.Errorf("after a restart the API token gives %d %s, want 200", status, body)
	}
}

// Signing out on one replica ends the session on every replica, its live
// streams too.
func TestSignOutEverywhere(t *testing.T) {
	s := start(t, options{noWorker: true})
	a, bb := s.replica(nil), s.replica(nil)
	br := s.browser()
	br.base = a.web.URL
	br.login("alice", password)

	br.base = bb.web.URL
	if p := br.get("/inbox/"); p.status != http.StatusOK {
		t.Fatalf("the other replica: %d %s, want 200 (signed in)", p.status, p.location)
	}
	// A live stream on the other replica.
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, bb.web.URL+"/inbox/events", nil)
	resp, err := br.hc.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("events: %v %v", err, resp)
	}
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
		}
		resp.Body.Close()
	}()

	br.base = a.web.URL
	br.get("/inbox/") // the page's CSRF token
	if p := br.post("/inbox/logout", url.Values{}); p.status != http.StatusSeeOther {
		t.Fatalf("logout: %d %s", p.status, p.body)
	}
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the other replica's live stream still runs 10s after signing out")
	}
	br.base = bb.web.URL
	testkit.Eventually(t, 10*time.Second, "the other replica to stop serving the signed-out session", func() bool {
		p := br.get("/inbox/")
		return p.status == http.StatusSeeOther && p.location == "/inbox/login?next=%2Finbox%2F"
	})
}

// Failed sign-ins are limited per name and per address; the refusal says
// so and when to come back, and the password is then not even checked.
func TestLoginRateLimit(t *testing.T) {
	s := start(t, options{noWorker: true})
	r := s.replica(func(c *inbox.Config) { c.LoginAttempts = 3; c.LoginWindow = time.Hour })
	login := func(name, pw string) (int, string, http.Header) {
		t.Helper()
		b, _ := json.Marshal(inbox.LoginRequest{Name: name, Password: pw})
		resp, err := http.Post(r.web.URL+"/inbox/api/login", "application/json", bytesReader(b))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&body)
		detail, _ := body["detail"].(string)
		return resp.StatusCode, detail, resp.Header
	}
	for i := range 3 {
		if st, _, _ := login("alice", "wrong"); st != http.StatusUnauthorized {
			t.Fatalf("failure %d: %d, want 401", i+1, st)
		}
	}
	st, detail, h := login("alice", password)
	if st != http.StatusTooManyRequests {
		t.Fatalf("the right password after 3 failures: %d, want 429", st)
	}
	mustContain(t, "429 detail", detail, "Too many failed sign-ins for this name", "Try again in")
	if ra, err := strconv.Atoi(h.Get("Retry-After")); err != nil || ra < 3000 || ra > 3601 {
		t.Errorf("Retry-After = %q, want about an hour", h.Get("Retry-After"))
	}
	// Another name from the same address still gets in...
	if st, _, _ := login("bob", password); st != http.StatusOK {
		t.Fatalf("bob: %d, want 200", st)
	}
	// ...until the address has failed 4×3 times.
	for i := range 9 {
		if st, _, _ := login("nobody"+strconv.Itoa(i%3), "wrong"); st != http.StatusUnauthorized && st != http.StatusTooManyRequests {
			t.Fatalf("failure: %d", st)
		}
	}
	st, detail, _ = login("bob", password)
	if st != http.StatusTooManyRequests {
		t.Fatalf("bob after 12 failures from the address: %d, want 429", st)
	}
	mustContain(t, "429 detail", detail, "from your address")

	// The login page says it too.
	b := s.browser()
	b.base = r.web.URL
	b.get("/inbox/login")
	p := b.post("/inbox/login", url.Values{"name": {"carol"}, "password": {password}, "next": {"/inbox/"}})
	if p.status != http.StatusTooManyRequests {
		t.Fatalf("login form: %d, want 429", p.status)
	}
	mustContain(t, "login page", p.body, "Too many failed sign-ins from your address.", "Try again in")
}

// ReloadUsers (SIGHUP) takes a new users file: a removed user is signed
// out, a new one can sign in; an invalid file changes nothing.
func TestReloadUsers(t *testing.T) {
	s := start(t, options{noWorker: true})
	r := s.replica(nil)
	alice := s.apiLoginAt(r.web.URL, "alice", password)

	h, _ := bcrypt.GenerateFromPassword([]byte("dana's password"), bcrypt.MinCost)
	b, _ := yaml.Marshal([]inbox.User{{Name: "dana", Bcrypt: string(h)}})
	if err := os.WriteFile(s.cfg.UsersFile, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := r.in.ReloadUsers(); err != nil {
		t.Fatalf("ReloadUsers: %v", err)
	}
	if st, body := apiGet(t, r.web.URL+"/inbox/api/questions", alice); st != http.StatusUnauthorized {
		t.Errorf("alice, removed from the file: %d %s, want 401", st, body)
	}
	dana := s.apiLoginAt(r.web.URL, "dana", "dana's password")

	if err := os.WriteFile(s.cfg.UsersFile, []byte("- name: eve\n  bcrypt: not-a-hash\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := r.in.ReloadUsers()
	if err == nil {
		t.Fatal("an invalid users file was taken")
	}
	mustContain(t, "reload error", err.Error(), "entry 1 (eve)", "AGORA_INBOX_USERS")
	if st, body := apiGet(t, r.web.URL+"/inbox/api/questions", dana); st != http.StatusOK {
		t.Errorf("dana after a refused reload: %d %s, want 200", st, body)
	}
}
