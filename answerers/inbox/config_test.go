package inbox_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/agora-dispatch/agora/answerers/inbox"
	"github.com/agora-dispatch/agora/internal/config"
)

// TestConfig: settings come from AGORA_* variables and every bad one is
// named, all at once.
func TestConfig(t *testing.T) {
	users := filepath.Join(t.TempDir(), "users.yaml")
	if err := os.WriteFile(users, []byte("- {name: a, bcrypt: x}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		env  map[string]string
		want []string // substrings of the error; none: valid
	}{
		{"dev token", map[string]string{"AGORA_INBOX_DEV_TOKEN": "true"}, nil},
		{"users file and routes", map[string]string{"AGORA_INBOX_USERS": users, "AGORA_INBOX_ROUTES": "human, approvals", "AGORA_INBOX_HTTP_ADDR": ":8081"}, nil},
		{"neither", nil, []string{"AGORA_INBOX_USERS or AGORA_INBOX_DEV_TOKEN=true"}},
		{"both", map[string]string{"AGORA_INBOX_USERS": users, "AGORA_INBOX_DEV_TOKEN": "true"}, []string{"set only one"}},
		{"not a bool", map[string]string{"AGORA_INBOX_DEV_TOKEN": "maybe"}, []string{`AGORA_INBOX_DEV_TOKEN="maybe"`}},
		{"missing users file", map[string]string{"AGORA_INBOX_USERS": "/nonexistent/users.yaml"}, []string{`AGORA_INBOX_USERS="/nonexistent/users.yaml"`}},
		{"every problem at once", map[string]string{
			"AGORA_INBOX_DEV_TOKEN":   "true",
			"AGORA_INBOX_ROUTES":      "human,no.dots",
			"AGORA_INBOX_HTTP_ADDR":   "8081",
			"AGORA_INBOX_SESSION_TTL": "10s",
			"AGORA_INBOX_TLS_CERT":    "/nonexistent/cert.pem",
		}, []string{
			`AGORA_INBOX_ROUTES: route "no.dots"`, `AGORA_INBOX_HTTP_ADDR="8081"`, "AGORA_INBOX_SESSION_TTL=10s",
			"AGORA_INBOX_TLS_CERT and AGORA_INBOX_TLS_KEY: set both or neither", `AGORA_INBOX_TLS_CERT="/nonexistent/cert.pem"`,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, k := range []string{"AGORA_INBOX_DEV_TOKEN", "AGORA_INBOX_USERS", "AGORA_INBOX_ROUTES", "AGORA_INBOX_HTTP_ADDR", "AGORA_INBOX_SESSION_TTL", "AGORA_INBOX_TLS_CERT", "AGORA_INBOX_TLS_KEY", "AGORA_NATS_URL"} {
				t.Setenv(k, tt.env[k]) // restored after the test
				if _, ok := tt.env[k]; !ok {
					_ = os.Unsetenv(k)
				}
			}
			var cfg inbox.Config
			err := config.Load(&cfg)
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Load: %v", err)
				}
				if cfg.NATSURL != "nats://127.0.0.1:4222" || cfg.SessionTTL != 12*time.Hour {
					t.Errorf("defaults: %+v", cfg)
				}
				return
			}
			if err == nil {
				t.Fatalf("Load accepted %v", tt.env)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
	// New refuses what Validate refuses, and a users file with bad entries.
	if _, err := inbox.New(inbox.Config{}, inbox.Deps{}); err == nil || !strings.Contains(err.Error(), "AGORA_INBOX_USERS") {
		t.Errorf("New without a sign-in method: %v", err)
	}
	if _, err := inbox.New(inbox.Config{UsersFile: users}, inbox.Deps{}); err == nil || !strings.Contains(err.Error(), "AGORA_INBOX_USERS") || !strings.Contains(err.Error(), "not a bcrypt hash") {
		t.Errorf("New with a bad users file: %v", err)
	}
}

// TestParseUsers: YAML and JSON users files, and every problem named with
// its entry.
func TestParseUsers(t *testing.T) {
	h, err := bcrypt.GenerateFromPassword([]byte("pw"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	hash := string(h)
	good := []struct{ name, file string }{
		{"yaml", "- name: alice@example.com\n  bcrypt: '" + hash + "'\n  routes: [approvals, human]\n- name: bob\n  bcrypt: '" + hash + "'\n"},
		{"json", `[{"name": "alice@example.com", "bcrypt": "` + hash + `", "routes": ["approvals", "human"]}, {"name": "bob", "bcrypt": "` + hash + `"}]`},
	}
	for _, tt := range good {
		users, err := inbox.ParseUsers([]byte(tt.file))
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if len(users) != 2 || users[0].Name != "alice@example.com" || len(users[0].Routes) != 2 || users[1].Routes != nil {
			t.Errorf("%s: %+v", tt.name, users)
		}
	}
	bad := []struct{ name, file, want string }{
		{"empty", "", "empty"},
		{"not a list", "name: alice", "want a list"},
		{"misspelt field", "- {name: a, hash: '" + hash + "'}", "field hash not found"},
		{"no hash", "- {name: a}", "entry 1 (a): bcrypt is empty"},
		{"bad hash", "- {name: a, bcrypt: secret}", "entry 1 (a): bcrypt is not a bcrypt hash"},
		{"no name", "- {bcrypt: '" + hash + "'}", "entry 1: name is empty"},
		{"duplicate", "- {name: a, bcrypt: '" + hash + "'}\n- {name: a, bcrypt: '" + hash + "'}", "entry 2 (a): the name is also entry 1"},
		{"bad route", "- {name: a, bcrypt: '" + hash + "', routes: ['a b']}", `route "a b"`},
	}
	for _, tt := range bad {
		if _, err := inbox.ParseUsers([]byte(tt.file)); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want %q", tt.name, err, tt.want)
		}
	}
	if h, err := inbox.HashPassword("pw"); err != nil || bcrypt.CompareHashAndPassword([]byte(h), []byte("pw")) != nil {
		t.Errorf("HashPassword: %v", err)
	}
}
