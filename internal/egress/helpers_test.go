package egress_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/internal/egress"
)

// proxy is a running Proxy under test.
type proxy struct {
	*egress.Proxy
	addr   string
	cancel context.CancelFunc
	done   chan error // Serve's result
}

// startProxy serves a proxy built from cfg on a fresh loopback listener until
// the test ends (or stop is called).
func startProxy(t *testing.T, cfg egress.Config) *proxy {
	t.Helper()
	p, err := egress.New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	px := &proxy{Proxy: p, addr: ln.Addr().String(), cancel: cancel, done: make(chan error, 1)}
	go func() { px.done <- p.Serve(ctx, ln) }()
	t.Cleanup(func() { _ = px.stop(t) })
	return px
}

// stop cancels Serve and returns its result once it has returned.
func (px *proxy) stop(t *testing.T) error {
	t.Helper()
	px.cancel()
	select {
	case err, ok := <-px.done:
		if ok {
			close(px.done)
		}
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return within 10s of its context ending")
		return nil
	}
}

// resolver answers for the names in m and fails for the rest, recording
// every name asked.
type resolver struct {
	m     map[string][]string
	mu    sync.Mutex
	asked []string
}

func (r *resolver) resolve(_ context.Context, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	r.asked = append(r.asked, host)
	r.mu.Unlock()
	ss, ok := r.m[host]
	if !ok {
		return nil, fmt.Errorf("no such host %s", host)
	}
	var addrs []netip.Addr
	for _, s := range ss {
		addrs = append(addrs, netip.MustParseAddr(s))
	}
	return addrs, nil
}

func (r *resolver) names() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.asked...)
}

// loopbackDialer dials only loopback addresses and records every address it
// is asked for; any other address fails without a packet being sent (the
// test machine may reach nothing but loopback).
type loopbackDialer struct {
	mu     sync.Mutex
	dialed []string
}

func (d *loopbackDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d.mu.Lock()
	d.dialed = append(d.dialed, addr)
	d.mu.Unlock()
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return nil, fmt.Errorf("dialer given %q, not an address", addr)
	}
	if !ap.Addr().IsLoopback() {
		return nil, fmt.Errorf("test dialer: %s is not loopback, not dialled", addr)
	}
	var nd net.Dialer
	return nd.DialContext(ctx, network, addr)
}

func (d *loopbackDialer) addrs() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.dialed...)
}

// echoServer is a TCP server on loopback that echoes what it reads and
// half-closes when its input ends.
type echoServer struct {
	port int
	open atomic.Int64 // connections not yet finished
}

func startEcho(t *testing.T) *echoServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &echoServer{port: ln.Addr().(*net.TCPAddr).Port}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			e.open.Add(1)
			wg.Go(func() {
				defer e.open.Add(-1)
				defer c.Close()
				if _, err := io.Copy(c, c); err == nil {
					_ = c.(*net.TCPConn).CloseWrite()
					_, _ = io.Copy(io.Discard, c) // until the proxy closes
				}
			})
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return e
}

// connect sends "CONNECT target" (followed by extra, in the same write) to
// the proxy and reads the answer's header. The returned reader carries the
// tunnel's bytes after it.
func connect(t *testing.T, proxyAddr, target string, extra []byte) (*net.TCPConn, *bufio.Reader, *http.Response) {
	t.Helper()
	c, err := net.Dial("tcp", proxyAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	msg := append([]byte("CONNECT "+target+" HTTP/1.1\r\nHost: "+target+"\r\n\r\n"), extra...)
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp := readResponse(t, br, http.MethodConnect)
	return c.(*net.TCPConn), br, resp
}

// raw sends req as is on a new connection and returns the response with its
// body read.
func raw(t *testing.T, proxyAddr, req string) (*http.Response, string) {
	t.Helper()
	c, err := net.Dial("tcp", proxyAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp := readResponse(t, br, http.MethodGet)
	return resp, readBody(t, resp)
}

func readResponse(t *testing.T, br *bufio.Reader, method string) *http.Response {
	t.Helper()
	resp, err := http.ReadResponse(br, &http.Request{Method: method})
	if err != nil {
		t.Fatalf("reading the proxy's answer: %v", err)
	}
	return resp
}

func readBody(t *testing.T, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the answer's body: %v", err)
	}
	return string(b)
}

// refused sends CONNECT target through the proxy at addr, which must
// answer status; it returns the answer and its body.
func refused(t *testing.T, addr, target string, status int) (*http.Response, string) {
	t.Helper()
	_, _, resp := connect(t, addr, target, nil)
	body := readBody(t, resp)
	if resp.StatusCode != status {
		t.Fatalf("CONNECT %s: %s, want %d", target, resp.Status, status)
	}
	return resp, body
}

// closedByPeer reports whether reading c ends (EOF or a reset) rather than
// blocking, checking with a generous deadline.
func closedByPeer(t *testing.T, c net.Conn, r io.Reader) bool {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := io.Copy(io.Discard, r)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return false
	}
	return true
}

func hasAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
