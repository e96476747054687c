package worker_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agora-dispatch/agora/internal/egress"
	"github.com/agora-dispatch/agora/internal/proclist"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/services/worker"
)

// More hostile sub-agents (docs/sandbox.md, "Attack → layer → test"):
// attacks on the box beyond hostile_test.go's, each a real exec sub-agent
// run through a real worker. As there, a script prints BREACH and exits 0
// only when its attack worked; TestMoreBoxAttacksBreachWithoutTheSandbox
// and the controls beside the cases show that each attack works where the
// layer that stops it is absent.

// moreCase is one attack.
type moreCase struct {
	name   string
	need   string // the sandbox layer the case needs (requireSandbox)
	script string
	env    map[string]string
	box    subagent.Sandbox
	reason lifecycle.Reason // "" accepts provider-failed or limit-exceeded
	// check, when set, looks at the terminal event for what the worker
	// itself did wrong after the run (the script cannot see that).
	check func(t *testing.T, id string, r recorded)
	// finish: the attack's run ends finished (its harm, if any, is in
	// what the worker did with it, which check looks at).
	finish bool
}

// Attacks on the box shared with the controls; perl makes the system calls
// a shell cannot (x86_64 numbers where it calls syscall directly).
const (
	// Socket families and protocols past the seccomp allow-list: vsock
	// (not bound to any network namespace: the hypervisor's host), netlink
	// other than route, multipath TCP. Only socket() is called; nothing is
	// connected to.
	attackSocketFamilies = `perl -e 'socket(my $s, 40, 1, 0) or exit 1; exit 0' && { echo BREACH vsock; exit 0; }
perl -e 'socket(my $s, 16, 3, 9) or exit 1; exit 0' && { echo BREACH netlink audit; exit 0; }
perl -e 'socket(my $s, 16, 3, 15) or exit 1; exit 0' && { echo BREACH netlink uevent; exit 0; }
perl -e 'socket(my $s, 2, 1, 262) or exit 1; exit 0' && { echo BREACH mptcp; exit 0; }
perl -e 'socket(my $s, 10, 1, 262) or exit 1; exit 0' && { echo BREACH mptcp6; exit 0; }
exit 1`
	// More processes than the definition's limits.processes (32): each
	// child sleeps until the run ends.
	attackProcesses = `perl -e 'my $n = 0; for (1..100) { my $p = fork; last unless defined $p; if ($p == 0) { sleep 120; exit 0 } $n++ } print "$n\n"; exit($n >= 100 ? 0 : 1)' && { echo BREACH; exit 0; }; exit 1`
	// Empty files past the inodes of /tmp's own filesystem (65536), in
	// /dev/shm: each inode is kernel memory, not bounded by the size.
	attackShmInodes = `perl -e 'for my $i (1..70000) { open(my $f, ">", "/dev/shm/agora-inode-$ENV{AGORA_DISPATCH_ID}-$i") or exit 1; close $f } exit 0'; r=$?
rm -f /dev/shm/agora-inode-"$AGORA_DISPATCH_ID"-*
[ $r = 0 ] && { echo BREACH; exit 0; }; exit 1`
	// Signal the launcher through a pidfd (signal 0: the permission
	// check alone).
	attackPidfd = `[ "$(uname -m)" = x86_64 ] || exit 1
perl -e 'my $fd = syscall(434, 1, 0); exit 1 if $fd < 0; exit(syscall(424, $fd, 0, 0, 0) == 0 ? 0 : 1)' && { echo BREACH pidfd_send_signal; exit 0; }; exit 1`
	// The kernel's keyrings: the user keyring's id, and a key added to
	// the process's own keyring.
	attackKeyring = `[ "$(uname -m)" = x86_64 ] || exit 1
perl -e 'exit(syscall(250, 0, -4, 0) >= 0 ? 0 : 1)' && { echo BREACH keyctl; exit 0; }
perl -e 'exit(syscall(248, "user", "agora-hostile", "x", 1, -2) >= 0 ? 0 : 1)' && { echo BREACH add_key; exit 0; }; exit 1`
	// A user namespace past the seccomp rules: the raw clone system call
	// with CLONE_NEWUSER, clone3 (its flags in memory) and unshare through
	// the 32-bit ABI (int 0x80, from python's ctypes).
	attackNewUserNS = `[ "$(uname -m)" = x86_64 ] || exit 1
perl -e 'use POSIX; my $r = syscall(56, 0x10000000 | 17, 0, 0, 0, 0); POSIX::_exit(0) if $r == 0; exit($r > 0 ? 0 : 1)' && { echo BREACH clone; exit 0; }
perl -e 'use POSIX; my $a = pack("Q11", 0x10000000, 0, 0, 0, 17, 0, 0, 0, 0, 0, 0); my $r = syscall(435, $a, 88); POSIX::_exit(0) if $r == 0; exit($r > 0 ? 0 : 1)' && { echo BREACH clone3; exit 0; }
/usr/bin/python3 -c '
import ctypes, mmap, sys
code = bytes.fromhex("53b836010000bb00000010cd805bc3")  # push rbx; unshare(CLONE_NEWUSER) via int 0x80; pop rbx; ret
m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
m.write(code)
f = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))
sys.exit(0 if f() == 0 else 1)' && { echo BREACH int 0x80; exit 0; }; exit 1`
	// Write a kernel setting (each written back with its own value), and
	// leave the run's cgroup.
	attackProcSys = `for f in /proc/sys/kernel/printk_ratelimit /proc/sys/vm/overcommit_ratio /proc/sys/net/core/somaxconn /proc/sys/fs/pipe-max-size; do
v=$(cat "$f" 2>/dev/null) && (echo "$v" > "$f") 2>/dev/null && { echo "BREACH $f"; exit 0; }
done
for f in /sys/fs/cgroup/pids/cgroup.procs /sys/fs/cgroup/memory/cgroup.procs /sys/fs/cgroup/cgroup.procs; do
(echo $$ > "$f") 2>/dev/null && { echo "BREACH $f"; exit 0; }
done; exit 1`
	// Connect to an abstract Unix socket the worker's side listens on
	// ($SOCK, without its leading @).
	attackAbstract = `perl -e 'use Socket; socket(my $s, AF_UNIX, SOCK_STREAM, 0) or exit 1; connect($s, pack_sockaddr_un("\0" . $ENV{SOCK})) or exit 1; exit 0' && { echo BREACH; exit 0; }; exit 1`
	// Through the egress proxy to the NATS port on the worker's loopback:
	// by an allowed name that resolves there, by the allowed address, by
	// forms of it the allow-list does not name.
	attackProxyLoopback = `for t in "localhost:$PORT" "127.0.0.1:$PORT" "[::ffff:127.0.0.1]:$PORT" "127.1:$PORT" "[::1]:$PORT" "0.0.0.0:$PORT"; do
s=$(bash -c 'exec 3<>/dev/tcp/127.0.0.1/3128 || exit 1; printf "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" "$1" "$1" >&3; read -t 10 line <&3; echo "$line"' _ "$t")
echo "$t: $s"
case "$s" in *" 200 "*) echo "BREACH $t"; exit 0;; esac
done; exit 1`
	// A daemon (two forks, its own session, deaf to hangup and
	// termination) that should outlive the run; the run ends once it
	// runs. $MARK names it in its command line.
	attackSurvive = `perl -e 'use POSIX; exit 0 if fork; POSIX::setsid(); exit 0 if fork; $SIG{$_} = "IGNORE" for qw(HUP TERM INT); open(STDIN, "<", "/dev/null"); open(STDOUT, ">", "/dev/null"); open(STDERR, ">", "/dev/null"); $0 = "agora-survivor-$ENV{MARK}"; sleep 300; exit 0'
until grep -qs "agora-survivor-$MARK" /proc/[0-9]*/cmdline; do :; done
echo DAEMON UP; exit 0`
	// Characters pushed into the input of a terminal the runtime holds
	// (TIOCSTI on stdin, stdout, stderr, and /dev/tty).
	attackTIOCSTI = `perl -e 'my $c = "x"; for my $fd (0, 1, 2) { open(my $h, "+<&=", $fd) or next; exit 0 if ioctl($h, 0x5412, $c) } open(my $t, "+<", "/dev/tty") or exit 1; exit(ioctl($t, 0x5412, $c) ? 0 : 1)' && { echo BREACH; exit 0; }; exit 1`
)

func TestHostileSubagentsMore(t *testing.T) {
	h := newHarness(t, provision.Config{})
	natsURL, _ := url.Parse(h.srv.URL)
	cfg := h.workerConfig()
	cfg.SandboxUID = 0 // the default: an unprivileged host uid
	svc := h.startWorker(cfg, worker.Deps{})
	sock := listenAbstract(t)
	mark := lifecycle.NewID()

	cases := []moreCase{
		{name: "socket families past the seccomp allow-list", need: "namespaces", script: attackSocketFamilies},
		{name: "signal the launcher through a pidfd", need: "scope", script: attackPidfd},
		{name: "the kernel's keyrings", need: "namespaces", script: attackKeyring},
		{name: "a user namespace through raw clone, clone3 and int 0x80", need: "namespaces", script: attackNewUserNS},
		{name: "write kernel settings and leave the run's cgroup", need: "namespaces", script: attackProcSys,
			box: subagent.Sandbox{Limits: subagent.Limits{Processes: 64}}},
		{name: "the worker's abstract Unix socket", need: "namespaces", script: attackAbstract, env: map[string]string{"SOCK": sock}},
		{name: "the NATS port through the egress proxy", need: "namespaces", script: attackProxyLoopback, env: map[string]string{"PORT": natsURL.Port()},
			box: subagent.Sandbox{Network: subagent.Network{Allow: []string{"localhost:" + natsURL.Port(), "127.0.0.1:" + natsURL.Port()}}}},
		{name: "TIOCSTI into a terminal", script: attackTIOCSTI},
		{name: "a daemon that outlives the run", need: "pidns", script: attackSurvive, env: map[string]string{"MARK": mark}, finish: true,
			check: func(t *testing.T, _ string, r recorded) {
				if fin, ok := r.Data.(*lifecycle.Finished); !ok || !strings.Contains(fin.StdoutTail, "DAEMON UP") {
					t.Fatalf("the daemon never ran: %+v", r.Data)
				}
				assertNoProcess(t, "agora-survivor-"+mark)
			}},
		// What the worker reads once the run is over: a FIFO where the
		// output goes, a sparse gigabyte of progress. It must neither
		// block nor read without bound.
		{name: "a FIFO output and a sparse gigabyte of progress", finish: true,
			script: `cd "$AGORA_WORKSPACE/.agora" && truncate -s 1000M progress.jsonl && mkfifo output.json && exit 0; exit 1`,
			check: func(t *testing.T, _ string, r recorded) {
				if fin, ok := r.Data.(*lifecycle.Finished); !ok || (len(fin.Output) != 0 && string(fin.Output) != "null") {
					t.Fatalf("terminal %+v, want finished without output", r.Data)
				}
			}},
	}
	cases = append(cases, hostLinkCase(t))
	h.runMore(t, svc, "more", cases)
}

// hostLinkCase is the attack of a run that names a host link in its
// output to learn, from its failure's detail, where the link leads: the
// detail may say the path is hidden (and how to show it) but never follows
// it to its target.
func hostLinkCase(t *testing.T) moreCase {
	t.Helper()
	dir := t.TempDir()
	target := filepath.Join(dir, "secret-target-"+lifecycle.NewID())
	if err := os.MkdirAll(target, 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "innocent", "link")
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	return moreCase{name: "a host link named in the output to learn its target", script: `echo "cannot open $LINK" >&2; exit 3`,
		env: map[string]string{"LINK": link},
		check: func(t *testing.T, _ string, r recorded) {
			f, ok := r.Data.(*lifecycle.Failed)
			if !ok {
				t.Fatalf("terminal %+v, want failed", r.Data)
			}
			if strings.Contains(f.Detail, "secret-target") {
				t.Errorf("the detail follows the run's link to its target: %s", f.Detail)
			}
		}}
}

// listenAbstract listens on a new abstract Unix socket in the worker's
// network namespace, accepting (and closing) connections until the test
// ends, and returns its name without the leading @.
func listenAbstract(t *testing.T) string {
	t.Helper()
	name := "agora-hostile-" + lifecycle.NewID()
	testkit.Listen(t, "unix", "@"+name)
	return name
}

// TestMoreBoxAttacksBreachWithoutTheSandbox is the control of the attacks
// above: with mode off (under a floor of off), on the root worker CI runs,
// each one works; the egress proxy reaches the worker's loopback when its
// address check is off; the daemon outlives a parent outside the box; and
// TIOCSTI works on a terminal. So their failure in the box is the box's
// doing, not a broken script.
func TestMoreBoxAttacksBreachWithoutTheSandbox(t *testing.T) {
	h, natsURL := newControlHarness(t)
	sock := listenAbstract(t)
	breaches := func(t *testing.T, id string) {
		t.Helper()
		r := h.terminal(id)
		if fin, ok := r.Data.(*lifecycle.Finished); !ok || !strings.Contains(fin.StdoutTail, "BREACH") {
			t.Errorf("without the layer the attack should work: %+v", r.Data)
		}
	}
	for _, c := range []struct {
		name, script string
		env          map[string]string
	}{
		{"socket families", attackSocketFamilies, nil},
		{"pidfd", attackPidfd, nil},
		{"keyrings", attackKeyring, nil},
		{"user namespace", attackNewUserNS, nil},
		{"kernel settings", attackProcSys, nil},
		{"abstract socket", attackAbstract, map[string]string{"SOCK": sock}},
	} {
		t.Run(c.name, func(t *testing.T) {
			name := "more-control-" + strings.ReplaceAll(c.name, " ", "-")
			h.define(subagent.Definition{Name: name, Runtime: subagent.RuntimeExec, Command: []string{"/bin/sh", "-c", c.script}, Timeout: "60s",
				Sandbox: subagent.Sandbox{Mode: subagent.SandboxOff}, EnvAllow: slices.Collect(maps.Keys(c.env))})
			breaches(t, h.dispatch(lifecycle.Request{Subagent: name, Input: json.RawMessage(`{}`), Env: c.env}))
		})
	}

	t.Run("the egress proxy without its address check", func(t *testing.T) {
		h2 := newHarness(t, provision.Config{})
		port, _ := url.Parse(h2.srv.URL)
		cfg := h2.workerConfig()
		cfg.SandboxUID = 0
		svc := h2.startWorker(cfg, worker.Deps{Egress: egress.Config{AllowPrivate: true}})
		requireSandbox(t, svc, "namespaces")
		h2.define(subagent.Definition{Name: "more-control-proxy", Runtime: subagent.RuntimeExec, Command: []string{"/bin/sh", "-c", attackProxyLoopback}, Timeout: "60s",
			Sandbox: subagent.Sandbox{Network: subagent.Network{Allow: []string{"localhost:" + port.Port(), "127.0.0.1:" + port.Port()}}}})
		id := h2.dispatch(lifecycle.Request{Subagent: "more-control-proxy", Input: json.RawMessage(`{}`), Env: map[string]string{"PORT": port.Port()}})
		r := h2.terminal(id)
		if fin, ok := r.Data.(*lifecycle.Finished); !ok || !strings.Contains(fin.StdoutTail, "BREACH") {
			t.Errorf("without the address check the proxy should reach the NATS port: %+v", r.Data)
		}
	})
	_ = natsURL

	t.Run("a daemon outside the box", func(t *testing.T) {
		mark := lifecycle.NewID()
		cmd := exec.Command("/bin/sh", "-c", attackSurvive)
		cmd.Env = append(os.Environ(), "MARK="+mark)
		if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "DAEMON UP") {
			t.Fatalf("%v: %s", err, out)
		}
		pids := proclist.WithMarker("agora-survivor-" + mark)
		for _, p := range pids {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
		if len(pids) == 0 {
			t.Error("the daemon did not outlive its parent outside the box")
		}
	})

	t.Run("TIOCSTI on a terminal", func(t *testing.T) {
		ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR, 0)
		if err != nil {
			t.Skipf("no terminal to test with: %v", err)
		}
		defer ptmx.Close()
		if err := unix.IoctlSetPointerInt(int(ptmx.Fd()), unix.TIOCSPTLCK, 0); err != nil {
			t.Fatal(err)
		}
		n, err := unix.IoctlGetInt(int(ptmx.Fd()), unix.TIOCGPTN)
		if err != nil {
			t.Fatal(err)
		}
		pts, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer pts.Close()
		cmd := exec.Command("/bin/sh", "-c", attackTIOCSTI)
		cmd.Stdin = pts
		if out, err := cmd.Output(); err != nil || !strings.Contains(string(out), "BREACH") {
			t.Errorf("TIOCSTI on a terminal should work: %v %q", err, out)
		}
	})
}

// runMore runs each case as an exec sub-agent named prefix-<i> and checks
// that its attack failed and the dispatch ended with one terminal event.
func (h *harness) runMore(t *testing.T, svc *worker.Service, prefix string, cases []moreCase) {
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.need != "" && svc != nil {
				requireSandbox(t, svc, c.need)
			}
			name := fmt.Sprintf("%s-%d", prefix, i)
			h.define(subagent.Definition{Name: name, Runtime: subagent.RuntimeExec, Command: []string{"/bin/sh", "-c", c.script}, Timeout: "60s", Sandbox: c.box})
			id := h.dispatch(lifecycle.Request{Subagent: name, Input: json.RawMessage(`{}`), Env: c.env})
			r := h.terminal(id)
			h.assertOneTerminal(id)
			if c.check != nil {
				c.check(t, id, r)
			}
			if fin, ok := r.Data.(*lifecycle.Finished); ok {
				if strings.Contains(fin.StdoutTail, "BREACH") || !c.finish {
					t.Fatalf("the attack worked: finished, stdout %q", fin.StdoutTail)
				}
				return
			}
			f, ok := r.Data.(*lifecycle.Failed)
			if !ok {
				t.Fatalf("terminal = %T %+v, want failed", r.Data, r.Data)
			}
			if strings.Contains(f.Detail, "BREACH") {
				t.Fatalf("the attack worked: %s", f.Detail)
			}
			switch {
			case c.finish:
				t.Errorf("failed %s (%s), want finished", f.Reason, f.Detail)
			case c.reason != "" && f.Reason != c.reason:
				t.Errorf("failed %s (%s), want %s", f.Reason, f.Detail, c.reason)
			case c.reason == "" && f.Reason != lifecycle.ReasonProviderFailed && f.Reason != lifecycle.ReasonLimitExceeded:
				t.Errorf("failed %s (%s), want the sub-agent's own failure", f.Reason, f.Detail)
			}
		})
	}
}

// TestHostileSubagentsMoreNonRootWorker makes attacks through a worker
// process of uid nobody (hostile_nonroot_test.go): it may not make
// cgroups, so only the launcher's own layers bound its runs.
func TestHostileSubagentsMoreNonRootWorker(t *testing.T) {
	requireRootForNobody(t)
	h := newHarness(t, provision.Config{})
	w := h.startUnprivilegedWorker("AGORA_WORKSPACE_ROOT="+nobodysDir(t), "AGORA_TEST_WORKER_SECRET="+workerSecret)
	if w.isolation != "namespaces" {
		msg := fmt.Sprintf("the unprivileged worker's isolation is %q, not namespaces; start-up line: %s", w.isolation, w.line)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	mark := lifecycle.NewID()
	cases := []moreCase{
		{name: "more processes than limits.processes", box: subagent.Sandbox{Limits: subagent.Limits{Processes: 32}}, script: attackProcesses},
		{name: "inode flood of /dev/shm", script: attackShmInodes},
		{name: "socket families past the seccomp allow-list", script: attackSocketFamilies},
		{name: "signal the launcher through a pidfd", script: attackPidfd},
		{name: "write kernel settings and leave the run's cgroup", script: attackProcSys},
		{name: "a user namespace through raw clone, clone3 and int 0x80", script: attackNewUserNS},
		{name: "a daemon that outlives the run", script: attackSurvive, env: map[string]string{"MARK": mark}, finish: true,
			check: func(t *testing.T, _ string, r recorded) {
				if fin, ok := r.Data.(*lifecycle.Finished); !ok || !strings.Contains(fin.StdoutTail, "DAEMON UP") {
					t.Fatalf("the daemon never ran: %+v", r.Data)
				}
				assertNoProcess(t, "agora-survivor-"+mark)
			}},
	}
	cases = append(cases, hostLinkCase(t))
	h.runMore(t, nil, "more-nonroot", cases)
	w.alive(t)
}
