package main_test

import (
	"net"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
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
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	var line string
	for deadline := time.Now().Add(60 * time.Second); line == ""; {
		for _, l := range strings.Split(stderr.String(), "\n") {
			if strings.Contains(l, "export AGORA_NATS_URL=") {
				line = l
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no banner:\n%s", stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
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
