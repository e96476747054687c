package main_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// `make run` says it is building, and why the first build is slow, when
// there is no binary yet; once there is one it says nothing of it. GO=true
// stands in for the build, a script for the binary.
func TestMakeRunSaysItBuilds(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatalf("make is needed: %v", err)
	}
	bin := t.TempDir()
	run := func() string {
		t.Helper()
		cmd := exec.CommandContext(t.Context(), "make", "-s", "-C", "../..", "run", "GO=true", "BIN="+bin)
		out, _ := cmd.CombinedOutput() // without a binary, running it fails
		return string(out)
	}
	if out := run(); !strings.Contains(out, "make run: building agora") || !strings.Contains(out, "first build downloads and compiles every dependency") {
		t.Errorf("without a binary:\n%s", out)
	}
	if err := os.WriteFile(filepath.Join(bin, "agora"), []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if out := run(); strings.Contains(out, "building agora") {
		t.Errorf("with a binary:\n%s", out)
	}
}
