package sandbox_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/internal/proclist"

	"github.com/agora-dispatch/agora/internal/sandbox"
	"github.com/agora-dispatch/agora/internal/sandbox/launcher"
	"github.com/agora-dispatch/agora/internal/testkit"
)

// A test binary started with this variable acts as a worker: it runs the
// command in its arguments through the launcher and never returns on its
// own, so the test can kill it.
const workerEnv = "AGORA_SANDBOX_TEST_WORKER"

func TestMain(m *testing.M) {
	if os.Getenv(workerEnv) == "1" {
		l, err := sandbox.NewMode(sandbox.Options{Bin: os.Getenv(workerEnv + "_BIN")}, sandbox.Mode(os.Getenv(workerEnv+"_MODE")))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(3)
		}
		args := os.Args[1:]
		l.Run(context.Background(), sandbox.Spec{Path: args[0], Args: args, Env: []string{"PATH=/usr/bin:/bin"}, Dir: "/", Stdout: os.Stdout, Stderr: os.Stderr, KillGrace: time.Second})
		select {}
	}
	os.Exit(m.Run())
}

var modes = []sandbox.Mode{sandbox.ModeNamespaces, sandbox.ModePIDNamespace, sandbox.ModeSubreaper}

// smallLauncher builds cmd/agora-sandbox once per test binary.
var smallLauncher = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "agora-sandbox-test")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "agora-sandbox")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/agora-dispatch/agora/cmd/agora-sandbox").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("build agora-sandbox: %v\n%s", err, out)
	}
	return bin, nil
})

// eachMode runs f once per containment mode and launcher binary (this test
// binary re-executed, and the separate agora-sandbox); a mode the host
// lacks skips locally and fails under CI=true.
func eachMode(t *testing.T, f func(t *testing.T, l *sandbox.Launcher)) {
	small, err := smallLauncher()
	if err != nil {
		t.Fatal(err)
	}
	for _, bin := range []string{"/proc/self/exe", small} {
		for _, m := range modes {
			t.Run(string(m)+"/"+filepath.Base(bin), func(t *testing.T) {
				l, err := sandbox.NewMode(sandbox.Options{Bin: bin}, m)
				if err != nil {
					if os.Getenv("CI") == "true" {
						t.Fatal(err)
					}
					t.Skip(err)
				}
				defer l.Close()
				f(t, l)
			})
		}
	}
}

func TestNewPicksAMode(t *testing.T) {
	l, err := sandbox.New(sandbox.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if l.Mode() != sandbox.ModeNamespaces && l.Mode() != sandbox.ModePIDNamespace && l.Mode() != sandbox.ModeSubreaper {
		t.Fatalf("mode %q", l.Mode())
	}
}

// runDir is a fresh working directory the launcher's runs can use: under
// ModeNamespaces a root worker's run is an unprivileged host user, so the
// directory is given to it and its parent made traversable.
func runDir(t *testing.T, l *sandbox.Launcher) string {
	t.Helper()
	dir := t.TempDir()
	if uid := l.Host().RunUID; uid != 0 && uid != os.Geteuid() {
		if err := os.Chmod(filepath.Dir(dir), 0o711); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(dir, uid, uid); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// A zombie is dead for our purposes.
	f := strings.Fields(string(b))
	return len(f) > 2 && f[2] != "Z"
}

func waitGone(t *testing.T, pid int) {
	t.Helper()
	testkit.Eventually(t, 5*time.Second, fmt.Sprintf("process %d to end with its run", pid), func() bool { return !alive(pid) })
}

// hostPID finds the host pid of a process by a unique marker in its argv
// (inside a PID namespace the runtime only knows its namespace pid).
func hostPID(t *testing.T, marker string) int {
	t.Helper()
	var pids []int
	testkit.Eventually(t, 5*time.Second, "a process with marker "+marker, func() bool {
		pids = proclist.WithMarker(marker)
		return len(pids) > 0
	})
	return pids[0]
}

func TestRunExitCodeAndOutput(t *testing.T) {
	eachMode(t, func(t *testing.T, l *sandbox.Launcher) {
		var out, errb bytes.Buffer
		res := l.Run(t.Context(), sandbox.Spec{Path: "/bin/sh", Args: []string{"sh", "-c", "echo out; echo err >&2; exit 7"}, Dir: runDir(t, l), Stdout: &out, Stderr: &errb, KillGrace: time.Second})
		if res.Err != nil || res.ExitCode != 7 {
			t.Fatalf("result %+v, want exit 7", res)
		}
		if out.String() != "out\n" || errb.String() != "err\n" {
			t.Fatalf("stdout %q stderr %q", out.String(), errb.String())
		}
	})
}

func TestRunEnvAndDir(t *testing.T) {
	eachMode(t, func(t *testing.T, l *sandbox.Launcher) {
		dir := runDir(t, l)
		var out bytes.Buffer
		res := l.Run(t.Context(), sandbox.Spec{Path: "/bin/sh", Args: []string{"sh", "-c", "pwd; env | sort; ls /proc/self/fd"}, Env: []string{"ONLY=this"}, Dir: dir, Stdout: &out, KillGrace: time.Second})
		if res.Err != nil || res.ExitCode != 0 {
			t.Fatalf("result %+v", res)
		}
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		if lines[0] != dir {
			t.Errorf("cwd %q, want %q", lines[0], dir)
		}
		if !strings.Contains(out.String(), "ONLY=this") || strings.Contains(out.String(), workerEnv) {
			t.Errorf("environment not exactly the spec's:\n%s", out.String())
		}
		// Only stdin, stdout, stderr and ls's own directory handle: nothing of
		// the worker or the launcher leaks in.
		var fds []string
		for _, l := range lines {
			if _, err := strconv.Atoi(l); err == nil {
				fds = append(fds, l)
			}
		}
		if len(fds) > 4 {
			t.Errorf("runtime inherited descriptors %v, want 0 1 2 (+ ls's own)", fds)
		}
	})
}

func TestRunStartError(t *testing.T) {
	eachMode(t, func(t *testing.T, l *sandbox.Launcher) {
		dir := runDir(t, l)
		if err := os.WriteFile(dir+"/notexec", []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		res := l.Run(t.Context(), sandbox.Spec{Path: dir + "/notexec", Args: []string{"notexec"}, Dir: dir, KillGrace: time.Second})
		if res.Err == nil || res.ExitCode != -1 {
			t.Fatalf("result %+v, want a start error", res)
		}
	})
}

func TestRunNoNewPrivs(t *testing.T) {
	eachMode(t, func(t *testing.T, l *sandbox.Launcher) {
		var out bytes.Buffer
		res := l.Run(t.Context(), sandbox.Spec{Path: "/bin/sh", Args: []string{"sh", "-c", "grep NoNewPrivs /proc/self/status"}, Dir: runDir(t, l), Stdout: &out, KillGrace: time.Second})
		if res.ExitCode != 0 || !strings.Contains(out.String(), "NoNewPrivs:\t1") {
			t.Fatalf("result %+v, status %q: want no_new_privs set", res, out.String())
		}
	})
}

// Markers are built inside the scripts ("$m"-d) so that only the process
// that carries one has it in its command line, not its parents.

// A daemonised grandchild (its own session, re-parented away from the
// runtime) does not outlive the run.
func TestRunKillsDaemonisedGrandchild(t *testing.T) {
	eachMode(t, func(t *testing.T, l *sandbox.Launcher) {
		marker := fmt.Sprintf("%d.%d", os.Getpid(), time.Now().UnixNano())
		script := fmt.Sprintf("m=%s; setsid sh -c 'sleep 300; :' \"$m\"-d >/dev/null 2>&1 < /dev/null & sleep 0.3; exit 0", marker)
		done := make(chan sandbox.Result, 1)
		go func() {
			done <- l.Run(t.Context(), sandbox.Spec{Path: "/bin/sh", Args: []string{"sh", "-c", script}, Dir: runDir(t, l), KillGrace: time.Second})
		}()
		pid := hostPID(t, marker+"-d")
		res := <-done
		if res.ExitCode != 0 || res.Err != nil {
			t.Fatalf("result %+v", res)
		}
		if res.Killed < 1 {
			t.Errorf("launcher reports %d processes killed, want at least the daemon", res.Killed)
		}
		waitGone(t, pid)
	})
}

// Cancelling the run stops the runtime with SIGTERM, and the whole tree is
// killed after the grace period when it ignores it.
func TestRunCancelKillsTree(t *testing.T) {
	eachMode(t, func(t *testing.T, l *sandbox.Launcher) {
		marker := fmt.Sprintf("cancel-%d", time.Now().UnixNano())
		ctx, cancel := context.WithCancel(t.Context())
		script := fmt.Sprintf("m=%s; trap '' TERM; setsid sh -c 'trap \"\" TERM; sleep 300; :' \"$m\"-d & sleep 300", marker)
		done := make(chan sandbox.Result, 1)
		go func() {
			done <- l.Run(ctx, sandbox.Spec{Path: "/bin/sh", Args: []string{"sh", "-c", script}, Dir: runDir(t, l), KillGrace: 300 * time.Millisecond})
		}()
		pid := hostPID(t, marker+"-d")
		start := time.Now()
		cancel()
		select {
		case res := <-done:
			if res.ExitCode != -1 || res.Signal != "SIGKILL" {
				t.Errorf("result %+v, want killed by SIGKILL", res)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Run did not return after cancel")
		}
		if d := time.Since(start); d < 300*time.Millisecond {
			t.Errorf("killed after %s, before the grace period", d)
		}
		waitGone(t, pid)
	})
}

// The worker is SIGKILLed mid-run: the runtime and a daemonised grandchild
// die with it.
func TestWorkerKilledTakesTreeWithIt(t *testing.T) {
	eachMode(t, func(t *testing.T, l *sandbox.Launcher) {
		marker := fmt.Sprintf("orphan-%d", time.Now().UnixNano())
		script := fmt.Sprintf("m=%s; setsid sh -c 'sleep 300; :' \"$m\"-daemon >/dev/null 2>&1 </dev/null & echo ready; exec sh -c 'sleep 300; :' \"$m\"-runtime", marker)
		cmd := exec.Command(os.Args[0], "/bin/sh", "-c", script)
		cmd.Env = append(os.Environ(), workerEnv+"=1", workerEnv+"_MODE="+string(l.Mode()), workerEnv+"_BIN="+l.Executable())
		stdout, _ := cmd.StdoutPipe()
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		line, err := bufio.NewReader(stdout).ReadString('\n')
		if err != nil || line != "ready\n" {
			t.Fatalf("worker said %q, %v", line, err)
		}
		daemon, runtime := hostPID(t, marker+"-daemon"), hostPID(t, marker+"-runtime")
		// The run made the worker start spare launchers: they go too.
		spares := waitSpares(t, cmd.Process.Pid, 1)
		spawner := spawners(cmd.Process.Pid)
		if l.Mode() == sandbox.ModeNamespaces && len(spawner) != 1 {
			t.Fatalf("the worker's spawners: %v, want one", spawner)
		}
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()
		waitGone(t, runtime)
		waitGone(t, daemon)
		for _, p := range append(spares, spawner...) {
			waitGone(t, p)
		}
	})
}

// spareLaunchers lists the launchers of the worker pid that wait for
// their run (argv exactly Name, Protocol): its children, or its spawner's.
func spareLaunchers(pid int) []int {
	var out []int
	for _, c := range children(pid) {
		if isProc(c, launcher.Name) {
			out = append(out, c)
		}
	}
	for _, sp := range spawners(pid) {
		for _, c := range children(sp) {
			if isProc(c, launcher.Name) {
				out = append(out, c)
			}
		}
	}
	return out
}

// spawnerOf returns the spawner whose children the spares are: one, a
// child of this process.
func spawnerOf(t *testing.T, spares []int) int {
	t.Helper()
	sp := parentOf(spares[0])
	if !isProc(sp, launcher.SpawnerName) || parentOf(sp) != os.Getpid() {
		t.Fatalf("spare %d's parent %d is not a spawner of this process", spares[0], sp)
	}
	for _, p := range spares[1:] {
		if q := parentOf(p); q != sp {
			t.Errorf("spare %d's parent is %d, not the spawner %d", p, q, sp)
		}
	}
	return sp
}

// parentOf returns the parent of pid, 0 if it cannot be read.
func parentOf(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// spawners lists the children of pid that are spawners.
func spawners(pid int) []int {
	var out []int
	for _, c := range children(pid) {
		if isProc(c, launcher.SpawnerName) {
			out = append(out, c)
		}
	}
	return out
}

// children lists the children of pid.
func children(pid int) []int {
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	var out []int
	for _, task := range tasks {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, task.Name()))
		for _, f := range strings.Fields(string(b)) {
			c, _ := strconv.Atoi(f)
			out = append(out, c)
		}
	}
	return out
}

// isProc reports whether pid lives with argv exactly name, Protocol.
func isProc(pid int, name string) bool {
	argv, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return string(argv) == name+"\x00"+launcher.Protocol+"\x00" && alive(pid)
}

// waitSpares waits until pid has at least n spare launchers and returns
// them.
func waitSpares(t *testing.T, pid, n int) []int {
	t.Helper()
	var s []int
	testkit.Eventually(t, 5*time.Second, fmt.Sprintf("process %d to have at least %d spare launchers", pid, n), func() bool {
		s = spareLaunchers(pid)
		return len(s) >= n
	})
	return s
}

// readyWriter is a testkit.Buffer that signals ready at the first write.
type readyWriter struct {
	testkit.Buffer
	once  sync.Once
	ready chan struct{}
}

func newReadyWriter() *readyWriter { return &readyWriter{ready: make(chan struct{})} }

func (w *readyWriter) Write(p []byte) (int, error) {
	w.once.Do(func() { close(w.ready) })
	return w.Buffer.Write(p)
}

// startRun runs script in the background and waits for its first output.
func startRun(t *testing.T, l *sandbox.Launcher, script string) (*readyWriter, <-chan sandbox.Result) {
	t.Helper()
	out := newReadyWriter()
	done := make(chan sandbox.Result, 1)
	go func() {
		done <- l.Run(t.Context(), sandbox.Spec{Path: "/bin/sh", Args: []string{"sh", "-c", script}, Dir: "/", Stdout: out, KillGrace: time.Second})
	}()
	select {
	case <-out.ready:
	case res := <-done:
		t.Fatalf("the run ended before it said anything: %+v", res)
	case <-time.After(10 * time.Second):
		t.Fatal("the run said nothing within 10s")
	}
	return out, done
}

// Spawner starts the spawner where the mode's launchers need a user
// namespace, and only there; the worker calls it at start to log a host
// where none can start.
func TestSpawnerStartsOnRequest(t *testing.T) {
	eachMode(t, func(t *testing.T, l *sandbox.Launcher) {
		before := spawners(os.Getpid())
		if err := l.Spawner(); err != nil {
			t.Fatalf("Spawner: %v", err)
		}
		var started []int
		for _, p := range spawners(os.Getpid()) {
			if !slices.Contains(before, p) {
				started = append(started, p)
			}
		}
		want := 0
		if l.Mode() == sandbox.ModeNamespaces || l.Mode() == sandbox.ModePIDNamespace && os.Geteuid() != 0 {
			want = 1
		}
		if len(started) != want {
			t.Fatalf("mode %s: Spawner started %v, want %d", l.Mode(), started, want)
		}
		if err := l.Spawner(); err != nil {
			t.Fatalf("Spawner again: %v", err)
		}
		if after := spawners(os.Getpid()); len(after) != len(before)+want {
			t.Errorf("a second call started another: %v before, %v after", before, after)
		}
	})
}

// Close while a run lasts keeps the spawner until the run has ended: the
// run ends as it would have (the spawner's death would take its launcher).
func TestSpawnerOutlivesCloseWhileARunLasts(t *testing.T) {
	eachMode(t, func(t *testing.T, l *sandbox.Launcher) {
		if l.Mode() != sandbox.ModeNamespaces {
			return
		}
		// The runtime outlasts Close by its own sleep.
		out, done := startRun(t, l, "echo ready; sleep 2; echo done")
		l.Close()
		select {
		case res := <-done:
			if res.Err != nil || res.ExitCode != 0 || out.String() != "ready\ndone\n" {
				t.Fatalf("result %+v, output %q", res, out.String())
			}
		case <-time.After(20 * time.Second):
			t.Fatal("the run did not end")
		}
	})
}

// A spawner killed from outside takes its launchers with it: a run in
// progress fails at once (no report) instead of hanging; the runs after it
// still work, their launchers forked by the worker itself.
func TestSpawnerKilled(t *testing.T) {
	eachMode(t, func(t *testing.T, l *sandbox.Launcher) {
		if l.Mode() != sandbox.ModeNamespaces {
			return
		}
		run := func() {
			t.Helper()
			var out bytes.Buffer
			res := l.Run(t.Context(), sandbox.Spec{Path: "/bin/sh", Args: []string{"sh", "-c", "echo ok"}, Dir: "/", Stdout: &out, KillGrace: time.Second})
			if res.Err != nil || res.ExitCode != 0 || out.String() != "ok\n" {
				t.Fatalf("result %+v, output %q", res, out.String())
			}
		}
		run()
		spares := waitSpares(t, os.Getpid(), 1)
		sp := spawnerOf(t, spares)
		_, done := startRun(t, l, "echo ready; exec sleep 300")
		if err := syscall.Kill(sp, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		select {
		case res := <-done:
			if res.Err == nil || !errors.Is(res.Err, sandbox.ErrLauncher) {
				t.Fatalf("the run whose spawner died: %+v, want a launcher failure", res)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("the run whose spawner died did not end")
		}
		for _, p := range append(spares, sp) {
			waitGone(t, p)
		}
		run()
		run()
		// The spares now wait as the worker's own children.
		testkit.Eventually(t, 5*time.Second, "spares forked by the worker", func() bool {
			for _, c := range children(os.Getpid()) {
				if isProc(c, launcher.Name) {
					return true
				}
			}
			return false
		})
	})
}

// A run starts spare launchers; a later run works when its spare was
// killed while it waited; Close ends the spares, and runs still work
// after it.
func TestSpareLaunchers(t *testing.T) {
	eachMode(t, func(t *testing.T, l *sandbox.Launcher) {
		if s := spareLaunchers(os.Getpid()); len(s) != 0 {
			// Other tests' launchers are closed by now (eachMode).
			t.Fatalf("spare launchers %v before the first run", s)
		}
		run := func() {
			t.Helper()
			var out bytes.Buffer
			res := l.Run(t.Context(), sandbox.Spec{Path: "/bin/sh", Args: []string{"sh", "-c", "echo \"$X\"; pwd"}, Env: []string{"X=one\ntwo"}, Dir: "/tmp", Stdout: &out, KillGrace: time.Second})
			if res.Err != nil || res.ExitCode != 0 || out.String() != "one\ntwo\n/tmp\n" {
				t.Fatalf("result %+v, output %q", res, out.String())
			}
		}
		run()
		spares := waitSpares(t, os.Getpid(), 2)
		sp := 0 // this Launcher's spawner, where it has one
		if l.Mode() == sandbox.ModeNamespaces {
			// Launchers that start in a user namespace are the
			// spawner's children, not the worker's (docs/sandbox.md,
			// "The spawner").
			sp = spawnerOf(t, spares)
			// The spawner's socket to the worker reaches no launcher.
			sock, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/3", sp))
			if err != nil || !strings.HasPrefix(sock, "socket:") {
				t.Fatalf("the spawner's fd 3 is %q (%v), want its socket", sock, err)
			}
			for _, p := range spares {
				fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", p))
				for _, fd := range fds {
					if l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", p, fd.Name())); l == sock {
						t.Errorf("spare %d holds the spawner's socket as fd %s", p, fd.Name())
					}
				}
			}
		}
		// Nothing of the worker's environment reaches a launcher.
		for _, p := range spares {
			if env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", p)); err != nil || string(env) != "GOMAXPROCS=1\x00" {
				t.Errorf("spare %d has the environment %q (%v), want GOMAXPROCS=1 alone", p, env, err)
			}
		}
		for _, p := range spares {
			_ = syscall.Kill(p, syscall.SIGKILL)
			waitGone(t, p)
		}
		run()
		run()
		waitSpares(t, os.Getpid(), 1)
		l.Close()
		noSpares := func() bool { return len(spareLaunchers(os.Getpid())) == 0 }
		testkit.Eventually(t, 5*time.Second, "Close to end the spare launchers", noSpares)
		run()
		// The run's own launcher exits just after its report; a spare
		// would stay.
		testkit.Eventually(t, 5*time.Second, "the run's own launcher to exit, leaving no spares after Close", noSpares)
		if sp != 0 {
			// The spawner goes once nothing it started is left.
			waitGone(t, sp)
		}
	})
}

// The Landlock rules hold for the runtime and what it starts, and the same
// script breaches them without the policy: writes and reads outside the
// allowed paths, and TCP connects to a port not listed.
// TestRunLandlock checks the Landlock layer alone, where the run shares
// the worker's user, root and network (the containment modes without a
// user namespace); ModeNamespaces is attacked in hostile_linux_test.go.
func TestRunLandlock(t *testing.T) {
	eachMode(t, func(t *testing.T, l *sandbox.Launcher) {
		if l.Mode() == sandbox.ModeNamespaces {
			return
		}
		if l.Host().LandlockABI < 1 {
			if os.Getenv("CI") == "true" {
				t.Fatal("no Landlock on this host")
			}
			t.Skip("no Landlock on this host")
		}
		ws, outside, readable := t.TempDir(), t.TempDir(), t.TempDir()
		if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("s3cret"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(readable, "note"), []byte("n0te"), 0o600); err != nil {
			t.Fatal(err)
		}
		port := testkit.Listen(t, "tcp", "127.0.0.1:0").Addr().(*net.TCPAddr).Port
		script := `
echo in > ok || echo "DENIED write ws"
sh -c 'echo x > "$OUT/dropped"' 2>/dev/null && echo "WROTE outside"
cat "$OUT/secret" 2>/dev/null && echo " READ outside"
cat "$NOTE" 2>/dev/null || echo "DENIED note"
bash -c 'exec 3<>/dev/tcp/127.0.0.1/'"$PORT" 2>/dev/null && echo "CONNECTED"
exit 0`
		run := func(pol sandbox.Policy) string {
			t.Helper()
			var out bytes.Buffer
			res := l.Run(t.Context(), sandbox.Spec{Path: "/bin/sh", Args: []string{"sh", "-c", script}, Dir: ws, Stdout: &out, KillGrace: time.Second,
				Env: []string{"PATH=/usr/bin:/bin", "OUT=" + outside, "NOTE=" + filepath.Join(readable, "note"), "PORT=" + strconv.Itoa(port)}, Policy: pol})
			if res.Err != nil || res.ExitCode != 0 {
				t.Fatalf("result %+v, output %q", res, out.String())
			}
			return out.String()
		}
		open := run(sandbox.Policy{})
		for _, want := range []string{"WROTE outside", "s3cret READ outside", "n0te", "CONNECTED"} {
			if !strings.Contains(open, want) {
				t.Fatalf("without the policy the script should breach (%q missing): %q", want, open)
			}
		}
		if err := os.Remove(filepath.Join(outside, "dropped")); err != nil {
			t.Fatal(err)
		}
		pol := sandbox.Policy{Landlock: true, ReadDirs: []string{"/usr", "/bin", "/lib", "/lib64", "/etc"},
			WriteDirs: []string{ws}, ReadFiles: []string{filepath.Join(readable, "note")}, WriteFiles: []string{"/dev/null"}}
		got := run(pol)
		if strings.Contains(got, "WROTE") || strings.Contains(got, "s3cret") || strings.Contains(got, "DENIED") {
			t.Errorf("with the policy: %q, want no write or read outside and the workspace and the listed file usable", got)
		}
		if _, err := os.Stat(filepath.Join(outside, "dropped")); err == nil {
			t.Error("a file was written outside the allowed paths")
		}
		if !strings.Contains(got, "n0te") {
			t.Errorf("the listed file was not readable: %q", got)
		}
		if l.Host().LandlockABI >= 4 {
			if strings.Contains(got, "CONNECTED") {
				t.Errorf("connected to an unlisted port: %q", got)
			}
			pol.TCPConnect = []int{port}
			if got := run(pol); !strings.Contains(got, "CONNECTED") {
				t.Errorf("the listed port was refused: %q", got)
			}
		}
	})
}
