// Package examples_test runs the example sub-agents through a real worker
// on a real JetStream server, both rounds: ask, then finish with the answer.
package examples_test

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/internal/runtimes"
	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/runtime"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/services/worker"
)

func TestExampleAgentsAskThenFinish(t *testing.T) {
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	goAgent := filepath.Join(bin, "go-agent")
	agora := filepath.Join(bin, "agora")
	for out, pkg := range map[string]string{goAgent: "./go-agent", agora: "../cmd/agora"} {
		if b, err := exec.Command("go", "build", "-o", out, pkg).CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", pkg, err, b)
		}
	}
	srv := natstest.StartProvisioned(t, provision.Config{})
	js := srv.JetStream(t)
	w, err := worker.New(worker.Config{WorkspaceRoot: t.TempDir(), Concurrency: 2, PullExpiry: 500 * time.Millisecond}, worker.Deps{Conn: srv.Conn(t)})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Go(t, "worker", w.Run)

	kv, err := js.KeyValue(t.Context(), lifecycle.BucketSubagents)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		define func(t *testing.T) string // stores the definition, returns its name
		answer string
		check  func(t *testing.T, out map[string]any)
	}{
		{"shell", func(t *testing.T) string {
			// Applied exactly as a user does, from another working
			// directory: the relative script path in the file resolves
			// against the file's folder.
			apply := exec.Command(agora, "subagent", "apply", "-f", filepath.Join(repo, "examples/shell/deployer.yaml"), "--nats", srv.URL)
			apply.Dir = t.TempDir()
			if out, err := apply.CombinedOutput(); err != nil {
				t.Fatalf("agora subagent apply: %v\n%s", err, out)
			}
			return "deployer"
		}, "staging", func(t *testing.T, out map[string]any) {
			if out["deployed_to"] != "staging" {
				t.Errorf("output = %v", out)
			}
		}},
		{"go", func(t *testing.T) string {
			def := subagent.Definition{Name: "ex-go", Runtime: subagent.RuntimeExec, Command: []string{goAgent}}
			b, _ := json.Marshal(def)
			if _, err := kv.Put(t.Context(), def.Name, b); err != nil {
				t.Fatal(err)
			}
			return def.Name
		}, "B", func(t *testing.T, out map[string]any) {
			if out["rewrote"] != "B" || out["resumed_from"] == nil {
				t.Errorf("output = %v, want rewrote B with the partial state", out)
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			def := subagent.Definition{Name: c.define(t)}
			// Round 0 asks.
			ni, ok := run(t, js, &lifecycle.Request{Subagent: def.Name, Input: json.RawMessage(`{"task":"demo"}`)}).(*lifecycle.NeedsInput)
			if !ok || len(ni.Options) != 2 || ni.PartialState == nil {
				t.Fatalf("round 0 = %+v, want needs_input with two options and partial state", ni)
			}
			// Round 1 carries the answer and the partial state, as the router sends it.
			in, _ := json.Marshal(map[string]any{"task": "demo", "answer": c.answer, "partial_state": ni.PartialState})
			fin, ok := run(t, js, &lifecycle.Request{Subagent: def.Name, Input: in, ThreadID: ni.ThreadID, ParentID: ni.DispatchID, Round: 1}).(*lifecycle.Finished)
			if !ok {
				t.Fatalf("round 1 did not finish")
			}
			var out map[string]any
			if err := json.Unmarshal(fin.Output, &out); err != nil {
				t.Fatalf("output %s: %v", fin.Output, err)
			}
			c.check(t, out)
		})
	}
}

// run queues req as the dispatcher would and returns its terminal data.
func run(t *testing.T, js jetstream.JetStream, req *lifecycle.Request) lifecycle.Data {
	t.Helper()
	req.DispatchID = lifecycle.NewID()
	if req.ThreadID == "" {
		req.ThreadID = req.DispatchID
	}
	e, err := lifecycle.New("/agora/test/examples", req)
	if err != nil {
		t.Fatal(err)
	}
	subj, _ := lifecycle.DispatchSubject(req.Subagent)
	m, err := lifecycle.Encode(subj, e)
	if err != nil {
		t.Fatal(err)
	}
	c, err := js.OrderedConsumer(t.Context(), lifecycle.StreamLifecycle, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{lifecycle.LifecycleFilter("", req.ThreadID, req.DispatchID)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.PublishMsg(t.Context(), m); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		msg, err := c.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			continue
		}
		ev, err := lifecycle.DecodeMsg(msg)
		if err != nil {
			t.Fatal(err)
		}
		d, err := lifecycle.Parse(ev)
		if err != nil {
			t.Fatal(err)
		}
		if l, ok := d.(lifecycle.Lifecycle); ok && l.LifecycleKind().Terminal() {
			if f, ok := d.(*lifecycle.Failed); ok {
				t.Fatalf("dispatch failed: %s: %s", f.Reason, f.Detail)
			}
			return d
		}
	}
	t.Fatalf("no terminal event for %s", req.DispatchID)
	return nil
}

// TestCLIExampleDefinitions: the CLI runtimes' example definitions parse,
// name their runtime, allow their API's host and key, and make a command.
func TestCLIExampleDefinitions(t *testing.T) {
	for file, want := range map[string]struct{ runtime, host, key string }{
		"codex/coder.yaml":      {subagent.RuntimeCodex, "api.openai.com:443", "CODEX_API_KEY"},
		"gemini-cli/coder.yaml": {subagent.RuntimeGeminiCLI, "generativelanguage.googleapis.com:443", "GEMINI_API_KEY"},
	} {
		def, _, err := subagent.ParseFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if def.Runtime != want.runtime || !slices.Contains(def.Sandbox.Network.Allow, want.host) || !slices.Contains(def.EnvAllow, want.key) {
			t.Errorf("%s: runtime %s, network %v, env_allow %v; want %s, %s, %s", file, def.Runtime, def.Sandbox.Network.Allow, def.EnvAllow, want.runtime, want.host, want.key)
		}
		if _, err := runtimes.Builtin(runtimes.Config{})[def.Runtime].Command(runtime.Invocation{Definition: def, Input: map[string]json.RawMessage{"repo": json.RawMessage(`"/srv/repos/a"`), "task": json.RawMessage(`"x"`)}}); err != nil {
			t.Errorf("%s: %v", file, err)
		}
	}
}
