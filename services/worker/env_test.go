package worker_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/services/worker"
)

// TestEnvironmentFirewall runs a real sub-agent that dumps its environment
// and checks the default-deny rule of docs/worker.md, "The runtime contract,
// step by step" end to end: the base names, the allowed name, the request's
// env and the documented AGORA_* run variables pass; the worker's own
// settings, NATS credentials, tokens and secrets, and reserved names smuggled
// in through the request, do not.
func TestEnvironmentFirewall(t *testing.T) {
	home := t.TempDir()
	secrets := map[string]string{
		"AGORA_NATS_URL":        "nats://firewall-secret-host:4222",
		"AGORA_NATS_CREDS":      "/secret/firewall/agora.creds",
		"NATS_TOKEN":            "nats-token-firewall-0f1e2d",
		"AGORA_API_TOKENS":      "api-token-firewall-9a8b7c",
		"MY_SECRET_TOKEN":       "my-secret-token-firewall-5d6e",
		"AWS_SECRET_ACCESS_KEY": "aws-secret-firewall-wJalrXUtnFEMI",
	}
	for k, v := range secrets {
		t.Setenv(k, v)
	}
	t.Setenv("HOME", home)
	t.Setenv("LC_ALL", "C")
	t.Setenv("TZ", "Europe/Paris")
	t.Setenv("ALLOWED_KEY", "allowed-value-4f9a2c")

	h := newHarness(t, provision.Config{})
	h.startWorker(h.workerConfig(), worker.Deps{})
	h.shell("env-dump", `env > "$ENV_OUT/env.txt"`, func(d *subagent.Definition) {
		d.EnvAllow = []string{"ALLOWED_KEY"}
	})

	out := t.TempDir()
	id := lifecycle.NewID()
	h.dispatch(lifecycle.Request{
		DispatchID: id, Subagent: "env-dump", Input: json.RawMessage(`{}`),
		ThreadID: "thread-env-1", ParentID: "parent-env-1", Round: 3,
		Env: map[string]string{"FOO": "bar", "ENV_OUT": out, "AGORA_EVIL": "1", "NATS_URL": "x"},
	})
	r := h.terminal(id)
	if k := r.Data.(lifecycle.Lifecycle).LifecycleKind(); k != lifecycle.KindFinished {
		t.Fatalf("terminal = %s (%+v), want finished", k, r.Data)
	}

	raw, err := os.ReadFile(filepath.Join(out, "env.txt"))
	if err != nil {
		t.Fatal(err)
	}
	env := parseEnvDump(string(raw))
	ws := env["AGORA_WORKSPACE"]
	h.assertWorkspace(ws, id, 1)
	want := map[string]string{
		"PATH": os.Getenv("PATH"),
		// A sandboxed run gets a private home and tmp in its workspace.
		"HOME":                   filepath.Join(ws, ".agora", "home"),
		"TMPDIR":                 filepath.Join(ws, ".agora", "tmp"),
		"LC_ALL":                 "C",
		"TZ":                     "Europe/Paris",
		"ALLOWED_KEY":            "allowed-value-4f9a2c",
		"FOO":                    "bar",
		"ENV_OUT":                out,
		"AGORA_WORKSPACE":        ws,
		"AGORA_INPUT_FILE":       filepath.Join(ws, ".agora", "input.json"),
		"AGORA_OUTPUT_FILE":      filepath.Join(ws, ".agora", "output.json"),
		"AGORA_NEEDS_INPUT_FILE": filepath.Join(ws, ".agora", "needs_input.json"),
		"AGORA_ARTIFACTS_DIR":    filepath.Join(ws, ".agora", "artifacts"),
		"AGORA_PROGRESS_FILE":    filepath.Join(ws, ".agora", "progress.jsonl"),
		"AGORA_DISPATCH_ID":      id,
		"AGORA_THREAD_ID":        "thread-env-1",
		"AGORA_ROUND":            "3",
		"AGORA_ATTEMPT":          "1",
	}
	for k, v := range want {
		got, ok := env[k]
		if !ok {
			t.Errorf("sub-agent does not see %s", k)
		} else if got != v {
			t.Errorf("sub-agent sees %s=%q, want %q", k, got, v)
		}
	}
	for _, k := range []string{"AGORA_NATS_URL", "AGORA_NATS_CREDS", "NATS_TOKEN", "AGORA_API_TOKENS",
		"MY_SECRET_TOKEN", "AWS_SECRET_ACCESS_KEY", "AGORA_EVIL", "NATS_URL"} {
		if v, ok := env[k]; ok {
			t.Errorf("sub-agent sees %s=%q; it must not", k, v)
		}
	}
	for k, v := range secrets {
		if strings.Contains(string(raw), v) {
			t.Errorf("the value of %s leaked into the sub-agent's environment", k)
		}
	}
	// The only AGORA_* names are the eight documented run variables, and
	// no NATS_* name passes at all.
	var agora []string
	for k := range env {
		if strings.HasPrefix(strings.ToUpper(k), "AGORA_") {
			agora = append(agora, k)
		}
		if strings.HasPrefix(strings.ToUpper(k), "NATS_") {
			t.Errorf("sub-agent sees %s", k)
		}
	}
	slices.Sort(agora)
	wantAgora := []string{"AGORA_ARTIFACTS_DIR", "AGORA_ATTEMPT", "AGORA_DISPATCH_ID", "AGORA_INPUT_FILE", "AGORA_NEEDS_INPUT_FILE", "AGORA_OUTPUT_FILE", "AGORA_PROGRESS_FILE", "AGORA_ROUND", "AGORA_THREAD_ID", "AGORA_WORKSPACE"}
	if !slices.Equal(agora, wantAgora) {
		t.Errorf("AGORA_* names seen = %v, want %v", agora, wantAgora)
	}
}

// TestFailureDetailRedactsAllowedSecret: a sub-agent that prints the value
// of an allowed variable (typically an API key) to stderr and fails must
// not get that value into the failed event's detail.
func TestFailureDetailRedactsAllowedSecret(t *testing.T) {
	const secret = "sk-allowed-secret-7c1d9e"
	h := secretWorker(t, secret)
	h.shell("leaky", `echo "calling the API with key $ALLOWED_KEY failed" >&2; exit 2`, func(d *subagent.Definition) {
		d.EnvAllow = []string{"ALLOWED_KEY"}
	})
	id := h.dispatch(lifecycle.Request{Subagent: "leaky", Input: json.RawMessage(`{}`)})
	f := failedWith(t, h.terminal(id), lifecycle.ReasonProviderFailed, "calling the API with key [redacted] failed")
	if strings.Contains(f.Detail, secret) {
		t.Fatalf("failed.detail shows the allowed secret: %q", f.Detail)
	}
}

// A finished dispatch keeps the tail of its stderr too, with the values of
// allowed secrets redacted.
func TestFinishedKeepsRedactedStderrTail(t *testing.T) {
	const secret = "sk-allowed-secret-4e8a21"
	h := secretWorker(t, secret)
	h.shell("chatty", `head -c 6000 /dev/zero | tr '\0' x >&2; echo >&2; echo "warning: used key $ALLOWED_KEY" >&2; echo out`, func(d *subagent.Definition) {
		d.EnvAllow = []string{"ALLOWED_KEY"}
	})
	h.shell("quiet", `echo out`)
	end := h.terminal(h.dispatch(lifecycle.Request{Subagent: "chatty"}))
	f, ok := end.Data.(*lifecycle.Finished)
	if !ok {
		t.Fatalf("chatty did not finish: %+v", end.Data)
	}
	if strings.Contains(f.StderrTail, secret) || !strings.HasSuffix(f.StderrTail, "warning: used key [redacted]\n") || len(f.StderrTail) > 4096 {
		t.Errorf("stderr_tail = …%q (%d bytes)", f.StderrTail[max(0, len(f.StderrTail)-60):], len(f.StderrTail))
	}
	q, ok := h.terminal(h.dispatch(lifecycle.Request{Subagent: "quiet"})).Data.(*lifecycle.Finished)
	if !ok || q.StderrTail != "" || q.StdoutTail != "out\n" {
		t.Errorf("a quiet run: %+v", q)
	}
}

// Both tails are redacted the same way: a secret on stdout, and the end of
// a secret that the 4 KiB capture cut at the start of a tail.
func TestFinishedTailsRedactCutSecrets(t *testing.T) {
	const secret = "sk-allowed-secret-4e8a21"
	h := secretWorker(t, secret)
	// Each stream ends with the secret's last 10 bytes followed by 4086
	// others: exactly what the last 4 KiB hold.
	h.shell("leaky", `for fd in 1 2; do { head -c 6000 /dev/zero | tr '\0' x; printf '%s' "$ALLOWED_KEY"; head -c 4086 /dev/zero | tr '\0' y; } >&$fd; done`, func(d *subagent.Definition) {
		d.EnvAllow = []string{"ALLOWED_KEY"}
	})
	h.shell("echoes", `echo "key: $ALLOWED_KEY"`, func(d *subagent.Definition) { d.EnvAllow = []string{"ALLOWED_KEY"} })
	f, ok := h.terminal(h.dispatch(lifecycle.Request{Subagent: "leaky"})).Data.(*lifecycle.Finished)
	if !ok {
		t.Fatal("leaky did not finish")
	}
	for name, tail := range map[string]string{"stdout_tail": f.StdoutTail, "stderr_tail": f.StderrTail} {
		if strings.Contains(tail, "4e8a21") || !strings.HasPrefix(tail, "[redacted]yyy") || len(tail) > 4096 {
			t.Errorf("%s = %q… (%d bytes)", name, tail[:min(len(tail), 40)], len(tail))
		}
	}
	e, ok := h.terminal(h.dispatch(lifecycle.Request{Subagent: "echoes"})).Data.(*lifecycle.Finished)
	if !ok || e.StdoutTail != "key: [redacted]\n" {
		t.Errorf("stdout_tail of a run that printed the secret: %+v", e)
	}
}

// TestEnvironment checks worker.Environment directly.
func TestEnvironment(t *testing.T) {
	parent := []string{
		"PATH=/usr/bin:/bin", "HOME=/home/agent", "LANG=en_US.UTF-8", "LC_ALL=C", "LC_TIME=de_DE",
		"TZ=UTC", "TMPDIR=/var/tmp", "USER=agent", "SHELL=/bin/bash",
		"AGORA_NATS_URL=nats://secret:4222", "AGORA_NATS_CREDS=/c.creds", "NATS_TOKEN=tok", "AGORA_X=1", "NATS_X=1",
		"MY_SECRET_TOKEN=s3cr3t", "ALLOWED=yes", "NOEQUALS",
	}
	const ws = "/ws/root/D1"
	run := func(extra ...string) []string {
		out := []string{
			"AGORA_ARTIFACTS_DIR=" + ws + "/.agora/artifacts",
			"AGORA_DISPATCH_ID=D1", "AGORA_INPUT_FILE=" + ws + "/.agora/input.json",
			"AGORA_NEEDS_INPUT_FILE=" + ws + "/.agora/needs_input.json", "AGORA_OUTPUT_FILE=" + ws + "/.agora/output.json",
			"AGORA_PROGRESS_FILE=" + ws + "/.agora/progress.jsonl",
			"AGORA_ROUND=2", "AGORA_THREAD_ID=T1", "AGORA_WORKSPACE=" + ws,
		}
		out = append(out, extra...)
		slices.Sort(out)
		return out
	}
	base := []string{"PATH=/usr/bin:/bin", "HOME=/home/agent", "LANG=en_US.UTF-8", "LC_ALL=C", "LC_TIME=de_DE", "TZ=UTC", "TMPDIR=/var/tmp"}
	cases := []struct {
		name   string
		parent []string
		allow  []string
		req    map[string]string
		want   []string
	}{
		{name: "base names only", parent: parent, want: run(base...)},
		{name: "allowed names pass, reserved ones never", parent: parent,
			allow: []string{"ALLOWED", "AGORA_X", "NATS_X", "AGORA_NATS_URL", "NATS_TOKEN", "ABSENT"},
			want:  run(append(slices.Clone(base), "ALLOWED=yes")...)},
		{name: "request env adds and overrides, reserved and invalid names dropped", parent: parent,
			req: map[string]string{
				"FOO": "bar", "TZ": "Asia/Tokyo", "AGORA_WORKSPACE": "/evil", "AGORA_ROUND": "99", "AGORA_EVIL": "1",
				"agora_lower": "1", "NATS_URL": "x", "nats_url": "x", "BAD-NAME": "1", "1X": "1", "": "empty",
			},
			want: run("PATH=/usr/bin:/bin", "HOME=/home/agent", "LANG=en_US.UTF-8", "LC_ALL=C", "LC_TIME=de_DE",
				"TZ=Asia/Tokyo", "TMPDIR=/var/tmp", "FOO=bar")},
		{name: "no PATH gets a default", parent: []string{"HOME=/h"},
			want: run("HOME=/h", "PATH=/usr/local/bin:/usr/bin:/bin")},
		{name: "empty parent", want: run("PATH=/usr/local/bin:/usr/bin:/bin")},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			def := subagent.Definition{Name: "a", Runtime: subagent.RuntimeExec, Command: []string{"true"}, EnvAllow: c.allow}
			got := worker.Environment(c.parent, def, c.req, ws, "D1", "T1", 2)
			if !slices.Equal(got, c.want) {
				t.Errorf("Environment =\n  %q\nwant\n  %q", got, c.want)
			}
		})
	}
}

// parseEnvDump parses the output of env(1), one NAME=value a line.
func parseEnvDump(s string) map[string]string {
	env := map[string]string{}
	for line := range strings.Lines(s) {
		k, v, ok := strings.Cut(strings.TrimSuffix(line, "\n"), "=")
		if ok && subagent.ValidEnvName(k) {
			env[k] = v
		}
	}
	return env
}

// failedEvent returns r's data as a failed event, or fails the test.
func failedEvent(t *testing.T, r recorded) *lifecycle.Failed {
	t.Helper()
	return eventAs[*lifecycle.Failed](t, r)
}

// secretWorker starts a worker whose environment has ALLOWED_KEY set to
// secret, a value the test's sub-agents may be allowed.
func secretWorker(t *testing.T, secret string) *harness {
	t.Helper()
	t.Setenv("ALLOWED_KEY", secret)
	h := newHarness(t, provision.Config{})
	h.startWorker(h.workerConfig(), worker.Deps{})
	return h
}

// failedWith checks that r is a failed event of reason whose detail
// contains detail, and returns it.
func failedWith(t *testing.T, r recorded, reason lifecycle.Reason, detail string) *lifecycle.Failed {
	t.Helper()
	f := failedEvent(t, r)
	if f.Reason != reason || !strings.Contains(f.Detail, detail) {
		t.Errorf("failed = %s %q, want %s naming %q", f.Reason, f.Detail, reason, detail)
	}
	return f
}

// eventAs returns the data of r, failing the test when it is not a T.
func eventAs[T lifecycle.Data](t *testing.T, r recorded) T {
	t.Helper()
	d, ok := r.Data.(T)
	if !ok {
		t.Fatalf("terminal event is %T %+v, want %T", r.Data, r.Data, d)
	}
	return d
}

// TestFailureDetailRedactsOverlappingSecrets: when one secret value is a
// prefix of another, the longer one is still redacted whole, not left
// with its tail showing after the shorter one was replaced.
func TestFailureDetailRedactsOverlappingSecrets(t *testing.T) {
	// The short value is set first, so it comes first in the environment.
	t.Setenv("SHORT_KEY", "sk-live-1234")
	t.Setenv("LONG_KEY", "sk-live-1234-tail-that-must-not-leak")
	h := newHarness(t, provision.Config{})
	h.startWorker(h.workerConfig(), worker.Deps{})
	h.shell("leaky2", `echo "key=$LONG_KEY" >&2; exit 2`, func(d *subagent.Definition) {
		d.EnvAllow = []string{"SHORT_KEY", "LONG_KEY"}
	})
	f := failedEvent(t, h.terminal(h.dispatch(lifecycle.Request{Subagent: "leaky2", Input: json.RawMessage(`{}`)})))
	if strings.Contains(f.Detail, "sk-live") || strings.Contains(f.Detail, "tail-that-must-not-leak") {
		t.Fatalf("detail shows part of a secret: %q", f.Detail)
	}
	if !strings.Contains(f.Detail, "key=[redacted]") {
		t.Errorf("detail = %q, want key=[redacted]", f.Detail)
	}
}

// TestFailureDetailRedactsBeforeTruncating: the detail keeps only the end
// of a long stderr; a secret cut in half by that truncation must not show
// its remaining part.
func TestFailureDetailRedactsBeforeTruncating(t *testing.T) {
	const secret = "sk-secret-abcdef-0123456789"
	h := secretWorker(t, secret)
	// The secret sits just before the last 700 bytes of stderr, whose
	// first 20 bytes or so it straddles, at every cut position nearby.
	for i, pad := range []int{680, 685, 690, 695} {
		name := "cut-" + string(rune('a'+i))
		h.shell(name, `printf 'key %s ' "$ALLOWED_KEY" >&2; head -c `+strconv.Itoa(pad)+` /dev/zero | tr '\0' y >&2; exit 2`, func(d *subagent.Definition) {
			d.EnvAllow = []string{"ALLOWED_KEY"}
		})
		f := failedEvent(t, h.terminal(h.dispatch(lifecycle.Request{Subagent: name, Input: json.RawMessage(`{}`)})))
		for n := 6; n <= len(secret); n++ {
			if tail := secret[len(secret)-n:]; strings.Contains(f.Detail, tail) {
				t.Errorf("pad %d: detail shows the last %d bytes of the secret (%q): %.120q", pad, n, tail, f.Detail)
				break
			}
		}
	}
}
