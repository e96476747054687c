package svc_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
	nc, err := svc.Connect("test", "1", srv.URL, creds)
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
	_, err := svc.Connect("test", "1", "nats://127.0.0.1:1", p)
	if err == nil || !strings.Contains(err.Error(), "AGORA_NATS_CREDS") {
		t.Fatalf("err = %v, want one naming AGORA_NATS_CREDS", err)
	}
}
