package worker_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/services/worker"
)

// The hostile sub-agent suite (docs/sandbox.md): each case is a real exec
// sub-agent, run through a real worker with the default sandbox, that
// attacks the worker, the bus or other dispatches. A script prints BREACH
// and exits 0 only when its attack worked; every case asserts the attack
// failed and the dispatch still ended with exactly one terminal event.

const workerSecret = "worker-secret-7c1e9a"

// attackFailed waits for the one terminal event of dispatch id and checks
// that its attack failed: the run failed, for reason (empty: the
// sub-agent's own failure or an exceeded limit), and the worker's secret is
// not in the detail.
func (h *harness) attackFailed(t *testing.T, id string, reason lifecycle.Reason) {
	t.Helper()
	r := h.terminal(id)
	h.assertOneTerminal(id)
	if fin, ok := r.Data.(*lifecycle.Finished); ok {
		t.Fatalf("the attack worked: finished, stdout %q", fin.StdoutTail)
	}
	f, ok := r.Data.(*lifecycle.Failed)
	if !ok {
		t.Fatalf("terminal = %T %+v, want failed", r.Data, r.Data)
	}
	if strings.Contains(f.Detail, workerSecret) {
		t.Errorf("the secret leaked into the detail: %s", f.Detail)
	}
	switch {
	case reason != "" && f.Reason != reason:
		t.Errorf("failed %s (%s), want %s", f.Reason, f.Detail, reason)
	case reason == "" && f.Reason != lifecycle.ReasonProviderFailed && f.Reason != lifecycle.ReasonLimitExceeded:
		t.Errorf("failed %s (%s), want the sub-agent's own failure", f.Reason, f.Detail)
	}
}

// newControlHarness starts the harness of a control test — the attacks
// run unboxed (mode off under a floor of off) and must work — with a
// worker, and returns it with the server's URL. A control needs a root
// worker; elsewhere the test is skipped.
func newControlHarness(t *testing.T) (*harness, *url.URL) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the control needs a root worker: a run with mode off is the worker's own user")
	}
	h := newHarness(t, provision.Config{})
	natsURL, _ := url.Parse(h.srv.URL)
	cfg := h.workerConfig()
	cfg.SandboxFloor = subagent.SandboxOff
	h.startWorker(cfg, worker.Deps{})
	return h, natsURL
}

// requireRootForNobody skips a test that starts its worker as nobody
// unless it runs as root; in CI, which runs as root, it fails instead.
func requireRootForNobody(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		msg := "the test starts its worker as nobody: it must run as root (as CI does)"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
}

// requireSandbox fails under CI=true, and skips elsewhere, when the host
// lacks a layer a case needs.
func requireSandbox(t *testing.T, svc *worker.Service, need string) {
	t.Helper()
	h := svc.Sandbox()
	var ok bool
	switch need {
	case "landlock":
		ok = h.LandlockABI >= 1
	case "network":
		ok = h.LandlockABI >= 4
	case "scope":
		ok = h.LandlockABI >= 6
	case "cgroup":
		ok = svc.Cgroups()
	case "pidns":
		ok = svc.Isolation() == "pid-namespace" || svc.Isolation() == "namespaces"
	case "namespaces":
		ok = svc.Isolation() == "namespaces"
	}
	if ok {
		return
	}
	msg := fmt.Sprintf("this host lacks the sandbox layer %q (host: %+v, isolation %s, cgroups %v)", need, h, svc.Isolation(), svc.Cgroups())
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

func TestHostileSubagents(t *testing.T) {
	t.Setenv("AGORA_TEST_WORKER_SECRET", workerSecret)
	h := newHarness(t, provision.Config{})
	natsURL, _ := url.Parse(h.srv.URL)

	// What an attacker might know the path of: a credentials file, another
	// dispatch's workspace, a folder outside every workspace.
	secrets := t.TempDir()
	creds := filepath.Join(secrets, "worker.creds")
	if err := os.WriteFile(creds, []byte(workerSecret), 0o600); err != nil {
		t.Fatal(err)
	}
	// Another dispatch's live workspace: locked as a running run holds it,
	// so the worker's sweep leaves it alone.
	other := filepath.Join(h.root, "01OTHERDISPATCH.1.1")
	if err := os.MkdirAll(filepath.Join(other, ".agora"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(other, ".agora", "input.json"), []byte(workerSecret), 0o600); err != nil {
		t.Fatal(err)
	}
	holdLock(t, other)
	outside := t.TempDir()
	cfg := h.workerConfig()
	cfg.SandboxUID = 0 // the default: an unprivileged host uid
	svc := h.startWorker(cfg, worker.Deps{})
	var spawnerPIDs string // where the worker's launchers come from a spawner
	if svc.Isolation() == "namespaces" {
		spawnerPIDs = spawners(t, os.Getpid())
	}

	cases := []struct {
		name   string
		need   string
		script string
		env    map[string]string
		box    subagent.Sandbox
		reason lifecycle.Reason // "" accepts provider-failed or limit-exceeded
		check  func(t *testing.T, id string)
	}{
		{name: "read the worker's environ, cmdline and fds", need: "pidns", script: `
for f in /proc/*/environ /proc/*/cmdline; do cat "$f"; done 2>/dev/null | tr '\0' '\n' > dump
grep -q "$S1$S2" dump && { echo BREACH; exit 0; }
ls -l /proc/*/fd 2>/dev/null | grep -q socket && { echo BREACH fd; exit 0; }
cat /proc/$WORKER_PID/environ 2>/dev/null | tr '\0' '\n' | grep -q "$S1$S2" && { echo BREACH; exit 0; }
exit 1`,
			// The secret in halves: the sub-agent's own environ holds them
			// apart, the worker's holds it whole. (The dump is grepped after
			// it is written, or grep would find its own command line.)
			env: map[string]string{"WORKER_PID": fmt.Sprint(os.Getpid()), "S1": workerSecret[:8], "S2": workerSecret[8:]}},
		{name: "read the NATS credentials file", need: "landlock", script: `cat "$CREDS" && { echo BREACH; exit 0; }; exit 1`,
			env: map[string]string{"CREDS": creds}},
		{name: "read another dispatch's workspace", need: "landlock", script: `cat "$ROOT"/*/.agora/input.json | grep -q "$S1$S2" && { echo BREACH; exit 0; }; exit 1`,
			env: map[string]string{"ROOT": h.root, "S1": workerSecret[:8], "S2": workerSecret[8:]}},
		{name: "write outside the workspace", need: "landlock", script: `echo x > "$OUTSIDE/dropped" && { echo BREACH; exit 0; }; echo x > /var/tmp/agora-hostile-$AGORA_DISPATCH_ID && { echo BREACH; exit 0; }; echo x > /tmp/agora-hostile-$AGORA_DISPATCH_ID; exit 1`,
			env: map[string]string{"OUTSIDE": outside},
			check: func(t *testing.T, id string) {
				// The run's /tmp is its own: what it wrote there is not the host's.
				for _, p := range []string{filepath.Join(outside, "dropped"), "/tmp/agora-hostile-" + id, "/var/tmp/agora-hostile-" + id} {
					if _, err := os.Stat(p); err == nil {
						t.Errorf("%s was written", p)
					}
				}
			}},
		{name: "connect to the NATS port", need: "network", script: `bash -c 'exec 3<>/dev/tcp/127.0.0.1/'"$BUS_PORT" 2>/dev/null && { echo BREACH; exit 0; }; exit 1`,
			env: map[string]string{"BUS_PORT": natsURL.Port()}},
		{name: "publish a forged lifecycle event", need: "network", script: `bash -c '
exec 3<>/dev/tcp/127.0.0.1/'"$BUS_PORT"' || exit 1
printf "CONNECT {}\r\nPUB agora.lifecycle.finished.forged.forged 2\r\n{}\r\nPING\r\n" >&3
read -t 2 line <&3 && echo BREACH' | grep -q BREACH && { echo BREACH; exit 0; }; exit 1`,
			env: map[string]string{"BUS_PORT": natsURL.Port()},
			check: func(t *testing.T, id string) {
				if evs := h.events("forged"); len(evs) > 0 {
					t.Errorf("a forged event reached the stream: %+v", evs)
				}
			}},
		{name: "signal the worker", need: "pidns", script: `kill -TERM "$WORKER_PID" 2>/dev/null && { echo BREACH; exit 0; }; kill -TERM -1 2>/dev/null; exit 1`,
			env: map[string]string{"WORKER_PID": fmt.Sprint(os.Getpid())}},
		{name: "signal or read the spawner", need: "namespaces", script: spawnerAttack, env: map[string]string{"SPAWNER_PIDS": spawnerPIDs}},
		{name: "fork bomb", need: "cgroup", box: subagent.Sandbox{Limits: subagent.Limits{Processes: 64}}, reason: lifecycle.ReasonLimitExceeded,
			script: `bomb() { bomb | bomb & }; bomb; sleep 2; exit 0`},
		{name: "allocate past the memory limit", need: "landlock", box: subagent.Sandbox{Limits: subagent.Limits{Memory: "128MiB"}},
			script: `x=$(head -c 300000000 /dev/zero | tr '\0' a) && [ ${#x} -gt 200000000 ] && { echo BREACH; exit 0; }; exit 1`},
		{name: "allocate past the memory limit in the runtime itself", need: "landlock", box: subagent.Sandbox{Limits: subagent.Limits{Memory: "64MiB"}},
			script: `exec /usr/bin/python3 -c 'x = bytearray(200 * 1024 * 1024); print("BREACH")'`},
		{name: "fill the disk past the workspace cap", need: "landlock", box: subagent.Sandbox{Limits: subagent.Limits{WorkspaceSize: "8MiB"}}, reason: lifecycle.ReasonLimitExceeded,
			script: `for i in 1 2 3 4 5 6; do head -c 4000000 /dev/zero > "big.$i" || exit 1; done; sleep 5; echo BREACH; exit 0`},
		{name: "write one file past the file size limit", need: "landlock", box: subagent.Sandbox{Limits: subagent.Limits{FileSize: "1MiB"}}, reason: lifecycle.ReasonLimitExceeded,
			// The runtime itself writes; a child killed by SIGXFSZ is the
			// sub-agent's own failure (docs/sandbox.md).
			script: `exec head -c 5000000 /dev/zero > big`},
		// Attacks on the run's own box (docs/sandbox.md, "Threat model"),
		// shared with TestBoxAttacksBreachWithoutTheSandbox.
		{name: "multipath TCP to the NATS port", need: "namespaces", env: map[string]string{"PORT": natsURL.Port()}, script: attackMPTCP},
		{name: "packet and raw sockets", need: "namespaces", script: attackPacket},
		{name: "capabilities of the runtime", need: "namespaces", script: attackCaps},
		{name: "the docker socket and the worker's files", need: "namespaces", env: map[string]string{"CREDS": creds}, script: attackFiles},
		{name: "trace or signal the launcher", need: "namespaces", script: attackTrace},
		{name: "new namespaces, mounts and io_uring", need: "namespaces", script: attackUnshare},
		{name: "fallocate past the workspace cap", need: "namespaces", box: subagent.Sandbox{Limits: subagent.Limits{WorkspaceSize: "8MiB"}}, reason: lifecycle.ReasonLimitExceeded,
			script: `fallocate -l 2G big && { echo BREACH; exit 0; }; head -c 9000000 /dev/zero > big2 && { echo BREACH; exit 0; }; exit 1`},
		{name: "LD_PRELOAD through the request", script: `[ -n "$LD_PRELOAD$BASH_ENV$NODE_OPTIONS" ] && { echo BREACH; exit 0; }; exit 1`,
			env: map[string]string{"LD_PRELOAD": "/tmp/evil.so", "BASH_ENV": "/tmp/evil.sh", "NODE_OPTIONS": "--require /tmp/evil.js"}},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.need != "" {
				requireSandbox(t, svc, c.need)
			}
			name := fmt.Sprintf("hostile-%d", i)
			h.define(subagent.Definition{Name: name, Runtime: subagent.RuntimeExec, Command: []string{"/bin/sh", "-c", c.script}, Timeout: "60s", Sandbox: c.box})
			env := map[string]string{}
			for k, v := range c.env {
				env[k] = v
			}
			id := h.dispatch(lifecycle.Request{Subagent: name, Input: json.RawMessage(`{}`), Env: env})
			h.attackFailed(t, id, c.reason)
			if c.check != nil {
				c.check(t, id)
			}
		})
	}

	// The started event says what held.
	var st *lifecycle.Started
	id := h.dispatch(lifecycle.Request{Subagent: "hostile-0", Input: json.RawMessage(`{}`)})
	h.terminal(id)
	for _, e := range h.events(id) {
		if s, ok := e.Data.(*lifecycle.Started); ok {
			st = s
		}
	}
	if st == nil || st.Sandbox == nil || st.Sandbox.Mode != subagent.SandboxStandard || st.Sandbox.Isolation == "" {
		t.Fatalf("started.sandbox = %+v, want the standard mode and the isolation in force", st)
	}
}

// Attacks on the box itself; each prints BREACH when it works. perl makes
// the raw system calls a shell cannot (x86_64 numbers where it calls
// syscall directly).
const (
	attackMPTCP = `perl -e 'use Socket; socket(my $s, AF_INET, SOCK_STREAM, 262) or exit 1; connect($s, sockaddr_in($ENV{PORT}, inet_aton("127.0.0.1"))) or exit 1; exit 0' && { echo BREACH; exit 0; }
perl -e 'use Socket; socket(my $s, AF_INET, SOCK_STREAM, 0) or exit 1; connect($s, sockaddr_in($ENV{PORT}, inet_aton("127.0.0.1"))) or exit 1; exit 0' && { echo BREACH; exit 0; }; exit 1`
	attackPacket = `perl -e 'socket(my $s, 17, 3, 0x0300) or exit 1; exit 0' && { echo BREACH; exit 0; }; perl -e 'socket(my $s, 2, 3, 6) or exit 1; exit 0' && { echo BREACH; exit 0; }; exit 1`
	attackCaps   = `for set in CapInh CapPrm CapEff CapBnd CapAmb; do grep -q "^$set:[[:space:]]*0000000000000000$" /proc/self/status || { grep Cap /proc/self/status; echo BREACH; exit 0; }; done; [ "$(id -u)" = 0 ] && { echo BREACH; exit 0; }; exit 1`
	attackFiles  = `for p in /var/run/docker.sock /run/docker.sock /root "$CREDS"; do [ -e "$p" ] && [ -r "$p" ] && { echo "BREACH $p"; exit 0; }; done; cat /etc/shadow 2>/dev/null && { echo BREACH; exit 0; }; exit 1`
	attackTrace  = `[ "$(uname -m)" = x86_64 ] || exit 1
perl -e 'exit(syscall(101, 0x4206, 1, 0, 0) == 0 ? 0 : 1)' && { echo BREACH ptrace; exit 0; }
perl -e 'exit(syscall(310, 1, 0, 0, 1, 0, 0) >= 0 ? 0 : 1)' && { echo BREACH process_vm_readv; exit 0; }
kill -HUP 1 2>/dev/null && { echo BREACH kill; exit 0; }; exit 1`
	attackUnshare = `unshare -U true 2>/dev/null && { echo BREACH unshare; exit 0; }
unshare -rm true 2>/dev/null && { echo BREACH unshare; exit 0; }
[ "$(uname -m)" = x86_64 ] || exit 1
perl -e 'my $p = "\0" x 120; exit(syscall(425, 8, $p) >= 0 ? 0 : 1)' && { echo BREACH io_uring; exit 0; }; exit 1`
)

// TestBoxAttacksBreachWithoutTheSandbox is the control of the attacks on
// the box: with mode off (under a floor of off), on the root worker CI
// runs, each one works — so their failure under the sandbox is the
// sandbox's doing, not a broken script.
func TestBoxAttacksBreachWithoutTheSandbox(t *testing.T) {
	h, natsURL := newControlHarness(t)
	secret := filepath.Join(t.TempDir(), "worker.creds")
	if err := os.WriteFile(secret, []byte(workerSecret), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, script string
		env          map[string]string
	}{
		{"multipath TCP", attackMPTCP, map[string]string{"PORT": natsURL.Port()}},
		{"packet sockets", attackPacket, nil},
		{"capabilities", attackCaps, nil},
		{"files", attackFiles, map[string]string{"CREDS": secret}},
		{"trace the launcher", attackTrace, nil},
		{"unshare", attackUnshare, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			name := "control-" + strings.ReplaceAll(c.name, " ", "-")
			h.define(subagent.Definition{Name: name, Runtime: subagent.RuntimeExec, Command: []string{"/bin/sh", "-c", c.script}, Timeout: "60s",
				Sandbox: subagent.Sandbox{Mode: subagent.SandboxOff}, EnvAllow: slices.Collect(maps.Keys(c.env))})
			id := h.dispatch(lifecycle.Request{Subagent: name, Input: json.RawMessage(`{}`), Env: c.env})
			fin, ok := h.terminal(id).Data.(*lifecycle.Finished)
			if !ok || !strings.Contains(fin.StdoutTail, "BREACH") {
				t.Errorf("without the sandbox the attack should work: %+v", h.terminal(id).Data)
			}
		})
	}
}

// spawnerAttack is a run's attack on the spawner its launcher was forked
// from (docs/sandbox.md, "The spawner"), told its host pid: signal it,
// read its environment, list its descriptors, reach its socket through
// /proc. Each must fail.
const spawnerAttack = `for p in $SPAWNER_PIDS; do
  kill -0 "$p" 2>/dev/null && { echo BREACH signal $p; exit 0; }
  cat "/proc/$p/environ" >/dev/null 2>&1 && { echo BREACH environ $p; exit 0; }
  ls "/proc/$p/fd" >/dev/null 2>&1 && { echo BREACH fds $p; exit 0; }
  exec 9<>"/proc/$p/fd/3" 2>/dev/null && { echo BREACH socket $p; exit 0; }
done
exit 1`

// spawners waits until the worker pid has a spawner child and returns the
// pids of its spawners, space-separated.
func spawners(t *testing.T, pid int) string {
	t.Helper()
	var found []string
	testkit.Eventually(t, 10*time.Second, fmt.Sprintf("process %d to start its spawner", pid), func() bool {
		found = nil
		tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		for _, task := range tasks {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, task.Name()))
			for _, c := range strings.Fields(string(b)) {
				argv, _ := os.ReadFile("/proc/" + c + "/cmdline")
				if strings.HasPrefix(string(argv), "agora-sandbox-spawner\x00") {
					found = append(found, c)
				}
			}
		}
		return len(found) > 0
	})
	return strings.Join(found, " ")
}
