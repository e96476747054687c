package egress_test

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/internal/egress"
	"github.com/agora-dispatch/agora/internal/testkit"
)

func TestConnectRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name      string
		size      int
		pipelined bool // payload sent with the CONNECT, before the 200
	}{
		{"small after the 200", 5, false},
		{"small with the request", 5, true},
		{"1 MiB both ways at once", 1 << 20, false},
		{"1 MiB starting with the request", 1 << 20, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			echo := startEcho(t)
			res := &resolver{m: map[string][]string{"allowed.example": {"127.0.0.1"}}}
			var d loopbackDialer
			px := startProxy(t, egress.Config{
				Allow:        []string{"allowed.example:" + strconv.Itoa(echo.port)},
				AllowPrivate: true, // the test server is on loopback
				Resolver:     res.resolve,
				Dialer:       d.dial,
			})
			payload := make([]byte, tc.size)
			_, _ = rand.Read(payload)
			head := 0
			if tc.pipelined {
				head = min(len(payload), 4096)
			}

			c, br, resp := connect(t, px.addr, "Allowed.Example:"+strconv.Itoa(echo.port), payload[:head])
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("CONNECT: %s, want 200", resp.Status)
			}
			var wg sync.WaitGroup
			var werr error
			wg.Go(func() {
				if _, werr = c.Write(payload[head:]); werr == nil {
					werr = c.CloseWrite()
				}
			})
			got, err := io.ReadAll(br) // ends when the echo's half-close comes through
			wg.Wait()
			if err != nil || werr != nil {
				t.Fatalf("tunnel: read %v, write %v", err, werr)
			}
			if !bytes.Equal(got, payload) {
				t.Fatalf("echoed %d bytes, not the %d sent", len(got), len(payload))
			}
			_ = c.Close()

			if want := []string{"127.0.0.1:" + strconv.Itoa(echo.port)}; !slices.Equal(d.addrs(), want) {
				t.Errorf("dialled %q, want the checked address %q", d.addrs(), want)
			}
			if want := []string{"allowed.example"}; !slices.Equal(res.names(), want) {
				t.Errorf("resolved %q, want %q", res.names(), want)
			}
			testkit.Eventually(t, 10*time.Second, "the tunnel ends", func() bool { return px.Stats().Active == 0 })
			st := px.Stats()
			n := uint64(tc.size)
			if st.Allowed != 1 || st.Denied != 0 || st.BytesOut != n || st.BytesIn != n {
				t.Errorf("Stats = %+v, want 1 allowed, %d bytes each way", st, n)
			}
		})
	}
}

func TestDenied(t *testing.T) {
	res := &resolver{m: map[string][]string{}}
	var d loopbackDialer
	var logs testkit.Buffer
	px := startProxy(t, egress.Config{
		Allow:        []string{"api.example.com:443", "*.cdn.example:443", "203.0.113.7:443"},
		AllowPrivate: true, // a denial must not depend on the address check
		Resolver:     res.resolve,
		Dialer:       d.dial,
		Logger:       slog.New(slog.NewJSONHandler(&logs, nil)),
	})
	for _, tc := range []struct{ target, named string }{
		{"other.example.com:443", "other.example.com:443"},
		{"api.example.com:80", "api.example.com:80"},
		{"API.example.com.:8443", "api.example.com:8443"},
		{"cdn.example:443", "cdn.example:443"}, // the wildcard's apex
		{"evilcdn.example:443", "evilcdn.example:443"},
		{"203.0.113.8:443", "203.0.113.8:443"},
		{"[2001:db8::1]:443", "[2001:db8::1]:443"},
		{"127.0.0.1:22", "127.0.0.1:22"},
	} {
		t.Run(tc.target, func(t *testing.T) {
			resp, body := refused(t, px.addr, tc.target, http.StatusForbidden)
			if !hasAll(body, tc.named, "sandbox.network.allow", "sub-agent definition") {
				t.Errorf("403 body %q does not name %s and the setting that allows it", body, tc.named)
			}
			if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
				t.Errorf("Content-Type %q, want text/plain", ct)
			}
		})
	}
	if names := res.names(); len(names) != 0 {
		t.Errorf("denied names were resolved: %q", names)
	}
	if addrs := d.addrs(); len(addrs) != 0 {
		t.Errorf("denied destinations were dialled: %q", addrs)
	}
	if st := px.Stats(); st.Denied != 8 || st.Allowed != 0 {
		t.Errorf("Stats = %+v, want 8 denied", st)
	}
	if want := `"msg":"destination not allowed","client":"127.0.0.1:`; strings.Count(logs.String(), want) != 8 {
		t.Errorf("log has not one %s line per denial:\n%s", want, logs.String())
	}
	if want := `"target":"api.example.com:8443"`; !strings.Contains(logs.String(), want) {
		t.Errorf("log does not name the normalized target %s:\n%s", want, logs.String())
	}
}

func TestRefusesPrivateDestinations(t *testing.T) {
	res := &resolver{m: map[string][]string{
		"loopback.example":  {"127.0.0.1"},
		"internal.example":  {"10.0.0.1"},
		"rfc1918.example":   {"192.168.1.10", "172.16.0.1"},
		"ula.example":       {"fd00::1"},
		"metadata.example":  {"169.254.169.254"},
		"cgnat.example":     {"100.64.0.1"},
		"mapped.example":    {"::ffff:127.0.0.1"},
		"nat64.example":     {"64:ff9b::a00:1"}, // 10.0.0.1 through NAT64
		"zero.example":      {"0.0.0.0"},
		"multicast.example": {"224.0.0.1"},
		"bench.example":     {"198.18.0.1"},
		"doc.example":       {"2001:db8::1", "192.0.2.7", "203.0.113.9", "198.51.100.1"},
		"host.example":      {ownAddr(t)},
	}}
	var d loopbackDialer
	var allow []string
	for name := range res.m {
		allow = append(allow, name+":443")
	}
	allow = append(allow, "127.0.0.1:22", "[::1]:443", "169.254.169.254:80", "[::]:443")
	px := startProxy(t, egress.Config{Allow: allow, Resolver: res.resolve, Dialer: d.dial})

	for _, tc := range []struct{ target, why string }{
		{"127.0.0.1:22", "127.0.0.1 is loopback"},
		{"[::1]:443", "::1 is loopback"},
		{"[::]:443", ":: is unspecified"},
		{"169.254.169.254:80", "169.254.169.254 is link-local"},
		{"loopback.example:443", "127.0.0.1 is loopback"},
		{"internal.example:443", "10.0.0.1 is private"},
		{"rfc1918.example:443", "192.168.1.10 is private, 172.16.0.1 is private"},
		{"ula.example:443", "fd00::1 is private"},
		{"metadata.example:443", "169.254.169.254 is link-local"},
		{"cgnat.example:443", "100.64.0.1 is carrier-grade NAT"},
		{"mapped.example:443", "127.0.0.1 is loopback"},
		{"nat64.example:443", "is private"},
		{"zero.example:443", "0.0.0.0 is unspecified"},
		{"multicast.example:443", "224.0.0.1 is multicast"},
		{"bench.example:443", "198.18.0.1 is special-purpose (198.18.0.0/15)"},
		{"doc.example:443", "2001:db8::1 is special-purpose (2001:db8::/32), 192.0.2.7 is special-purpose (192.0.2.0/24), 203.0.113.9 is special-purpose (203.0.113.0/24), 198.51.100.1 is special-purpose (198.51.100.0/24)"},
		{"host.example:443", "is this host's own address"},
	} {
		t.Run(tc.target, func(t *testing.T) {
			_, body := refused(t, px.addr, tc.target, http.StatusForbidden)
			if !hasAll(body, tc.target, tc.why) {
				t.Errorf("403 body %q does not name %s and %q", body, tc.target, tc.why)
			}
		})
	}
	if addrs := d.addrs(); len(addrs) != 0 {
		t.Errorf("refused destinations were dialled: %q", addrs)
	}
}

// ownAddr gives this host an address no other check refuses — a public
// one, on a dummy interface the test adds and removes (root only; the
// test skips otherwise) — and returns it. No packet is sent to it.
func ownAddr(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("giving this host an address of its own for the test needs root")
	}
	const name, addr = "agoraegress0", "198.20.0.1"
	if out, err := exec.Command("ip", "link", "add", name, "type", "dummy").CombinedOutput(); err != nil {
		t.Skipf("cannot add a dummy interface: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", name).Run() })
	if out, err := exec.Command("ip", "addr", "add", addr+"/32", "dev", name).CombinedOutput(); err != nil {
		t.Fatalf("ip addr add: %v: %s", err, out)
	}
	return addr
}

// A name with both a private and a public address is dialled only at the
// public one. The test dialer refuses it without sending a packet, so the
// answer is 502.
func TestDialsOnlyCheckedAddresses(t *testing.T) {
	res := &resolver{m: map[string][]string{"mixed.example": {"10.0.0.1", "127.0.0.1", "198.20.0.7"}}}
	var d loopbackDialer
	px := startProxy(t, egress.Config{Allow: []string{"mixed.example:443"}, Resolver: res.resolve, Dialer: d.dial})

	_, body := refused(t, px.addr, "mixed.example:443", http.StatusBadGateway)
	if !hasAll(body, "cannot connect to mixed.example:443") {
		t.Errorf("502 body %q", body)
	}
	if want := []string{"198.20.0.7:443"}; !slices.Equal(d.addrs(), want) {
		t.Errorf("dialled %q, want only %q", d.addrs(), want)
	}
	if st := px.Stats(); st.Failed != 1 {
		t.Errorf("Stats = %+v, want 1 failed", st)
	}
}

func TestUpstreamFailures(t *testing.T) {
	// A port nothing listens on: take one and close it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	_ = ln.Close()

	res := &resolver{m: map[string][]string{"down.example": {"127.0.0.1"}}}
	px := startProxy(t, egress.Config{
		Allow:        []string{"down.example:" + closed, "unknown.example:443"},
		AllowPrivate: true,
		Resolver:     res.resolve,
	})
	for _, tc := range []struct{ target, want string }{
		{"down.example:" + closed, "cannot connect to down.example:" + closed},
		{"unknown.example:443", "cannot resolve unknown.example"},
	} {
		_, _, resp := connect(t, px.addr, tc.target, nil)
		body := readBody(t, resp)
		if resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, tc.want) {
			t.Errorf("CONNECT %s: %s %q, want 502 naming %q", tc.target, resp.Status, body, tc.want)
		}
	}
}

func TestMalformedRequests(t *testing.T) {
	px := startProxy(t, egress.Config{
		Allow:          []string{"allowed.example:443"},
		MaxHeaderBytes: 1024,
		HeaderTimeout:  10 * time.Second,
	})
	big := "CONNECT allowed.example:443 HTTP/1.1\r\nX-Padding: " + strings.Repeat("a", 4096) + "\r\n\r\n"
	for _, tc := range []struct {
		name, req string
		status    int
		body      string
	}{
		{"not HTTP", "hello there\r\n\r\n", 400, "malformed request"},
		{"no port", "CONNECT allowed.example HTTP/1.1\r\n\r\n", 400, "not host:port"},
		{"port 0", "CONNECT allowed.example:0 HTTP/1.1\r\n\r\n", 400, "not a number from 1 to 65535"},
		{"port too large", "CONNECT allowed.example:70000 HTTP/1.1\r\n\r\n", 400, "not a number from 1 to 65535"},
		{"bad host", "CONNECT allowed!example:443 HTTP/1.1\r\n\r\n", 400, "character other than"},
		{"zone", "CONNECT [fe80::1%25eth0]:443 HTTP/1.1\r\n\r\n", 400, ""},
		{"URL target", "CONNECT http://allowed.example:443/ HTTP/1.1\r\n\r\n", 400, ""},
		{"bad header line", "CONNECT allowed.example:443 HTTP/1.1\r\nno colon here\r\n\r\n", 400, "malformed request"},
		{"plain HTTP proxying", "GET http://allowed.example/ HTTP/1.1\r\nHost: allowed.example\r\n\r\n", 405, "only CONNECT"},
		{"origin-form GET", "GET / HTTP/1.1\r\nHost: allowed.example\r\n\r\n", 405, "https://"},
		{"header too large", big, 431, "larger than 1024 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := raw(t, px.addr, tc.req)
			if resp.StatusCode != tc.status {
				t.Fatalf("%s: %s %q, want %d", tc.name, resp.Status, body, tc.status)
			}
			if !strings.Contains(body, tc.body) {
				t.Errorf("%s: body %q does not contain %q", tc.name, body, tc.body)
			}
			if tc.status == 405 && resp.Header.Get("Allow") != "CONNECT" {
				t.Errorf("405 without Allow: CONNECT: %v", resp.Header)
			}
		})
	}
}

func TestHeaderTimeout(t *testing.T) {
	px := startProxy(t, egress.Config{Allow: []string{"allowed.example:443"}, HeaderTimeout: 50 * time.Millisecond})
	// A request line without the end of the header: the proxy answers 408
	// once its deadline passes, whatever the client does next.
	resp, body := raw(t, px.addr, "CONNECT allowed.example:443 HTTP/1.1\r\n")
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("%s %q, want 408", resp.Status, body)
	}
}

func TestConnectionLimit(t *testing.T) {
	echo := startEcho(t)
	target := "127.0.0.1:" + strconv.Itoa(echo.port)
	px := startProxy(t, egress.Config{Allow: []string{target}, AllowPrivate: true, MaxConns: 1})

	first, _, resp := connect(t, px.addr, target, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("first CONNECT: %s", resp.Status)
	}
	_, _, resp = connect(t, px.addr, target, nil)
	if body := readBody(t, resp); resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "at most 1 at once") {
		t.Fatalf("second CONNECT while the first is open: %s %q, want 503", resp.Status, body)
	}
	_ = first.Close()
	testkit.Eventually(t, 10*time.Second, "the first tunnel ends", func() bool { return px.Stats().Active == 0 })
	_, _, resp = connect(t, px.addr, target, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT after the first closed: %s, want 200", resp.Status)
	}
	if st := px.Stats(); st.Busy != 1 || st.Allowed != 2 {
		t.Errorf("Stats = %+v, want 1 busy and 2 allowed", st)
	}
}

func TestServeClosesEverythingOnCancel(t *testing.T) {
	echo := startEcho(t)
	target := "127.0.0.1:" + strconv.Itoa(echo.port)
	px := startProxy(t, egress.Config{Allow: []string{target}, AllowPrivate: true})

	var tunnels []net.Conn
	var readers []io.Reader
	for range 3 {
		c, br, resp := connect(t, px.addr, target, nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("CONNECT: %s", resp.Status)
		}
		if _, err := c.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 4)
		if _, err := io.ReadFull(br, buf); err != nil {
			t.Fatal(err)
		}
		tunnels, readers = append(tunnels, c), append(readers, br)
	}
	// And one client that has not sent its header yet.
	idle, err := net.Dial("tcp", px.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	testkit.Eventually(t, 10*time.Second, "every connection is being handled", func() bool { return px.Stats().Active == 4 })
	if echo.open.Load() != 3 {
		t.Fatalf("echo server has %d connections, want 3", echo.open.Load())
	}

	if err := px.stop(t); err != nil {
		t.Fatalf("Serve returned %v after its context ended, want nil", err)
	}
	if st := px.Stats(); st.Active != 0 {
		t.Errorf("Serve returned with %d connections still handled", st.Active)
	}
	for i, c := range tunnels {
		if !closedByPeer(t, c, readers[i]) {
			t.Errorf("tunnel %d still open after Serve returned", i)
		}
	}
	if !closedByPeer(t, idle, idle) {
		t.Error("connection without a header still open after Serve returned")
	}
	testkit.Eventually(t, 10*time.Second, "the destination sees every tunnel closed", func() bool { return echo.open.Load() == 0 })
	if c, err := net.Dial("tcp", px.addr); err == nil {
		_ = c.Close()
		t.Error("the listener still accepts after Serve returned")
	}
}

func TestServeReturnsWhenListenerCloses(t *testing.T) {
	p, err := egress.New(egress.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Serve(t.Context(), ln) }()
	// An answered connection shows Serve is accepting.
	resp, _ := raw(t, ln.Addr().String(), "CONNECT denied.example:443 HTTP/1.1\r\n\r\n")
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("%s, want 403", resp.Status)
	}
	_ = ln.Close()
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("Serve returned %v, want an error wrapping net.ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after its listener closed")
	}
}

// Go's own HTTP client, with the proxy as its Transport.Proxy, reaches an
// allowed HTTPS server through CONNECT and is refused a denied one.
func TestHTTPClientThroughProxy(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from %s", r.Host)
	}))
	t.Cleanup(srv.Close)
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	res := &resolver{m: map[string][]string{"example.com": {"127.0.0.1"}}}
	px := startProxy(t, egress.Config{
		Allow:        []string{"example.com:" + strconv.Itoa(port)},
		AllowPrivate: true,
		Resolver:     res.resolve,
	})

	client := srv.Client() // trusts the test certificate, valid for example.com
	tr := client.Transport.(*http.Transport)
	tr.Proxy = http.ProxyURL(&url.URL{Scheme: "http", Host: px.addr})
	t.Cleanup(tr.CloseIdleConnections)

	u := fmt.Sprintf("https://example.com:%d/", port)
	resp, err := client.Get(u)
	if err != nil {
		t.Fatalf("GET %s through the proxy: %v", u, err)
	}
	body := readBody(t, resp)
	_ = resp.Body.Close()
	if want := fmt.Sprintf("hello from example.com:%d", port); body != want {
		t.Errorf("body %q, want %q", body, want)
	}

	denied := fmt.Sprintf("https://www.example.com:%d/", port)
	if resp, err := client.Get(denied); err == nil {
		_ = resp.Body.Close()
		t.Errorf("GET %s through the proxy succeeded: %s", denied, resp.Status)
	}
	if st := px.Stats(); st.Allowed != 1 || st.Denied != 1 {
		t.Errorf("Stats = %+v, want 1 allowed and 1 denied", st)
	}
}

// A run that floods the proxy with refused connections cannot flood the
// worker's log: after the first 100 lines at most one a second is
// written, each counting the lines left out, and the proxy's last line
// counts them all; its statistics count every connection.
func TestRefusalFloodLogsBounded(t *testing.T) {
	var logs testkit.Buffer
	px := startProxy(t, egress.Config{Allow: []string{"api.example.com:443"}, Resolver: (&resolver{m: map[string][]string{}}).resolve,
		Dialer: (&loopbackDialer{}).dial, Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	const flood = 2000
	start := time.Now()
	for i := range flood {
		c, _, resp := connect(t, px.addr, fmt.Sprintf("flood%d.example:443", i), nil)
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("flood CONNECT %d: %s, want 403", i, resp.Status)
		}
		c.Close()
	}
	elapsed := time.Since(start)
	if st := px.Stats(); st.Denied != flood {
		t.Errorf("Stats = %+v, want %d denied", st, flood)
	}
	if err := px.stop(t); err != nil {
		t.Fatal(err)
	}
	lines := strings.Count(logs.String(), `"msg":"destination not allowed"`)
	if limit := 100 + int(elapsed/time.Second) + 1; lines > limit {
		t.Errorf("%d refusals logged %d lines in %s, want at most %d", flood, lines, elapsed, limit)
	}
	want := fmt.Sprintf(`"msg":"log lines left out","dropped_lines":%d`, flood-lines)
	if !strings.Contains(logs.String(), want) {
		end := logs.String()
		t.Errorf("no %s in the log's end:\n%s", want, end[max(0, len(end)-600):])
	}
}
