package slack_test

import (
	"os"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/agora-dispatch/agora/answerers/slack"
	"github.com/agora-dispatch/agora/internal/config"
)

func TestParseSettings(t *testing.T) {
	tests := []struct {
		name, yaml string
		want       []string // in the error; none: valid
	}{
		{"channel", "routes:\n  ops: {channel: C0OPS, allow: [U0ALICE]}\n", nil},
		{"direct with a channel", "routes:\n  ops:\n    direct: {label: assignee, users: {alice: U0ALICE}}\n    channel: '#agora'\n", nil},
		{"empty", "", []string{"no routes"}},
		{"unknown field", "routes:\n  ops: {chanel: C0OPS}\n", []string{"chanel"}},
		{"every problem at once", `routes:
  "bad.route": {channel: C0OPS}
  nowhere: {}
  dm:
    direct: {users: {alice: alice}}
  strangers: {channel: "general", allow: [bob]}
`, []string{"route bad.route", "route nowhere: set channel, direct", "direct: label is required", `"alice" is not a Slack user id`, `channel "general"`, `allow: "bob"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := slack.ParseSettings([]byte(tt.yaml))
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				if len(s.RouteNames()) == 0 {
					t.Error("no routes")
				}
				return
			}
			if err == nil {
				t.Fatalf("accepted: %+v", s)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

// TestConfigNamesEveryVariable: Load reports every bad setting at once,
// by its AGORA_SLACK_* name.
func TestConfigNamesEveryVariable(t *testing.T) {
	t.Setenv("AGORA_SLACK_INBOX_URL", "ftp://x")
	t.Setenv("AGORA_SLACK_HTTP_ADDR", "8082")
	t.Setenv("AGORA_SLACK_POST_ATTEMPTS", "-1")
	t.Setenv("AGORA_SLACK_BOT_TOKEN", "")
	t.Setenv("AGORA_SLACK_SIGNING_SECRET", "")
	var cfg slack.Config
	err := config.Load(&cfg)
	if err == nil {
		t.Fatal("accepted")
	}
	for _, v := range []string{"AGORA_SLACK_BOT_TOKEN", "AGORA_SLACK_SIGNING_SECRET", "AGORA_SLACK_SETTINGS", "AGORA_SLACK_INBOX_URL", "AGORA_SLACK_HTTP_ADDR", "AGORA_SLACK_POST_ATTEMPTS"} {
		if !strings.Contains(err.Error(), v) {
			t.Errorf("error lacks %s: %v", v, err)
		}
	}

	// Secrets set alongside a bad setting never show in the error.
	t.Setenv("AGORA_SLACK_BOT_TOKEN", "xoxb-1-very-secret")
	t.Setenv("AGORA_SLACK_SIGNING_SECRET", "signing-very-secret")
	cfg = slack.Config{}
	if err := config.Load(&cfg); err == nil || strings.Contains(err.Error(), "very-secret") {
		t.Errorf("error = %v", err)
	}
}

// TestShippedFiles: the example settings file is valid, and the app
// manifest asks for interactivity and the chat:write scope.
func TestShippedFiles(t *testing.T) {
	s, err := slack.LoadSettings("settings.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(s.RouteNames(), ","); got != "approvals,reviews" {
		t.Errorf("routes = %s", got)
	}
	b, err := os.ReadFile("manifest.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		OAuth struct {
			Scopes struct{ Bot []string } `yaml:"scopes"`
		} `yaml:"oauth_config"`
		Settings struct {
			Interactivity struct {
				Enabled    bool   `yaml:"is_enabled"`
				RequestURL string `yaml:"request_url"`
			} `yaml:"interactivity"`
		} `yaml:"settings"`
	}
	if err := yaml.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(m.OAuth.Scopes.Bot, "chat:write") || !m.Settings.Interactivity.Enabled ||
		!strings.HasSuffix(m.Settings.Interactivity.RequestURL, slack.InteractionsPath) {
		t.Errorf("manifest = %+v", m)
	}
}
