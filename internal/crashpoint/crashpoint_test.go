package crashpoint_test

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/agora-dispatch/agora/internal/crashpoint"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want map[string]float64
		err  string
	}{
		{in: "", want: map[string]float64{}},
		{in: "worker.pickup:0.05, dispatcher.accepted:1", want: map[string]float64{"worker.pickup": 0.05, "dispatcher.accepted": 1}},
		{in: "worker.pickup", err: "want name:probability"},
		{in: "worker.pikcup:0.1", err: `unknown point "worker.pikcup"`},
		{in: "worker.pickup:0", err: "want a number in (0, 1]"},
		{in: "worker.pickup:1.5", err: "want a number in (0, 1]"},
		{in: "worker.pickup:often", err: "want a number in (0, 1]"},
	} {
		got, err := crashpoint.Parse(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), crashpoint.Env) {
				t.Errorf("Parse(%q) = %v, %v; want an error naming %s and %q", tc.in, got, err, crashpoint.Env, tc.err)
			}
			continue
		}
		if err != nil || len(got) != len(tc.want) {
			t.Errorf("Parse(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
			continue
		}
		for k, v := range tc.want {
			if got[k] != v {
				t.Errorf("Parse(%q)[%s] = %v, want %v", tc.in, k, got[k], v)
			}
		}
	}
}

// TestMain doubles as a process that passes a point, for the test below.
func TestMain(m *testing.M) {
	if name := os.Getenv("CRASHPOINT_TEST_PASS"); name != "" {
		crashpoint.Here(name)
		os.Stdout.WriteString("passed\n")
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// A process armed at a point it passes dies there by SIGKILL, saying so;
// one armed at another point, or not armed, goes on.
func TestHere(t *testing.T) {
	for _, tc := range []struct {
		name, env string
		killed    bool
	}{
		{name: "armed at the point", env: "worker.pickup:1", killed: true},
		{name: "armed elsewhere", env: "dispatcher.accepted:1"},
		{name: "not armed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), "CRASHPOINT_TEST_PASS="+crashpoint.WorkerPickup, crashpoint.Env+"="+tc.env)
			var stdout, stderr strings.Builder
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			var ee *exec.ExitError
			killed := errors.As(err, &ee) && ee.Sys().(syscall.WaitStatus).Signal() == syscall.SIGKILL
			if killed != tc.killed {
				t.Fatalf("killed %v (%v), want %v; stdout %q stderr %q", killed, err, tc.killed, stdout.String(), stderr.String())
			}
			if tc.killed {
				if !strings.Contains(stderr.String(), "agora crash point: worker.pickup") || stdout.String() != "" {
					t.Errorf("stdout %q stderr %q, want the point named on stderr and nothing after it", stdout.String(), stderr.String())
				}
			} else if err != nil || stdout.String() != "passed\n" {
				t.Errorf("err %v stdout %q, want the process to pass the point", err, stdout.String())
			}
		})
	}
}
