package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestMain lets a test run this command as a real process: the test
// binary re-executed with AGORA_TEST_RUN_MAIN=1 runs main instead.
func TestMain(m *testing.M) {
	if os.Getenv("AGORA_TEST_RUN_MAIN") == "1" {
		main()
	}
	os.Exit(m.Run())
}

// Bad settings stop the dispatcher at start, before it connects to
// anything, with one message naming every bad variable and the accepted
// values.
func TestBadSettingsStopTheDispatcher(t *testing.T) {
	for _, c := range []struct {
		env  []string
		want []string
	}{
		{[]string{"AGORA_LOG_LEVEL=loud"}, []string{`AGORA_LOG_LEVEL="loud": want debug, info, warn or error`}},
		{[]string{"AGORA_LOG_FORMAT=xml"}, []string{`AGORA_LOG_FORMAT="xml": want text or json`}},
		{[]string{"AGORA_LOG_LEVEL=verbose", "AGORA_LOG_FORMAT=yaml", "AGORA_DISPATCHER_CONCURRENCY=lots"},
			[]string{"AGORA_LOG_LEVEL", "AGORA_LOG_FORMAT", "AGORA_DISPATCHER_CONCURRENCY"}},
	} {
		t.Run(strings.Join(c.env, " "), func(t *testing.T) {
			exe, err := os.Executable()
			if err != nil {
				t.Fatal(err)
			}
			cmd := exec.CommandContext(t.Context(), exe, "-test.run=^$")
			// Nothing may be listening here: the command must stop before
			// it tries.
			cmd.Env = append([]string{"AGORA_TEST_RUN_MAIN=1", "PATH=" + os.Getenv("PATH"), "AGORA_NATS_URL=nats://127.0.0.1:1"}, c.env...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err = cmd.Run()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 1 {
				t.Fatalf("exit: %v, want status 1; stderr: %s", err, stderr.String())
			}
			out := stderr.String()
			if !strings.HasPrefix(out, "dispatcher: ") || strings.Count(strings.TrimSpace(out), "\n") != len(c.want)-1 {
				t.Errorf("stderr: %q", out)
			}
			for _, w := range c.want {
				if !strings.Contains(out, w) {
					t.Errorf("stderr %q lacks %q", out, w)
				}
			}
		})
	}
}
