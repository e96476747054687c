package main_test

import (
	"fmt"
	"net/http"
	"regexp"
	"testing"
	"time"
)

// `agora inbox` serves the inbox against a running agora dev: the printed
// dev-token URL signs in and the pending page answers.
func TestInboxVerb(t *testing.T) {
	d := devServer(t)
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	b := start(t, "inbox", "--dev-token", "--http", addr, "--nats", d.natsURL)
	re := regexp.MustCompile(`sign in at (http://\S+)`)
	var login string
	deadline := time.Now().Add(30 * time.Second)
	for login == "" {
		if m := re.FindStringSubmatch(b.stderr.String()); m != nil {
			login = m[1]
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no sign-in line; stderr:\n%s", b.stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	resp, err := http.Get(login)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", login, resp.Status)
	}
	if r := agora(t, "inbox", "--nats", d.natsURL); r.code == 0 {
		t.Fatalf("inbox without a users file or --dev-token started: %s", r)
	}
}
