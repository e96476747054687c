package bench

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/services/dispatcher"
	"github.com/agora-dispatch/agora/stack"
)

// statusDispatches is how many ended dispatches the status rows read, in
// turn.
const statusDispatches = 64

// statusRead measures a dispatch's status as the doors answer it — its
// record and its chain's last events, read beside the record for a root
// (docs/storage.md, "The dispatch record and the reconciler") — through
// agora.api.status, against its raw baseline: a get of the same records
// from agora_dispatches; and through GET /v1/dispatches/{id}, as an
// operator's token and as the principal that owns the dispatch, whose
// read adds the owner check (docs/security.md, "Principals and scopes").
// It returns the scenarios, baseline first, and a stop function.
func statusRead(ctx context.Context, url string, js jetstream.JetStream) ([]scenario, func(), error) {
	def := subagent.Definition{Name: "bench-status", Runtime: subagent.RuntimeExec, Command: []string{"/bin/true"}}
	if _, err := applyDef(ctx, js, def); err != nil {
		return nil, nil, err
	}
	principals, err := benchPrincipals()
	if err != nil {
		return nil, nil, err
	}
	st, err := stack.Start(ctx, stack.Options{URL: url, ReadyTimeout: 30 * time.Second,
		Dispatcher: &dispatcher.Config{ID: "bench-status", ReconcileLookback: reconcileLookback,
			APITokens: []string{benchOperatorToken}, PrincipalsFile: principals}})
	if err != nil {
		return nil, nil, err
	}
	c := st.Client()
	// Ended root dispatches: accepted by the dispatcher, started and
	// finished as a worker publishes them.
	ids := make([]string, statusDispatches)
	for i := range ids {
		d, err := c.Dispatch(ctx, lifecycle.Request{Subagent: def.Name, Input: json.RawMessage(`{}`)}, client.OnBehalfOf(benchPrincipal))
		if err != nil {
			_ = st.Close()
			return nil, nil, err
		}
		ids[i] = d.DispatchID
		for _, ev := range []lifecycle.Lifecycle{
			&lifecycle.Started{Common: d.Record.Common(), WorkerID: "bench", Attempt: 1},
			&lifecycle.Finished{Common: d.Record.Common(), Output: json.RawMessage(`{"ok":true}`)},
		} {
			_, msg, err := lifecycle.Message(lifecycle.Source("worker", "bench"), ev)
			if err == nil {
				_, err = js.PublishMsg(ctx, msg)
			}
			if err != nil {
				_ = st.Close()
				return nil, nil, err
			}
		}
	}
	if err := projectionCaughtUp(ctx, js, 60*time.Second); err != nil {
		_ = st.Close()
		return nil, nil, err
	}
	kv, err := js.KeyValue(ctx, lifecycle.BucketDispatches)
	if err != nil {
		_ = st.Close()
		return nil, nil, err
	}
	var next atomic.Uint64
	pick := func() string { return ids[next.Add(1)%statusDispatches] }
	raw := scenario{name: "raw KV get of a dispatch record (the status rows' baseline)", do: func(ctx context.Context, _ string) error {
		_, err := kv.Get(ctx, pick())
		return err
	}}
	agora := scenario{name: "agora status (agora.api.status) of an ended dispatch: its record and its chain", do: func(ctx context.Context, _ string) error {
		id := pick()
		rec, err := c.Status(ctx, id)
		if err == nil && rec.Status != lifecycle.KindFinished {
			err = fmt.Errorf("status of %s: %s, want finished", id, rec.Status)
		}
		return err
	}}
	web := httptest.NewServer(st.Handler())
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	get := func(token string) func(ctx context.Context, _ string) error {
		return func(ctx context.Context, _ string) error {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, web.URL+"/v1/dispatches/"+pick(), nil)
			if err != nil {
				return err
			}
			req.Header.Set("Authorization", "Bearer "+token)
			resp, err := hc.Do(req)
			if err != nil {
				return err
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("GET /v1/dispatches: %s", resp.Status)
			}
			return nil
		}
	}
	operator := scenario{name: "GET /v1/dispatches/{id} as an operator's token (an admin: no owner check)", do: get(benchOperatorToken)}
	owner := scenario{name: "GET /v1/dispatches/{id} as the principal that owns it (the owner check: its thread's first record read)", do: get(benchPrincipalToken)}
	stop := func() {
		web.Close()
		_ = st.Close()
		_ = os.RemoveAll(filepath.Dir(principals))
	}
	return []scenario{raw, agora, operator, owner}, stop, nil
}

// The status rows' HTTP callers: an operator's token, and a principal of
// a principals file that owns the dispatches it reads.
const (
	benchOperatorToken  = "bench-operator-token"
	benchPrincipal      = "bench-team"
	benchPrincipalToken = "bench-team-token"
)

// benchPrincipals writes the principals file naming benchPrincipal.
func benchPrincipals() (string, error) {
	dir, err := os.MkdirTemp("", "agora-bench-principals-")
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256([]byte(benchPrincipalToken))
	f := filepath.Join(dir, "principals.yaml")
	body := "principals:\n  - name: " + benchPrincipal + "\n    token_sha256: " + hex.EncodeToString(sum[:]) + "\n"
	return f, os.WriteFile(f, []byte(body), 0o600)
}
