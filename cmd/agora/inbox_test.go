package main_test

import (
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"
)

// `agora inbox` serves the inbox against a running agora dev: the printed
// dev-token URL signs in and the pending page answers.
func TestInboxVerb(t *testing.T) {
	d := devServer(t)
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	b := start(t, "inbox", "--dev-token", "--http", addr, "--nats", d.natsURL)
	line := waitOutputLine(t, &b.stderr, 30*time.Second, "sign in at ")
	m := regexp.MustCompile(`sign in at (http://\S+)`).FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("sign-in line %q has no URL", line)
	}
	login := m[1]
	resp, err := http.Get(login)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", login, resp.Status)
	}
	// The printed token is the one the inbox accepts: the API answers with
	// it and refuses without it or with another. It rides in the link's
	// fragment, which no server sees.
	u, err := url.Parse(login)
	if err != nil {
		t.Fatal(err)
	}
	tok, ok := strings.CutPrefix(u.Fragment, "token=")
	if !ok || u.RawQuery != "" || u.Path != "/inbox/login" {
		t.Fatalf("sign-in link %s: want /inbox/login#token=<token>", login)
	}
	api := "http://" + addr + "/inbox/api/questions"
	for _, c := range []struct {
		token string
		want  int
	}{{tok, http.StatusOK}, {"", http.StatusUnauthorized}, {"not-the-token", http.StatusUnauthorized}} {
		req, _ := http.NewRequest(http.MethodGet, api, nil)
		if c.token != "" {
			req.Header.Set("Authorization", "Bearer "+c.token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("GET %s with token %q: %s, want %d", api, c.token, resp.Status, c.want)
		}
	}
	if r := agora(t, "inbox", "--nats", d.natsURL); r.code == 0 {
		t.Fatalf("inbox without a users file or --dev-token started: %s", r)
	}
}
