//go:build linux

package dispatcher_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/services/dispatcher"
)

// While the store's disk is full a dispatch is refused with a 503 that
// says JetStream confirmed no write, on the HTTP API and through the
// client within its default timeout; once the disk has room again (the
// embedded server reloads JetStream, docs/chaos.md "A full store") the
// same dispatch_id is accepted, and what was accepted before is all there.
func TestFullStoreRefusesDispatchesClearly(t *testing.T) {
	dir := testkit.SmallFS(t, "160m")
	srv := natstest.StartIn(t, filepath.Join(dir, "store"))
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := provision.Ensure(ctx, srv.JetStream(t), provision.Config{}); err != nil {
		t.Fatal(err)
	}
	h := newHarnessOn(t, srv, dispatcher.Config{})
	var body string
	before := h.dispatchMicro(lifecycle.Request{DispatchID: "full-before", Subagent: "planner"})

	filler := filepath.Join(dir, "filler")
	testkit.Fill(t, filler)
	// A stream takes writes its cache still holds; the first that fails
	// to reach the disk fails that stream's writes from then on.
	accepted := []string{before.DispatchID}
	var refused []byte
	for i := 0; refused == nil; i++ {
		if i == 200 {
			t.Fatal("200 dispatches accepted on a full disk")
		}
		id := fmt.Sprintf("full-%d", i)
		resp, data := h.do(http.MethodPost, "/v1/dispatches", fmt.Sprintf(`{"dispatch_id":%q,"subagent":"planner"}`, id), "")
		switch resp.StatusCode {
		case http.StatusCreated, http.StatusOK:
			accepted = append(accepted, id)
		case http.StatusServiceUnavailable:
			refused = data
			body = fmt.Sprintf(`{"dispatch_id":%q,"subagent":"planner"}`, id)
			accepted = append(accepted, id) // accepted below, once there is room
		default:
			t.Fatalf("POST %s with a full store: %d %s", id, resp.StatusCode, data)
		}
	}
	var p client.Problem
	_ = json.Unmarshal(refused, &p)
	if !strings.Contains(p.Detail, "JetStream did not confirm a write in time: a store whose disk is full") {
		t.Fatalf("the refusal with a full store: %s", refused)
	}
	t.Logf("refused after %d accepted: %s", len(accepted)-2, p.Detail)
	_, err := h.cl.Dispatch(t.Context(), lifecycle.Request{DispatchID: "full-client", Subagent: "planner"})
	if err == nil || !strings.Contains(err.Error(), "a store whose disk is full") {
		t.Fatalf("client Dispatch with a full store: %v, want the 503 naming the store within the client's timeout", err)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 60*time.Second, "the same dispatch accepted once the store has room", func() bool {
		resp, _ := h.do(http.MethodPost, "/v1/dispatches", body, "")
		return resp.StatusCode == http.StatusCreated || resp.StatusCode == http.StatusOK
	})
	for _, id := range accepted {
		st, err := h.cl.Status(t.Context(), id)
		if err != nil || st.Status != lifecycle.KindAccepted {
			t.Errorf("status of %s after the store recovered: %+v, %v", id, st, err)
		}
	}
}
