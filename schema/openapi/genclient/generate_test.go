package genclient_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
)

// The committed client is what oapi-codegen (the go.mod tool) generates
// from the repository file with config.yaml: generation must succeed, and
// its output must equal client.gen.go (run go generate ./schema/openapi/genclient
// after changing the document).
func TestGeneratedClientIsCurrent(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to run the tool: %v", err)
	}
	cfg, err := os.ReadFile("config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	out := filepath.Join(dir, "client.gen.go")
	output := regexp.MustCompile(`(?m)^output: .*$`)
	if !output.Match(cfg) {
		t.Fatal("config.yaml has no output line")
	}
	tmpCfg := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(tmpCfg, output.ReplaceAll(cfg, []byte("output: "+out)), 0o600); err != nil {
		t.Fatal(err)
	}
	doc, err := filepath.Abs(docPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), goBin, "tool", "oapi-codegen", "-config", tmpCfg, doc)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("oapi-codegen refuses %s: %v\n%s", docPath, err, b)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	committed, err := os.ReadFile("client.gen.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, committed) {
		t.Errorf("client.gen.go is not what oapi-codegen generates from %s now: run go generate ./schema/openapi/genclient", docPath)
	}
}
