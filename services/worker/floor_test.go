package worker_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/services/worker"
)

// A worker runs nothing below its operator's floor, whatever reached its
// work queue: a definition stored after the dispatcher accepted the
// request (here: a work message queued directly, as a dispatcher with a
// lower floor would) ends failed rejected, naming the setting, and its
// command never starts.
func TestWorkerRefusesBelowTheFloor(t *testing.T) {
	cases := []struct {
		name  string
		floor func(*worker.Config)
		box   subagent.Sandbox
		want  []string // fragments of the rejection; none: it runs
	}{
		{name: "mode off under the default floor", box: subagent.Sandbox{Mode: subagent.SandboxOff},
			want: []string{`is below the operator's sandbox floor`, `sandbox.mode "off" is below the operator's floor "standard" (AGORA_SANDBOX_FLOOR)`}},
		{name: "standard under a strict floor", floor: func(c *worker.Config) { c.SandboxFloor = subagent.SandboxStrict },
			want: []string{`sandbox.mode "standard" is below the operator's floor "strict" (AGORA_SANDBOX_FLOOR)`}},
		{name: "a write path outside the allowed ones", floor: func(c *worker.Config) { c.SandboxAllowPaths = []string{"/srv"} },
			box: subagent.Sandbox{WritePaths: []string{os.TempDir()}}, want: []string{`sandbox.write_paths "` + os.TempDir() + `"`, "(AGORA_SANDBOX_ALLOW_PATHS=/srv)"}},
		{name: "a destination when none may be added", floor: func(c *worker.Config) { c.SandboxAllowHosts = []string{"none"} },
			box: subagent.Sandbox{Network: subagent.Network{Allow: []string{"api.example.com:443"}}}, want: []string{`sandbox.network.allow "api.example.com:443"`, "(AGORA_SANDBOX_ALLOW_HOSTS=none)"}},
		{name: "mode off where the floor is off", floor: func(c *worker.Config) { c.SandboxFloor = subagent.SandboxOff }, box: subagent.Sandbox{Mode: subagent.SandboxOff}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, provision.Config{})
			cfg := h.workerConfig()
			if c.floor != nil {
				c.floor(&cfg)
			}
			h.startWorker(cfg, worker.Deps{})
			mark := filepath.Join(t.TempDir(), "ran")
			rev := h.define(subagent.Definition{Name: "boxed", Runtime: subagent.RuntimeExec, Command: []string{"/bin/sh", "-c", "echo > " + mark}, Sandbox: c.box})
			id := h.dispatch(lifecycle.Request{Subagent: "boxed", SubagentRevision: rev})
			r := h.terminal(id)
			h.assertOneTerminal(id)
			_, statErr := os.Stat(mark)
			if len(c.want) == 0 {
				if _, ok := r.Data.(*lifecycle.Finished); !ok || statErr != nil {
					t.Fatalf("terminal %T %+v (mark: %v), want finished after running", r.Data, r.Data, statErr)
				}
				return
			}
			f, ok := r.Data.(*lifecycle.Failed)
			if !ok || f.Reason != lifecycle.ReasonRejected {
				t.Fatalf("terminal %T %+v, want failed rejected", r.Data, r.Data)
			}
			for _, w := range c.want {
				if !strings.Contains(f.Detail, w) {
					t.Errorf("detail %q does not say %q", f.Detail, w)
				}
				if !strings.Contains(strings.Join(f.BelowFloor, "\n"), w) && !strings.Contains(w, "is below the operator's sandbox floor") {
					t.Errorf("below_floor %q does not name %q", f.BelowFloor, w)
				}
			}
			if statErr == nil {
				t.Error("the command ran")
			}
			if ks := kinds(h.events(id)); len(ks) != 1 {
				t.Errorf("events %v, want only the rejection", ks)
			}
			h.waitWorkEmpty()
		})
	}
}

// The worker never runs longer than the definition's timeout, whatever the
// work message asks for, and the CPU time limit it defaults to follows.
func TestWorkerTimeoutOnlyShortens(t *testing.T) {
	h := newHarness(t, provision.Config{})
	h.startWorker(h.workerConfig(), worker.Deps{})
	rev := h.shell("sleeper", `exec sleep 20`, func(d *subagent.Definition) { d.Timeout = "1s" })
	id := h.dispatch(lifecycle.Request{Subagent: "sleeper", SubagentRevision: rev, Timeout: "1000h"})
	r := h.terminal(id)
	if f, ok := r.Data.(*lifecycle.Failed); !ok || f.Reason != lifecycle.ReasonTimeout {
		t.Fatalf("terminal %T %+v, want failed timeout after the definition's 1s", r.Data, r.Data)
	}
	var st *lifecycle.Started
	for _, e := range h.events(id) {
		if s, ok := e.Data.(*lifecycle.Started); ok {
			st = s
		}
	}
	if st == nil || st.Sandbox == nil || st.Sandbox.Limits["cpu_time"] != 1 {
		t.Errorf("started.sandbox = %+v, want cpu_time 1 s (the definition's timeout)", st)
	}

	// A shorter request holds.
	rev = h.shell("sleeper", `exec sleep 20`, func(d *subagent.Definition) { d.Timeout = "1h" })
	start := time.Now()
	id = h.dispatch(lifecycle.Request{Subagent: "sleeper", SubagentRevision: rev, Timeout: "1s"})
	if f, ok := h.terminal(id).Data.(*lifecycle.Failed); !ok || f.Reason != lifecycle.ReasonTimeout || time.Since(start) > 15*time.Second {
		t.Errorf("terminal %+v after %s, want failed timeout after the request's 1s", f, time.Since(start))
	}
}
