package contain_test

import (
	"testing"

	"github.com/agora-dispatch/agora/internal/config"
	"github.com/agora-dispatch/agora/internal/sandbox/contain"
)

// The CLI runtimes' executables are read from the variables the check
// names: AGORA_WORKER_CLAUDE_BIN and its siblings, defaulting to the
// CLI's name on PATH.
func TestConfig(t *testing.T) {
	if got := config.Defaults(contain.Config{}); got != (contain.Config{ClaudeBin: "claude", CodexBin: "codex", GeminiBin: "gemini"}) {
		t.Errorf("defaults %+v", got)
	}
	vars := map[string]string{"ClaudeBin": "AGORA_WORKER_CLAUDE_BIN", "CodexBin": "AGORA_WORKER_CODEX_BIN", "GeminiBin": "AGORA_WORKER_GEMINI_BIN"}
	for field, name := range vars {
		if got := config.Var(contain.Config{}, field); got != name {
			t.Errorf("Var(%s) = %q, want %q", field, got, name)
		}
		t.Setenv(name, "/opt/"+field)
	}
	var c contain.Config
	if err := config.Load(&c); err != nil {
		t.Fatal(err)
	}
	rc := c.Runtimes()
	if rc.ClaudeBin != "/opt/ClaudeBin" || rc.CodexBin != "/opt/CodexBin" || rc.GeminiBin != "/opt/GeminiBin" {
		t.Errorf("Runtimes() = %+v", rc)
	}
}
