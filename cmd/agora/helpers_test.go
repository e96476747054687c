package main_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/testkit"
)

// The CLI tests run the real agora binary, built once for the package,
// against one real `agora dev` process (in-memory store, free ports),
// started on first use and stopped when the tests end.
var (
	agoraBin string // the built binary
	tmpRoot  string

	devOnce sync.Once
	devErr  error
	dev     *devProcess
)

type devProcess struct {
	cmd     *exec.Cmd
	natsURL string
	httpURL string
	log     testkit.Buffer
	exited  chan struct{}
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var err error
	tmpRoot, err = os.MkdirTemp("", "agora-cli-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(tmpRoot)
	agoraBin = filepath.Join(tmpRoot, "agora")
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	build := exec.Command(goTool, "build", "-o", agoraBin, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build agora:", err)
		return 1
	}
	code := m.Run()
	if dev != nil {
		dev.stop()
		if code != 0 {
			fmt.Fprintf(os.Stderr, "--- agora dev log (tail) ---\n%s\n", tail(dev.log.String(), 8000))
		}
	}
	return code
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

// freePort returns a loopback port nothing listens on (for a moment).
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// testkit.Buffer is a bytes.Buffer safe for a writer goroutine and readers.

// devServer returns the shared `agora dev`, starting it on first use.
func devServer(t testing.TB) *devProcess {
	t.Helper()
	devOnce.Do(func() { dev, devErr = startDev() })
	if devErr != nil {
		t.Fatalf("agora dev: %v", devErr)
	}
	return dev
}

// healthz reads the dev server's /healthz: its status code and body.
func (d *devProcess) healthz(t testing.TB) (int, []byte) {
	t.Helper()
	resp, err := http.Get(d.httpURL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, body
}

func startDev() (*devProcess, error) {
	var ports [2]int
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ports[i] = l.Addr().(*net.TCPAddr).Port
		l.Close()
	}
	dir, err := os.MkdirTemp(tmpRoot, "dev-")
	if err != nil {
		return nil, err
	}
	natsAddr, httpAddr := fmt.Sprintf("127.0.0.1:%d", ports[0]), fmt.Sprintf("127.0.0.1:%d", ports[1])
	// The tests sharing this server run side by side and each answers its
	// own demo question: the demo asks every thread the same one, which
	// would be asked once (docs/router.md, "Ask once"). TestAskOnceEndToEnd runs
	// a server of its own with ask once on.
	routes := filepath.Join(dir, "routes.yaml")
	if err := os.WriteFile(routes, []byte("routes:\n  - name: human\n    coalesce: false\n"), 0o600); err != nil {
		return nil, err
	}
	d := &devProcess{natsURL: "nats://" + natsAddr, httpURL: "http://" + httpAddr, exited: make(chan struct{})}
	d.cmd = exec.Command(agoraBin, "dev", "--memory", "--http", httpAddr, "--nats-listen", natsAddr, "--workers", "4", "--router-config", routes)
	d.cmd.Dir = dir
	d.cmd.Env = append(cleanEnv(), "TMPDIR="+dir, "AGORA_WORKER_KILL_GRACE=1s", "AGORA_LOG_LEVEL=warn")
	d.cmd.Stdout, d.cmd.Stderr = &d.log, &d.log
	if err := d.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		_ = d.cmd.Wait()
		close(d.exited)
	}()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-d.exited:
			return nil, fmt.Errorf("exited early: %v\n%s", d.cmd.ProcessState, d.log.String())
		case <-time.After(100 * time.Millisecond):
		}
		resp, err := http.Get(d.httpURL + "/healthz")
		if err != nil {
			continue
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return d, nil
		}
	}
	d.stop()
	return nil, fmt.Errorf("/healthz did not answer within 60s\n%s", d.log.String())
}

// stop interrupts dev (it drains) and kills it when that takes too long.
func (d *devProcess) stop() {
	testkit.StopProcess(d.cmd.Process, syscall.SIGINT, d.exited, 15*time.Second)
}

// cleanEnv is the test's environment without AGORA_ settings.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "AGORA_") {
			env = append(env, kv)
		}
	}
	return env
}

// result is how an agora command ended.
type result struct {
	stdout, stderr string
	code           int
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\n--- stdout\n%s--- stderr\n%s", r.code, r.stdout, r.stderr)
}

// agoraEnv is the environment of the client commands: the shared dev
// server, its inbox, and a known user.
func agoraEnv(t testing.TB) []string {
	d := devServer(t)
	// No AGORA_INBOX_URL: the CLI learns the inbox URL agora dev announces.
	return append(cleanEnv(), "AGORA_NATS_URL="+d.natsURL, "USER=tester")
}

// agora runs the binary against the shared dev server and returns how it ended.
func agora(t testing.TB, args ...string) result {
	t.Helper()
	return agoraWith(t, agoraEnv(t), args...)
}

// agoraWith runs the binary with env, for at most a minute.
func agoraWith(t testing.TB, env []string, args ...string) result {
	t.Helper()
	return agoraWithin(t, time.Minute, env, args...)
}

// agoraWithin runs the binary with env, for at most limit.
func agoraWithin(t testing.TB, limit time.Duration, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, agoraBin, args...)
	cmd.Env = env
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	r := result{stdout: out.String(), stderr: errOut.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	case err != nil:
		t.Fatalf("agora %s: %v", strings.Join(args, " "), err)
	}
	if ctx.Err() != nil {
		t.Fatalf("agora %s: still running after %s\n%s", strings.Join(args, " "), limit, r)
	}
	return r
}

// mustAgora runs the binary and fails the test unless it exits 0.
func mustAgora(t testing.TB, args ...string) result {
	t.Helper()
	r := agora(t, args...)
	if r.code != 0 {
		t.Fatalf("agora %s: %s", strings.Join(args, " "), r)
	}
	return r
}

// background is an agora command running while the test goes on.
type background struct {
	cmd    *exec.Cmd
	lines  chan string // stdout, line by line
	stdout testkit.Buffer
	stderr testkit.Buffer
	done   chan struct{}
	err    error
}

// start runs the binary in the background; the test's end kills it.
func start(t testing.TB, args ...string) *background {
	t.Helper()
	b := &background{lines: make(chan string, 256), done: make(chan struct{})}
	b.cmd = exec.Command(agoraBin, args...)
	b.cmd.Env = agoraEnv(t)
	b.cmd.Stderr = &b.stderr
	pr, pw := io.Pipe()
	b.cmd.Stdout = pw
	if err := b.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			b.stdout.Write([]byte(sc.Text() + "\n"))
			select {
			case b.lines <- sc.Text():
			default:
			}
		}
		close(b.lines)
	}()
	go func() {
		b.err = b.cmd.Wait()
		pw.Close()
		// The last lines can still be in the scanner's buffer when the
		// copy into the pipe ends: done means all of stdout is in b.stdout.
		<-scanned
		close(b.done)
	}()
	t.Cleanup(func() {
		select {
		case <-b.done:
		default:
			_ = b.cmd.Process.Kill()
			<-b.done
		}
	})
	return b
}

// waitLine returns the first stdout line for which match is true.
func (b *background) waitLine(t testing.TB, timeout time.Duration, match func(string) bool) string {
	t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		select {
		case l, ok := <-b.lines:
			if !ok {
				<-b.done
				t.Fatalf("output ended without the line: %v\n--- stdout\n%s--- stderr\n%s", b.err, b.stdout.String(), b.stderr.String())
			}
			if match(l) {
				return l
			}
		case <-timer.C:
			t.Fatalf("no such line within %s\n--- stdout\n%s--- stderr\n%s", timeout, b.stdout.String(), b.stderr.String())
		}
	}
}

// wait waits for the command to end and returns its exit code.
func (b *background) wait(t testing.TB, timeout time.Duration) int {
	t.Helper()
	select {
	case <-b.done:
	case <-time.After(timeout):
		t.Fatalf("still running after %s\n--- stdout\n%s--- stderr\n%s", timeout, b.stdout.String(), b.stderr.String())
	}
	var ee *exec.ExitError
	if errors.As(b.err, &ee) {
		return ee.ExitCode()
	}
	if b.err != nil {
		t.Fatal(b.err)
	}
	return 0
}

// jsonLines parses every stdout line as a JSON object.
func jsonLines(t testing.TB, stdout string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimRight(stdout, "\n"), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("stdout line is not a JSON object: %v\n%s", err, l)
		}
		out = append(out, m)
	}
	return out
}

// writeFile writes a file in the test's temp dir and returns its path.
func writeFile(t testing.TB, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// jetStream connects to the dev server's NATS; the connection is closed
// when the test ends.
func (d *devProcess) jetStream(t testing.TB) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(d.natsURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// hasConsumer reports whether stream has a consumer on the subject filter
// (a follower's, say).
func hasConsumer(t testing.TB, js jetstream.JetStream, stream, filter string) bool {
	t.Helper()
	s, err := js.Stream(t.Context(), stream)
	if err != nil {
		t.Fatalf("stream %s: %v", stream, err)
	}
	found := false
	l := s.ListConsumers(t.Context())
	for info := range l.Info() {
		if info.Config.FilterSubject == filter || slices.Contains(info.Config.FilterSubjects, filter) {
			found = true
		}
	}
	if err := l.Err(); err != nil {
		t.Fatalf("list the consumers of %s: %v", stream, err)
	}
	return found
}

// waitOutputLine waits until out, a process's output, has a line that
// contains substr and returns the first such line. It fails the test,
// showing the output, when within passes first.
func waitOutputLine(t testing.TB, out *testkit.Buffer, within time.Duration, substr string) string {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		for _, l := range strings.Split(out.String(), "\n") {
			if strings.Contains(l, substr) {
				return l
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no line with %q within %s; output:\n%s", substr, within, out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
