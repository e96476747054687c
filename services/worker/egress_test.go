package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/agora-dispatch/agora/internal/egress"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/pkg/subagent"
	"github.com/agora-dispatch/agora/services/worker"
)

// TestEgressThroughTheProxy: a run reaches the outside only through the
// worker's egress proxy, for the destinations sandbox.network.allow lists:
// curl in the run fetches an allowed HTTPS site through HTTPS_PROXY, is
// refused another, and cannot connect anywhere without the proxy (its
// network namespace has only loopback). The "outside" is a TLS server on
// this host's loopback, which the proxy's resolver names allowed.test (its
// address check is lifted for that, as only a test may).
func TestEgressThroughTheProxy(t *testing.T) {
	site := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello from outside") }))
	defer site.Close()
	siteAddr := netip.MustParseAddrPort(site.Listener.Addr().String())
	h := newHarness(t, provision.Config{})
	deps := worker.Deps{Egress: egress.Config{
		AllowPrivate: true,
		Resolver: func(_ context.Context, host string) ([]netip.Addr, error) {
			if host == "allowed.test" || host == "denied.test" {
				return []netip.Addr{siteAddr.Addr()}, nil
			}
			return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
		},
		// Every allowed destination is the test site, whatever its port.
		Dialer: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, siteAddr.String())
		},
	}}
	svc := h.startWorker(h.workerConfig(), deps)
	requireSandbox(t, svc, "namespaces")
	h.define(subagent.Definition{Name: "fetcher", Runtime: subagent.RuntimeExec, Command: []string{"/bin/sh", "-c", `
curl -sSk --max-time 10 https://allowed.test/ ; echo
curl -sSk --max-time 10 https://denied.test/ 2>&1 | tr -d '\r'; echo
curl -sSk --noproxy '*' --max-time 5 https://` + site.Listener.Addr().String() + `/ 2>&1 && echo BREACH direct
echo "proxy=$HTTPS_PROXY"`},
		Sandbox: subagent.Sandbox{Network: subagent.Network{Allow: []string{"allowed.test:443"}}}})
	id := h.dispatch(lifecycle.Request{Subagent: "fetcher", Input: json.RawMessage(`{}`)})
	fin, ok := h.terminal(id).Data.(*lifecycle.Finished)
	if !ok {
		t.Fatalf("terminal = %+v, want finished", h.terminal(id).Data)
	}
	out := fin.StdoutTail
	for _, want := range []string{"hello from outside", "403", "proxy=http://127.0.0.1:"} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "BREACH") {
		t.Errorf("the run reached the host's loopback without the proxy:\n%s", out)
	}
	if strings.Count(out, "hello from outside") != 1 {
		t.Errorf("only the allowed site answers:\n%s", out)
	}
	// started says what the run could reach.
	for _, e := range h.events(id) {
		if st, ok := e.Data.(*lifecycle.Started); ok {
			if st.Sandbox == nil || !st.Sandbox.NetworkNamespace || len(st.Sandbox.Egress) != 1 || st.Sandbox.Egress[0] != "allowed.test:443" {
				t.Errorf("started.sandbox = %+v", st.Sandbox)
			}
		}
	}
}

// A run that fails on a refused destination says which and how to allow
// it, its sub-agent's egress metrics count the refusal, and a run with no
// network that fails on a name lookup is told why: egress goes through the
// proxy, to the destinations the definition allows.
func TestRefusedEgressIsNamed(t *testing.T) {
	h := newHarness(t, provision.Config{})
	reg := prometheus.NewRegistry()
	deps := worker.Deps{Registerer: reg, Egress: egress.Config{
		Resolver: func(_ context.Context, host string) ([]netip.Addr, error) {
			return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
		},
	}}
	svc := h.startWorker(h.workerConfig(), deps)
	requireSandbox(t, svc, "namespaces")

	h.define(subagent.Definition{Name: "wants-github", Runtime: subagent.RuntimeExec, Command: []string{"/bin/sh", "-c",
		`curl -sS --max-time 10 https://api.github.com/ ; exit 7`},
		Sandbox: subagent.Sandbox{Network: subagent.Network{Allow: []string{"pypi.org:443"}}}})
	id := h.dispatch(lifecycle.Request{Subagent: "wants-github", Input: json.RawMessage(`{}`)})
	f, ok := h.terminal(id).Data.(*lifecycle.Failed)
	if !ok {
		t.Fatalf("terminal = %+v, want failed", h.terminal(id).Data)
	}
	t.Logf("detail: %s", f.Detail)
	if !strings.Contains(f.Detail, "egress to api.github.com:443 refused: add it to sandbox.network.allow") {
		t.Errorf("detail lacks the refused destination: %s", f.Detail)
	}
	if n := testkit.Counter(t, reg, "agora_worker_egress_connections_total", map[string]string{"subagent": "wants-github", "verdict": "denied"}); n != 1 {
		t.Errorf("denied connections of wants-github = %v, want 1", n)
	}

	// A flood of refused destinations, each a new name: the detail stays
	// bounded (the first few, each once) and every one is counted.
	h.define(subagent.Definition{Name: "flooder", Runtime: subagent.RuntimeExec, Command: []string{"/bin/bash", "-c", `
port=${HTTPS_PROXY##*:}
for i in $(seq 400); do
  exec 3<>/dev/tcp/127.0.0.1/$port || exit 9
  printf 'CONNECT h%d.example:443 HTTP/1.1\r\nHost: h%d.example:443\r\n\r\n' $i $i >&3
  head -c 12 <&3 >/dev/null
  exec 3<&-
done
exit 7`},
		Sandbox: subagent.Sandbox{Network: subagent.Network{Allow: []string{"pypi.org:443"}}}})
	id = h.dispatch(lifecycle.Request{Subagent: "flooder", Input: json.RawMessage(`{}`)})
	f, ok = h.terminal(id).Data.(*lifecycle.Failed)
	if !ok || !strings.Contains(f.Detail, "runtime exited 7") {
		t.Fatalf("terminal = %+v, want failed with exit 7", h.terminal(id).Data)
	}
	if n := strings.Count(f.Detail, "refused: add it to sandbox.network.allow"); n != 8 || len(f.Detail) > 2000 {
		t.Errorf("the flood's detail names %d destinations in %d bytes, want the first 8: %s", n, len(f.Detail), f.Detail)
	}
	if n := testkit.Counter(t, reg, "agora_worker_egress_connections_total", map[string]string{"subagent": "flooder", "verdict": "denied"}); n != 400 {
		t.Errorf("denied connections of flooder = %v, want 400", n)
	}

	h.define(subagent.Definition{Name: "offline", Runtime: subagent.RuntimeExec, Command: []string{"/bin/sh", "-c",
		`curl -sS --max-time 10 https://api.github.com/ ; exit 6`}})
	id = h.dispatch(lifecycle.Request{Subagent: "offline", Input: json.RawMessage(`{}`)})
	f, ok = h.terminal(id).Data.(*lifecycle.Failed)
	if !ok {
		t.Fatalf("terminal = %+v, want failed", h.terminal(id).Data)
	}
	t.Logf("detail: %s", f.Detail)
	if !strings.Contains(f.Detail, "the run has no network: its definition allows no destination") {
		t.Errorf("detail does not say why names do not resolve: %s", f.Detail)
	}
}
