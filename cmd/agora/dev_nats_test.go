package main_test

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agora-dispatch/agora/internal/testkit"
)

// A bus other hosts can reach needs a token: without one, agora dev
// refuses to start and says what to set.
func TestDevRefusesOpenNATSListenerWithoutToken(t *testing.T) {
	for _, listen := range []string{"0.0.0.0:0", ":0", "[::]:0"} {
		r := agoraWith(t, cleanEnv(), "dev", "--memory", "--http", "127.0.0.1:0", "--nats-listen", listen)
		if r.code == 0 || !strings.Contains(r.stderr, "--nats-token") || !strings.Contains(r.stderr, "reachable from other hosts") {
			t.Errorf("--nats-listen %s without a token: %s", listen, r)
		}
	}
}

// With a token the bus refuses clients without it, and the URL the
// banner prints works for the CLI in another shell.
func TestDevNATSToken(t *testing.T) {
	port := freePort(t)
	cmd := exec.Command(agoraBin, "dev", "--memory", "--http", "127.0.0.1:0", "--nats-listen", "0.0.0.0:"+strconv.Itoa(port), "--nats-token", "generate", "--workers", "1")
	cmd.Env = cleanEnv()
	var stderr testkit.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line := waitOutputLine(t, &stderr, 60*time.Second, "export AGORA_NATS_URL=")
	m := regexp.MustCompile(`export AGORA_NATS_URL=(\S+)\)`).FindStringSubmatch(line)
	if m == nil || !strings.Contains(m[1], "@") {
		t.Fatalf("banner line %q does not carry the token URL", line)
	}
	tokenURL := strings.Replace(m[1], "0.0.0.0", "127.0.0.1", 1)
	plain := "nats://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	if nc, err := nats.Connect(plain, nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Fatal("a client without the token connected")
	}
	r := agoraWith(t, append(cleanEnv(), "AGORA_NATS_URL="+tokenURL), "dispatch", "demo", "--input", `{"task":"t"}`, "--round", "--json")
	// --round ends at the demo's question: exit code 4, needs_input.
	if r.code != 4 || !strings.Contains(r.stdout, "dev.agora.dispatch.needs_input") {
		t.Fatalf("dispatch with the token URL %s: %s", tokenURL, r)
	}
}

// A NATS port already in use is reported at once.
func TestDevNATSPortInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	start := time.Now()
	r := agoraWith(t, cleanEnv(), "dev", "--memory", "--http", "127.0.0.1:0", "--nats-listen", ln.Addr().String())
	if r.code == 0 || !strings.Contains(r.stderr, "not free") {
		t.Fatalf("port in use: %s", r)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("reported after %s, want at once", d)
	}
}

// Under `go run` the binary lives in a temporary build folder: agora dev
// registers the demo with a copy of it in its data folder instead, so the
// definition names a path that lasts (and reads well in `subagent get`).
func TestDevDemoFromGoRunBuild(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	exe := filepath.Join(root, "go-build123", "exe", "agora")
	if err := os.MkdirAll(filepath.Dir(exe), 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(agoraBin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(exe, b, 0o755); err != nil {
		t.Fatal(err)
	}
	natsAddr, httpAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t)), fmt.Sprintf("127.0.0.1:%d", freePort(t))
	cmd := exec.Command(exe, "dev", "--data", filepath.Join(root, ".agora", "data"), "--http", httpAddr, "--nats-listen", natsAddr)
	cmd.Dir = root
	cmd.Env = append(cleanEnv(), "AGORA_LOG_LEVEL=warn")
	runDevUntilHealthy(t, cmd, httpAddr)
	env := append(cleanEnv(), "AGORA_NATS_URL=nats://"+natsAddr)
	def := jsonLines(t, agoraWith(t, env, "subagent", "get", "demo", "--json").stdout)
	if len(def) != 1 {
		t.Fatalf("subagent get demo --json: %v", def)
	}
	command, _ := def[0]["command"].([]any)
	want := filepath.Join(root, ".agora", "bin", "agora")
	if len(command) != 2 || command[0] != want {
		t.Fatalf("demo command = %v, want [%s demo-agent]", command, want)
	}
	if r := agoraWith(t, env, "dispatch", "demo", "--input", `{"task":"x"}`, "--round"); r.code != 4 {
		t.Errorf("the demo from the copied binary did not ask: %s", r)
	}
}

// A bad log setting stops agora dev at start, naming the variable.
func TestDevRefusesBadLogSettings(t *testing.T) {
	t.Parallel()
	r := agoraWith(t, append(cleanEnv(), "AGORA_LOG_LEVEL=loud"), "dev", "--memory", "--http", "127.0.0.1:0", "--nats-listen", "127.0.0.1:-1")
	if r.code != 1 || !strings.Contains(r.stderr, "AGORA_LOG_LEVEL") {
		t.Errorf("agora dev with AGORA_LOG_LEVEL=loud: %s", r)
	}
}

// With AGORA_SLACK_SETTINGS, agora dev runs the Slack answerer and serves
// its interactivity on its own listener: an unsigned request is refused.
func TestDevMountsSlack(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	settings, err := filepath.Abs("../../answerers/slack/settings.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	natsAddr, httpAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t)), fmt.Sprintf("127.0.0.1:%d", freePort(t))
	cmd := exec.Command(agoraBin, "dev", "--memory", "--http", httpAddr, "--nats-listen", natsAddr)
	cmd.Dir = root
	cmd.Env = append(cleanEnv(), "AGORA_LOG_LEVEL=warn", "AGORA_SLACK_SETTINGS="+settings, "AGORA_SLACK_BOT_TOKEN=xoxb-test",
		"AGORA_SLACK_SIGNING_SECRET=test-secret", "AGORA_SLACK_API_URL=http://127.0.0.1:1/api/")
	log := runDevUntilHealthy(t, cmd, httpAddr)
	resp, err := http.Post("http://"+httpAddr+"/slack/interactions", "application/x-www-form-urlencoded", strings.NewReader("payload=%7B%7D"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("unsigned /slack/interactions: %s\n%s", resp.Status, log.String())
	}
}

// runDevUntilHealthy starts an agora dev command, stops it with SIGINT when
// the test ends, and waits until its /healthz at httpAddr answers 200. It
// returns the buffer that collects the command's output.
func runDevUntilHealthy(t *testing.T, cmd *exec.Cmd, httpAddr string) *testkit.Buffer {
	t.Helper()
	log := new(testkit.Buffer)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Signal(syscall.SIGINT); _ = cmd.Wait() })
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if resp, err := http.Get("http://" + httpAddr + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return log
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("agora dev did not start:\n%s", log.String())
		}
	}
}

// Bad AGORA_* settings of the services agora dev runs are all reported,
// each with its variable and value, before anything starts.
func TestDevReportsEveryBadSetting(t *testing.T) {
	env := append(cleanEnv(), "AGORA_WORKER_CONCURRENCY=abc", "AGORA_ROUTER_TICK=zz", "AGORA_MCP_WAIT_CAP=soon", "AGORA_RETENTION=7x")
	r := agoraWith(t, env, "dev", "--memory", "--http", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0")
	if r.code == 0 {
		t.Fatalf("agora dev started with bad settings: %s", r)
	}
	for _, want := range []string{`AGORA_WORKER_CONCURRENCY="abc"`, `AGORA_ROUTER_TICK="zz"`, `AGORA_MCP_WAIT_CAP="soon"`, `AGORA_RETENTION: "7x"`} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr lacks %s:\n%s", want, r.stderr)
		}
	}
	if strings.Contains(r.stderr, "--workers 0") {
		t.Errorf("a bad AGORA_WORKER_CONCURRENCY reported as --workers 0:\n%s", r.stderr)
	}
}
