package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
)

// Who the CLI and `agora mcp` answer as comes from the NATS credentials,
// never from $USER.
func TestCredentialName(t *testing.T) {
	t.Setenv("USER", "mallory")
	acc, _ := nkeys.CreateAccount()
	usr, _ := nkeys.CreateUser()
	pub, _ := usr.PublicKey()
	uc := jwt.NewUserClaims(pub)
	uc.Name = "alice"
	tok, err := uc.Encode(acc)
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := usr.Seed()
	creds, err := jwt.FormatUserConfig(tok, seed)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	good, bad := filepath.Join(dir, "alice.creds"), filepath.Join(dir, "bad.creds")
	if err := os.WriteFile(good, creds, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte("not creds"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ url, creds, want string }{
		{"nats://127.0.0.1:4222", good, "alice"},
		{"nats://bob:secret@127.0.0.1:4222", "", "bob"},
		{"nats://s3cr3t-token@127.0.0.1:4222", "", "token"},
		{"nats://127.0.0.1:4222", "", "local"},
		{"nats://a:4222, nats://carol:pw@b:4222", "", "carol"},
	} {
		got, err := credentialName(tc.url, tc.creds)
		if err != nil || got != tc.want {
			t.Errorf("credentialName(%q, %q) = %q %v, want %q", tc.url, tc.creds, got, err, tc.want)
		}
	}
	for _, f := range []string{bad, filepath.Join(dir, "missing.creds")} {
		if _, err := credentialName("", f); err == nil || !strings.Contains(err.Error(), "--creds") {
			t.Errorf("credentials %s: %v, want an error naming --creds", f, err)
		}
	}
	for _, tc := range []struct{ as, want string }{
		{"", "cli:alice"},
		{"dana", "dana (via cli:alice)"},
		{"cli:alice", "cli:alice"},
		{"x\x1b[31my", "x[31my (via cli:alice)"},
	} {
		if got := attributed("cli", "alice", tc.as); got != tc.want {
			t.Errorf("attributed(%q) = %q, want %q", tc.as, got, tc.want)
		}
	}
}
