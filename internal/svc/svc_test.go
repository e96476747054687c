package svc_test

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/internal/testkit"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/svc"
)

func credsFile(t *testing.T) string {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	// The JWT is only carried here: the test server does not check it.
	content := fmt.Sprintf("-----BEGIN NATS USER JWT-----\neyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ.e30.c2ln\n------END NATS USER JWT------\n\n-----BEGIN USER NKEY SEED-----\n%s\n------END USER NKEY SEED------\n", seed)
	p := filepath.Join(t.TempDir(), "svc.creds")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// The credentials file is read once: after it is gone, a reconnect still
// works, so nothing started later needs it readable.
func TestCredentialsReadOnce(t *testing.T) {
	srv := natstest.Start(t)
	creds := credsFile(t)
	nc, err := svc.Connect("test", "1", srv.URL, creds, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := os.Remove(creds); err != nil {
		t.Fatal(err)
	}
	srv.Restart(t)
	deadline := time.Now().Add(10 * time.Second)
	for nc.Status() != nats.CONNECTED || nc.Flush() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("no reconnect after the credentials file was removed: %v, %v", nc.Status(), nc.LastError())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestCredentialsBadFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "bad.creds")
	if err := os.WriteFile(p, []byte("not credentials"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := svc.Connect("test", "1", "nats://127.0.0.1:1", p, nil)
	if err == nil || !strings.Contains(err.Error(), "AGORA_NATS_CREDS") {
		t.Fatalf("err = %v, want one naming AGORA_NATS_CREDS", err)
	}
}

func waitFor(t *testing.T, logs *testkit.Buffer, want string) {
	t.Helper()
	testkit.Eventually(t, 15*time.Second, "the log to say "+want, func() bool { return strings.Contains(logs.String(), want) })
}

// A disconnect and the reconnect after it are logged.
func TestConnectLogsDisconnectAndReconnect(t *testing.T) {
	srv := natstest.Start(t)
	logs := &testkit.Buffer{}
	nc, err := svc.Connect("test", "1", srv.URL, "", slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	srv.Restart(t)
	waitFor(t, logs, "nats disconnected")
	waitFor(t, logs, "nats reconnected")
}

// A permission violation, which a client otherwise sees only as a
// timeout, is logged as one.
func TestConnectLogsPermissionViolation(t *testing.T) {
	opts := &server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
		Users: []*server.User{{Username: "svc", Password: "pw", Permissions: &server.Permissions{
			Publish: &server.SubjectPermission{Allow: []string{"allowed.>"}}}}}}
	s := natstest.StartOptions(t, opts)
	logs := &testkit.Buffer{}
	url := strings.Replace(s.ClientURL(), "nats://", "nats://svc:pw@", 1)
	nc, err := svc.Connect("test", "1", url, "", slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := nc.Publish("forbidden.subject", []byte("x")); err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
	waitFor(t, logs, "permission violation")
}

// Conn keeps a given connection the caller's and opens one of the
// service's own otherwise.
func TestConn(t *testing.T) {
	srv := natstest.Start(t)
	given := srv.Conn(t)
	nc, own, err := svc.Conn(given, "test", "1", "nats://127.0.0.1:1", "", nil)
	if err != nil || nc != given || own {
		t.Fatalf("Conn(given) = %p, %v, %v; want the given connection, not owned", nc, own, err)
	}
	nc, own, err = svc.Conn(nil, "test", "1", srv.URL, "", nil)
	if err != nil || nc == nil || !own {
		t.Fatalf("Conn(nil) = %p, %v, %v; want a connection of its own", nc, own, err)
	}
	nc.Close()
	if _, own, err = svc.Conn(nil, "test", "1", "nats://127.0.0.1:1", "", nil); err == nil || own {
		t.Fatalf("Conn(nil) to no server: own %v, err %v; want an error", own, err)
	}
}

// AGORA_NATS_INBOX_PREFIX sets where a service's replies come; a value
// that is no subject prefix is refused, naming the setting.
func TestConnectInboxPrefix(t *testing.T) {
	srv := natstest.Start(t)
	t.Setenv(svc.InboxPrefixVar, "_INBOX_worker")
	nc, err := svc.Connect("test", "", srv.URL, "", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if in := nc.NewInbox(); !strings.HasPrefix(in, "_INBOX_worker.") {
		t.Errorf("inbox %q, want _INBOX_worker.…", in)
	}
	for _, bad := range []string{"_INBOX.>", "a..b", "_INBOX.", "a b", "*"} {
		t.Setenv(svc.InboxPrefixVar, bad)
		if nc, err := svc.Connect("test", "", srv.URL, "", slog.New(slog.DiscardHandler)); err == nil {
			nc.Close()
			t.Errorf("%s=%q connected", svc.InboxPrefixVar, bad)
		} else if !strings.Contains(err.Error(), svc.InboxPrefixVar) {
			t.Errorf("%q: error %v does not name the setting", bad, err)
		}
	}
}

// A server that takes the connection but is slow to answer (busy,
// restarting its JetStream) is tried again; one where nothing listens
// fails at once, naming the setting.
func TestConnectWaitsOutASlowServer(t *testing.T) {
	srv := natstest.Start(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	target := strings.TrimPrefix(srv.URL, "nats://")
	go func() {
		for n := 0; ; n++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if n == 0 {
				t.Cleanup(func() { c.Close() }) // held, never answered
				continue
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			go func() { _, _ = io.Copy(s, c); s.Close() }()
			go func() { _, _ = io.Copy(c, s); c.Close() }()
		}
	}()
	logs := &testkit.Buffer{}
	nc, err := svc.Connect("test", "1", "nats://"+ln.Addr().String(), "", slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatalf("a server slow to answer once: %v", err)
	}
	nc.Close()
	if !strings.Contains(logs.String(), "NATS is slow to answer: connecting again") {
		t.Errorf("the second try is not logged: %s", logs)
	}

	// Nothing listens there now.
	addr := ln.Addr().String()
	ln.Close()
	start := time.Now()
	_, err = svc.Connect("test", "1", "nats://"+addr, "", nil)
	if err == nil || !strings.Contains(err.Error(), "AGORA_NATS_URL") {
		t.Fatalf("nothing listening: %v, want an error naming AGORA_NATS_URL", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("nothing listening: failed after %s, want at once", d)
	}
}
