package worker_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/internal/proclist"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
)

// The hostile suite against a worker that is not root (docs/sandbox.md,
// "The hostile suite"): the worker is this test binary in worker mode,
// started as nobody (65534), so its runs are mapped to its own uid and
// only the box of their own stands between them and the worker's files,
// environment and bus. As in TestHostileSubagents, a script prints BREACH
// and exits 0 only when its attack worked.

// nobody is the unprivileged user the worker runs as.
const nobody = 65534

// unprivilegedWorker is a worker process running as nobody.
type unprivilegedWorker struct {
	cmd       *exec.Cmd
	logs      *startLog
	exited    chan struct{} // closed once the process has been waited for
	isolation string        // from the worker's start-up log line
	line      string        // that line
}

// startLog keeps a worker's output and tells when its start-up line came.
type startLog struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	started chan string // receives the "worker started" line once
	sent    bool
}

func (l *startLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	if !l.sent {
		for _, line := range strings.Split(l.buf.String(), "\n") {
			if strings.Contains(line, `msg="worker started"`) {
				l.sent = true
				l.started <- line
				break
			}
		}
	}
	return len(p), nil
}

func (l *startLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// reachableDir returns a new folder that nobody may enter (its parent,
// the test's temporary folder, is opened to 0711).
func reachableDir(t *testing.T) string {
	t.Helper()
	d := t.TempDir()
	if err := os.Chmod(filepath.Dir(d), 0o711); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

// nobodysDir returns a new folder owned by nobody, mode 0700.
func nobodysDir(t *testing.T) string {
	t.Helper()
	d := reachableDir(t)
	if err := os.Chown(d, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(d, 0o700); err != nil {
		t.Fatal(err)
	}
	return d
}

// startUnprivilegedWorker runs this test binary, copied where nobody can
// execute it, as a worker process of uid and gid nobody with env added to
// its few variables, and waits for its start-up log line. It is stopped
// when the test ends.
func (h *harness) startUnprivilegedWorker(env ...string) *unprivilegedWorker {
	h.t.Helper()
	t := h.t
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// The go tool builds the test binary in a folder only root may enter.
	bin := filepath.Join(reachableDir(t), "worker.test")
	src, err := os.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(bin, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}

	w := &unprivilegedWorker{logs: &startLog{started: make(chan string, 1)}, exited: make(chan struct{})}
	w.cmd = exec.Command(bin, "-test.run=^$")
	w.cmd.Env = append([]string{"WORKER_TEST_MAIN=1", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=" + nobodysDir(t), "AGORA_NATS_URL=" + h.srv.URL, "AGORA_WORKER_ID=nonroot", "AGORA_WORKER_CONCURRENCY=2",
		"AGORA_WORKER_PULL_EXPIRY=500ms", "AGORA_WORKER_KILL_GRACE=500ms", "AGORA_WORKER_SHUTDOWN_TIMEOUT=5s"}, env...)
	w.cmd.Stdout, w.cmd.Stderr = w.logs, w.logs
	w.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}, Pdeathsig: syscall.SIGKILL}
	if err := w.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = w.cmd.Wait()
		close(w.exited)
	}()
	t.Cleanup(func() {
		testkit.StopProcess(w.cmd.Process, syscall.SIGTERM, w.exited, 15*time.Second)
		if t.Failed() || testing.Verbose() {
			t.Logf("the unprivileged worker's output:\n%s", w.logs)
		}
	})
	select {
	case w.line = <-w.logs.started:
	case <-w.exited:
		t.Fatalf("the unprivileged worker exited before it started (%s):\n%s", w.cmd.ProcessState, w.logs)
	case <-time.After(30 * time.Second):
		t.Fatalf("the unprivileged worker did not start within 30s:\n%s", w.logs)
	}
	if m := regexp.MustCompile(`\bsandbox=(\S+)`).FindStringSubmatch(w.line); m != nil {
		w.isolation = m[1]
	}
	return w
}

// alive fails the test when the worker process has ended.
func (w *unprivilegedWorker) alive(t *testing.T) {
	t.Helper()
	select {
	case <-w.exited:
		t.Fatalf("the worker process ended (%s)", w.cmd.ProcessState)
	default:
	}
}

// TestHostileSubagentsNonRootWorker runs the attacks on the box itself
// through a worker process of uid nobody whose runs have namespaces of
// their own, its default floor and its default workspace watch.
func TestHostileSubagentsNonRootWorker(t *testing.T) {
	requireRootForNobody(t)
	h := newHarness(t, provision.Config{})
	natsURL, _ := url.Parse(h.srv.URL)

	// What the worker's user may read and write on the host, and so its
	// runs' host uid too: only the run's own root keeps them out.
	secrets := nobodysDir(t)
	creds := filepath.Join(secrets, "worker.creds")
	if err := os.WriteFile(creds, []byte(workerSecret), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(creds, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	outside := nobodysDir(t)
	wsRoot := nobodysDir(t)
	// The host's PID 1 as the host's /proc shows it; the run's /proc is its
	// own, where PID 1 is its launcher.
	initCmdline, err := os.ReadFile("/proc/1/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	initEnviron := ""
	if b, err := os.ReadFile("/proc/1/environ"); err == nil && len(b) > 0 {
		sum := sha256.Sum256(b)
		initEnviron = hex.EncodeToString(sum[:])
	}

	w := h.startUnprivilegedWorker("AGORA_WORKSPACE_ROOT="+wsRoot, "AGORA_TEST_WORKER_SECRET="+workerSecret)
	t.Logf("worker: %s", w.line)
	if w.isolation != "namespaces" {
		msg := fmt.Sprintf("the unprivileged worker's isolation is %q, not namespaces: this host does not let an unprivileged user create user namespaces (/proc/sys/user/max_user_namespaces, kernel.apparmor_restrict_unprivileged_userns, a container's seccomp profile); start-up line: %s", w.isolation, w.line)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	workerPID := fmt.Sprint(w.cmd.Process.Pid)
	spawnerPIDs := spawners(t, w.cmd.Process.Pid) // it runs in namespaces (above)

	cases := []struct {
		name   string
		script string
		env    map[string]string
		box    subagent.Sandbox
		reason lifecycle.Reason // "" accepts provider-failed or limit-exceeded
		check  func(t *testing.T, id string)
	}{
		// perl makes the raw system calls a shell cannot.
		{name: "multipath TCP and TCP to the NATS port", env: map[string]string{"PORT": natsURL.Port()},
			script: `perl -e 'use Socket; socket(my $s, AF_INET, SOCK_STREAM, 262) or exit 1; connect($s, sockaddr_in($ENV{PORT}, inet_aton("127.0.0.1"))) or exit 1; exit 0' && { echo BREACH mptcp; exit 0; }
perl -e 'use Socket; socket(my $s, AF_INET, SOCK_STREAM, 0) or exit 1; connect($s, sockaddr_in($ENV{PORT}, inet_aton("127.0.0.1"))) or exit 1; exit 0' && { echo BREACH tcp; exit 0; }; exit 1`},
		{name: "packet and raw sockets",
			script: `perl -e 'socket(my $s, 17, 3, 0x0300) or exit 1; exit 0' && { echo BREACH packet; exit 0; }; perl -e 'socket(my $s, 2, 3, 6) or exit 1; exit 0' && { echo BREACH raw; exit 0; }; exit 1`},
		{name: "capabilities of the runtime",
			script: `for set in CapInh CapPrm CapEff CapBnd CapAmb; do grep -q "^$set:[[:space:]]*0000000000000000$" /proc/self/status || { grep Cap /proc/self/status; echo BREACH; exit 0; }; done; [ "$(id -u)" = 0 ] && { echo BREACH uid 0; exit 0; }; exit 1`},
		{name: "the worker's environ, credentials and the host's PID 1",
			env: map[string]string{"WORKER_PID": workerPID, "CREDS": creds, "S1": workerSecret[:8], "S2": workerSecret[8:],
				"INIT_CMDLINE": strings.ReplaceAll(string(initCmdline), "\x00", " "), "INIT_ENVIRON": initEnviron},
			// The secret in halves: the sub-agent's own environ holds them
			// apart, the worker's holds it whole. (The dump is grepped after
			// it is written, or grep would find its own command line.)
			script: `for f in /proc/*/environ /proc/*/cmdline; do cat "$f"; done 2>/dev/null | tr '\0' '\n' > dump
grep -q "$S1$S2" dump && { echo BREACH environ; exit 0; }
cat "/proc/$WORKER_PID/environ" 2>/dev/null | tr '\0' '\n' | grep -q "$S1$S2" && { echo BREACH worker environ; exit 0; }
cat "$CREDS" 2>/dev/null | grep -q "$S1$S2" && { echo BREACH creds; exit 0; }
[ -e "$CREDS" ] && { echo BREACH creds seen; exit 0; }
ls -l /proc/*/fd 2>/dev/null | grep -q socket && { echo BREACH fd; exit 0; }
[ "$(tr '\0' ' ' < /proc/1/cmdline 2>/dev/null)" = "$INIT_CMDLINE" ] && { echo BREACH host init; exit 0; }
[ -n "$INIT_ENVIRON" ] && [ "$(sha256sum < /proc/1/environ 2>/dev/null | cut -d' ' -f1)" = "$INIT_ENVIRON" ] && { echo BREACH host init environ; exit 0; }
exit 1`},
		{name: "signal the worker", env: map[string]string{"WORKER_PID": workerPID},
			script: `kill -TERM "$WORKER_PID" 2>/dev/null && { echo BREACH; exit 0; }; kill -TERM -1 2>/dev/null; exit 1`,
			check:  func(t *testing.T, _ string) { w.alive(t) }},
		{name: "signal or read the spawner", env: map[string]string{"SPAWNER_PIDS": spawnerPIDs}, script: spawnerAttack},
		{name: "trace or signal the launcher",
			script: `[ "$(uname -m)" = x86_64 ] || exit 1
perl -e 'exit(syscall(101, 16, 1, 0, 0) == 0 ? 0 : 1)' && { echo BREACH ptrace; exit 0; }
perl -e 'exit(syscall(310, 1, 0, 0, 1, 0, 0) >= 0 ? 0 : 1)' && { echo BREACH process_vm_readv; exit 0; }
kill -HUP 1 2>/dev/null && { echo BREACH kill; exit 0; }; exit 1`},
		{name: "new namespaces, mounts and io_uring",
			script: `unshare -U true 2>/dev/null && { echo BREACH unshare; exit 0; }
unshare -rm true 2>/dev/null && { echo BREACH unshare; exit 0; }
[ "$(uname -m)" = x86_64 ] || exit 1
perl -e 'my $p = "\0" x 120; exit(syscall(425, 8, $p) >= 0 ? 0 : 1)' && { echo BREACH io_uring; exit 0; }; exit 1`},
		{name: "write outside the workspace", env: map[string]string{"OUTSIDE": outside, "CREDS": creds},
			script: `echo x > "$OUTSIDE/dropped" && { echo BREACH; exit 0; }
echo x >> "$CREDS" && { echo BREACH; exit 0; }
echo x > /var/tmp/agora-hostile-$AGORA_DISPATCH_ID && { echo BREACH; exit 0; }
echo x > "$(dirname "$PWD")/dropped-$AGORA_DISPATCH_ID"
echo x > /tmp/agora-hostile-$AGORA_DISPATCH_ID; exit 1`,
			check: func(t *testing.T, id string) {
				// The run's /tmp is its own (and holds the folders above its
				// workspace when the workspace root lies under /tmp): what it
				// wrote there is not the host's.
				for _, p := range []string{filepath.Join(outside, "dropped"), filepath.Join(wsRoot, "dropped-"+id), "/tmp/agora-hostile-" + id, "/var/tmp/agora-hostile-" + id} {
					if _, err := os.Stat(p); err == nil {
						t.Errorf("%s was written", p)
					}
				}
				if b, err := os.ReadFile(creds); err != nil || string(b) != workerSecret {
					t.Errorf("the credentials file changed: %q, %v", b, err)
				}
			}},
		// The launcher gives the workspace a filesystem of workspace_size
		// (a worker that is not root cannot mount it): the write fails.
		{name: "fallocate past the workspace cap", box: subagent.Sandbox{Limits: subagent.Limits{WorkspaceSize: "8MiB"}}, reason: lifecycle.ReasonLimitExceeded,
			script: `fallocate -l 64M big && { echo BREACH; exit 0; }; head -c 67108864 /dev/zero > big2 && { echo BREACH; exit 0; }; exit 1`},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			name := fmt.Sprintf("nonroot-%d", i)
			h.define(subagent.Definition{Name: name, Runtime: subagent.RuntimeExec, Command: []string{"/bin/sh", "-c", c.script}, Timeout: "60s", Sandbox: c.box})
			id := h.dispatch(lifecycle.Request{Subagent: name, Input: json.RawMessage(`{}`), Env: c.env})
			h.attackFailed(t, id, c.reason)
			if c.check != nil {
				c.check(t, id)
			}
		})
	}

	// An honest run's results come back through the workspace's own
	// filesystem the launcher made: its output, an artifact, and on the
	// next run a question.
	t.Run("results through the workspace's own filesystem", func(t *testing.T) {
		h.define(subagent.Definition{Name: "nonroot-honest", Runtime: subagent.RuntimeExec, Command: []string{"/bin/sh", "-c",
			`grep -q answer "$AGORA_INPUT_FILE" || { printf '{"question":"A or B?","options":["A","B"]}' > "$AGORA_NEEDS_INPUT_FILE"; exit 0; }
echo report > "$AGORA_WORKSPACE/.agora/artifacts/report.txt"; printf '{"ok":true}' > "$AGORA_OUTPUT_FILE"`}})
		id := h.dispatch(lifecycle.Request{Subagent: "nonroot-honest", Input: json.RawMessage(`{}`)})
		if ni, ok := h.terminal(id).Data.(*lifecycle.NeedsInput); !ok || ni.Question != "A or B?" {
			t.Fatalf("first round %+v, want the question", h.terminal(id).Data)
		}
		id2 := h.dispatch(lifecycle.Request{Subagent: "nonroot-honest", Input: json.RawMessage(`{"answer":"A"}`)})
		fin, ok := h.terminal(id2).Data.(*lifecycle.Finished)
		if !ok || string(fin.Output) != `{"ok":true}` || len(fin.Artifacts) != 1 {
			t.Fatalf("second run %+v, want finished with its output and one artifact", h.terminal(id2).Data)
		}
	})

	// A definition with mode: off is refused under the worker's default
	// floor: its command never starts.
	t.Run("a definition with mode off", func(t *testing.T) {
		mark := filepath.Join(outside, "ran-unboxed")
		rev := h.define(subagent.Definition{Name: "nonroot-off", Runtime: subagent.RuntimeExec, Command: []string{"/bin/sh", "-c", "echo BREACH > " + mark}, Sandbox: subagent.Sandbox{Mode: subagent.SandboxOff}})
		id := h.dispatch(lifecycle.Request{Subagent: "nonroot-off", SubagentRevision: rev, Input: json.RawMessage(`{}`)})
		r := h.terminal(id)
		h.assertOneTerminal(id)
		f, ok := r.Data.(*lifecycle.Failed)
		if !ok || f.Reason != lifecycle.ReasonRejected {
			t.Fatalf("terminal %T %+v, want failed rejected", r.Data, r.Data)
		}
		if want := `sandbox.mode "off" is below the operator's floor "standard" (AGORA_SANDBOX_FLOOR)`; !strings.Contains(f.Detail, want) {
			t.Errorf("detail %q does not say %q", f.Detail, want)
		}
		if _, err := os.Stat(mark); err == nil {
			t.Error("the command ran")
		}
		if ks := kinds(h.events(id)); len(ks) != 1 {
			t.Errorf("events %v, want only the rejection", ks)
		}
	})

	// The started event says what held: the run's own namespaces.
	id := h.dispatch(lifecycle.Request{Subagent: "nonroot-2", Input: json.RawMessage(`{}`)})
	h.terminal(id)
	var st *lifecycle.Started
	for _, e := range h.events(id) {
		if s, ok := e.Data.(*lifecycle.Started); ok {
			st = s
		}
	}
	if st == nil || st.Sandbox == nil || st.Sandbox.Mode != subagent.SandboxStandard || st.Sandbox.Isolation != "namespaces" {
		t.Fatalf("started.sandbox = %+v, want the standard mode in namespaces of its own", st)
	}
	t.Logf("started.sandbox: %+v", *st.Sandbox)
	w.alive(t)
}

// A worker that is not root stops as a root one does: a run that ignores
// TERM, INT and HUP and leaves a double-forked child behind ends cancelled
// once the shutdown timeout passes, and the child is killed with it.
func TestShutdownNonRootWorkerKillsAHostileRun(t *testing.T) {
	requireRootForNobody(t)
	h := newHarness(t, provision.Config{})
	w := h.startUnprivilegedWorker("AGORA_WORKSPACE_ROOT="+nobodysDir(t), "AGORA_WORKER_SHUTDOWN_TIMEOUT=300ms")
	marker := "agora-nonroot-survivor-" + lifecycle.NewID()
	h.define(subagent.Definition{Name: "stop-ignorer", Runtime: subagent.RuntimeExec, Timeout: "60s", Command: []string{"/bin/sh", "-c",
		`trap '' TERM INT HUP; (sh -c 'trap "" TERM INT HUP; sleep 60; :' ` + marker + ` &); while :; do sleep 1; done`}})
	id := h.dispatch(lifecycle.Request{Subagent: "stop-ignorer", Input: json.RawMessage(`{}`)})
	// The child runs before the stop, or the check after it would prove
	// nothing.
	testkit.Eventually(t, 30*time.Second, "the double-forked child to run", func() bool { return len(proclist.WithMarker(marker)) > 0 })
	if err := w.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.exited:
	case <-time.After(30 * time.Second):
		t.Fatalf("the worker did not stop 30s after SIGTERM:\n%s", w.logs)
	}
	r := h.terminal(id)
	if _, ok := r.Data.(*lifecycle.Cancelled); !ok {
		t.Fatalf("terminal = %T %+v, want cancelled", r.Data, r.Data)
	}
	h.assertOneTerminal(id)
	assertNoProcess(t, marker)
}
