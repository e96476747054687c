// Package egress is the allow-listing HTTP CONNECT proxy through which a
// sandboxed run reaches the outside (docs/sandbox.md, "Egress proxy").
//
// A run's network namespace holds only loopback; its launcher listens on
// 127.0.0.1:<port> inside it and hands the listener to the worker, which
// passes it to [Proxy.Serve]. Connections the run makes are accepted there,
// and the proxy's own dials leave from the worker's namespace. The runtime
// finds the proxy through HTTPS_PROXY and its siblings.
//
// For each connection the proxy reads one request. "CONNECT host:port" to a
// destination the allow-list names ([ParseRule]) is resolved by the proxy
// itself, refused when every address is loopback, link-local, private,
// CGNAT, multicast, unspecified or reserved (unless [Config.AllowPrivate]),
// dialled at the checked address — never by name again, so a DNS answer
// cannot change between the check and the connection — and then spliced
// both ways. Names the allow-list does not hold are never resolved, so a run
// cannot leak data through DNS look-ups of names it makes up. Plain-HTTP
// proxying (absolute-form "GET http://…") is refused with 405: the proxy
// only tunnels, so it never parses or forwards a request meant for the
// destination.
package egress

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/agora-dispatch/agora/pkg/subagent"
)

// Defaults for the zero values of [Config].
const (
	DefaultMaxConns       = 256
	DefaultHeaderTimeout  = 10 * time.Second
	DefaultMaxHeaderBytes = 8 << 10
	DefaultDialTimeout    = 10 * time.Second
)

// AllowSetting is the sub-agent definition's setting that lists the
// destinations a run may reach; refusals name it.
const AllowSetting = "sandbox.network.allow"

// Config configures a [Proxy]. The zero value is a proxy that denies
// everything.
type Config struct {
	// Allow lists the destinations a run may reach, each in the form
	// [ParseRule] reads ("api.example.com:443", "*.example.com:443",
	// "203.0.113.7:443"). Empty denies every destination.
	Allow []string
	// AllowPrivate turns the address check off: the proxy then dials
	// loopback, link-local, private, CGNAT, multicast, unspecified and
	// reserved addresses too. For tests and trusted set-ups only; the
	// default (false) refuses them.
	AllowPrivate bool

	// MaxConns bounds the connections the proxy handles at once, across
	// every Serve call; past it a connection is answered 503. Zero means
	// DefaultMaxConns.
	MaxConns int
	// HeaderTimeout bounds the time a client takes to send its request
	// header. Zero means DefaultHeaderTimeout.
	HeaderTimeout time.Duration
	// MaxHeaderBytes bounds the size of the request line and header; a
	// larger one is answered 431. Zero means DefaultMaxHeaderBytes.
	MaxHeaderBytes int
	// DialTimeout bounds resolving the destination and connecting to it.
	// Zero means DefaultDialTimeout.
	DialTimeout time.Duration

	// Dialer connects to a destination; addr is always an IP address and
	// port ("203.0.113.7:443"), network "tcp". Nil means a net.Dialer. The
	// proxy owns and closes what it returns; a connection without
	// CloseWrite is closed outright when the run stops sending to it.
	Dialer func(ctx context.Context, network, addr string) (net.Conn, error)
	// Resolver returns the addresses of an allowed host name (lower case,
	// no trailing dot). Nil means net.DefaultResolver (the host's
	// /etc/hosts and DNS).
	Resolver func(ctx context.Context, host string) ([]netip.Addr, error)
	// Logger receives a line per refused or finished connection. Nil
	// discards.
	Logger *slog.Logger
}

// Validate reports every problem of the configuration at once.
func (c Config) Validate() error {
	_, err := parseRules(c.Allow)
	var errs []error
	if err != nil {
		errs = append(errs, err)
	}
	if c.MaxConns < 0 {
		errs = append(errs, fmt.Errorf("egress: MaxConns %d is negative", c.MaxConns))
	}
	if c.HeaderTimeout < 0 {
		errs = append(errs, fmt.Errorf("egress: HeaderTimeout %v is negative", c.HeaderTimeout))
	}
	if c.MaxHeaderBytes < 0 {
		errs = append(errs, fmt.Errorf("egress: MaxHeaderBytes %d is negative", c.MaxHeaderBytes))
	}
	if c.DialTimeout < 0 {
		errs = append(errs, fmt.Errorf("egress: DialTimeout %v is negative", c.DialTimeout))
	}
	return errors.Join(errs...)
}

func parseRules(allow []string) ([]Rule, error) {
	rules := make([]Rule, 0, len(allow))
	var errs []error
	for _, s := range allow {
		r, err := ParseRule(s)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		rules = append(rules, r)
	}
	return rules, errors.Join(errs...)
}

// Stats are a proxy's counters since New. Each accepted connection is
// counted once, by its verdict (a client that leaves before sending a
// request counts as Rejected): Allowed + Denied + Failed + Rejected + Busy is
// the number of connections judged so far.
type Stats struct {
	Allowed  uint64 // tunnels established (200 sent)
	Denied   uint64 // destinations refused: not allowed, or a private address (403)
	Failed   uint64 // allowed destinations that could not be resolved or reached (502)
	Rejected uint64 // malformed, too large, too slow or not CONNECT (400, 405, 408, 431)
	Busy     uint64 // refused for the connection limit (503)
	Active   int64  // connections being handled now
	BytesOut uint64 // bytes from the run to its destinations
	BytesIn  uint64 // bytes from the destinations to the run
}

// Proxy is an allow-listing HTTP CONNECT proxy. Its methods are safe for
// concurrent use.
type Proxy struct {
	rules          []Rule
	allowPrivate   bool
	headerTimeout  time.Duration
	maxHeaderBytes int
	dialTimeout    time.Duration
	dial           func(ctx context.Context, network, addr string) (net.Conn, error)
	resolve        func(ctx context.Context, host string) ([]netip.Addr, error)
	log            *slog.Logger // bounded: loglimit.go
	unbounded      *slog.Logger // the configured logger, for the count of what was left out
	limit          *limitHandler

	slots    chan struct{} // one per connection being handled
	refusing chan struct{} // one per connection being answered 503

	allowed, denied, failed, rejected, busy atomic.Uint64
	bytesOut, bytesIn                       atomic.Uint64
	active                                  atomic.Int64

	refusedMu sync.Mutex
	refused   []Refusal // the first maxRefusals destinations refused, each once
}

// Refusal is one destination the proxy refused and why.
type Refusal struct {
	Target string // host:port as the run asked for it
	Status int    // 403: not allowed, or an address refused; 502: unreachable
	Reason string
}

// ReasonNotAllowed is a Refusal's reason for a destination no rule allows.
const ReasonNotAllowed = "not allowed"

// maxRefusals bounds the destinations Refusals keeps.
const maxRefusals = 8

// Refusals returns the distinct destinations refused so far (the first
// few): what a failed run's detail names (docs/sandbox.md).
func (p *Proxy) Refusals() []Refusal {
	p.refusedMu.Lock()
	defer p.refusedMu.Unlock()
	return slices.Clone(p.refused)
}

func (p *Proxy) noteRefusal(target string, status int, reason string) {
	p.refusedMu.Lock()
	defer p.refusedMu.Unlock()
	if len(p.refused) >= maxRefusals || slices.ContainsFunc(p.refused, func(r Refusal) bool { return r.Target == target }) {
		return
	}
	p.refused = append(p.refused, Refusal{Target: target, Status: status, Reason: reason})
}

// New checks cfg and returns a proxy; it starts nothing.
func New(cfg Config) (*Proxy, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	rules, _ := parseRules(cfg.Allow)
	p := &Proxy{
		rules:          rules,
		allowPrivate:   cfg.AllowPrivate,
		headerTimeout:  orDefault(cfg.HeaderTimeout, DefaultHeaderTimeout),
		maxHeaderBytes: orDefault(cfg.MaxHeaderBytes, DefaultMaxHeaderBytes),
		dialTimeout:    orDefault(cfg.DialTimeout, DefaultDialTimeout),
		dial:           cfg.Dialer,
		resolve:        cfg.Resolver,
		log:            cfg.Logger,
	}
	maxConns := orDefault(cfg.MaxConns, DefaultMaxConns)
	p.slots = make(chan struct{}, maxConns)
	p.refusing = make(chan struct{}, maxConns)
	if p.dial == nil {
		p.dial = (&net.Dialer{}).DialContext
	}
	if p.resolve == nil {
		p.resolve = func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		}
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	p.unbounded, p.limit = p.log, newLimitHandler(p.log.Handler())
	p.log = slog.New(p.limit)
	return p, nil
}

func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// Stats returns the proxy's counters.
func (p *Proxy) Stats() Stats {
	return Stats{
		Allowed:  p.allowed.Load(),
		Denied:   p.denied.Load(),
		Failed:   p.failed.Load(),
		Rejected: p.rejected.Load(),
		Busy:     p.busy.Load(),
		Active:   p.active.Load(),
		BytesOut: p.bytesOut.Load(),
		BytesIn:  p.bytesIn.Load(),
	}
}

// Serve accepts connections on ln and proxies them until ctx ends or ln
// fails. It owns ln and closes it; before it returns it closes every
// connection it accepted or dialled and waits for every goroutine it
// started. It returns nil when ctx ended, and otherwise the listener's error
// (wrapping net.ErrClosed if ln was closed under it). Serve may be called
// more than once, also concurrently, with different listeners; they share
// the proxy's connection limit and counters.
func (p *Proxy) Serve(ctx context.Context, ln net.Listener) error {
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel() // closes every connection through its AfterFunc
		_ = ln.Close()
		wg.Wait()
		if n := p.limit.droppedTotal(); n > 0 {
			p.unbounded.Info("log lines left out", "dropped_lines", n, "allowed", p.allowed.Load(), "denied", p.denied.Load(), "failed", p.failed.Load(), "rejected", p.rejected.Load())
		}
	}()
	stop := context.AfterFunc(ctx, func() { _ = ln.Close() })
	defer stop()

	var backoff time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if parent.Err() != nil {
				return nil
			}
			if !temporary(err) {
				return fmt.Errorf("egress: accept: %w", err)
			}
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			p.log.Warn("accept failed, retrying", "err", err, "retry_in", backoff)
			t := time.NewTimer(backoff)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-t.C:
			}
			continue
		}
		backoff = 0
		select {
		case p.slots <- struct{}{}:
			p.active.Add(1)
			wg.Go(func() {
				defer p.active.Add(-1) // after the slot is free: Active 0 means a slot is
				defer func() { <-p.slots }()
				p.handle(ctx, c)
			})
		default:
			p.busy.Add(1)
			p.log.Warn("connection limit reached", "client", c.RemoteAddr().String(), "max_conns", cap(p.slots))
			select {
			case p.refusing <- struct{}{}:
				wg.Go(func() {
					defer func() { <-p.refusing }()
					p.answer(ctx, c, http.StatusServiceUnavailable,
						fmt.Sprintf("egress: too many connections (at most %d at once); retry later", cap(p.slots)))
				})
			default: // even the refusals are at their limit
				_ = c.Close()
			}
		}
	}
}

// temporary reports whether an Accept error may clear by itself.
func temporary(err error) bool {
	for _, e := range []error{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.ECONNABORTED} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// handle serves one accepted connection and closes it.
func (p *Proxy) handle(ctx context.Context, c net.Conn) {
	stop := context.AfterFunc(ctx, func() { _ = c.Close() })
	defer stop()
	defer c.Close()
	client := c.RemoteAddr().String()

	_ = c.SetReadDeadline(time.Now().Add(p.headerTimeout))
	lr := &io.LimitedReader{R: c, N: int64(p.maxHeaderBytes)}
	br := bufio.NewReader(lr)
	req, err := http.ReadRequest(br)
	if err != nil {
		p.rejected.Add(1)
		var ne net.Error
		switch {
		case lr.N == 0:
			p.log.Info("request header too large", "client", client, "max_header_bytes", p.maxHeaderBytes)
			p.answer(ctx, c, http.StatusRequestHeaderFieldsTooLarge,
				fmt.Sprintf("egress: request header larger than %d bytes", p.maxHeaderBytes))
		case errors.As(err, &ne) && ne.Timeout():
			p.log.Info("request header timed out", "client", client, "header_timeout", p.headerTimeout)
			p.answer(ctx, c, http.StatusRequestTimeout, "egress: request header not received in time")
		case errors.Is(err, io.EOF):
			_ = c.Close() // connected and left without a word
		default:
			p.log.Info("malformed request", "client", client, "err", err)
			p.answer(ctx, c, http.StatusBadRequest, "egress: malformed request: "+err.Error())
		}
		return
	}
	if req.Method != http.MethodConnect {
		p.rejected.Add(1)
		// Not the request target: a URL may carry a credential.
		p.log.Info("refused a request that is not CONNECT", "client", client, "method", clipped(req.Method))
		p.answer(ctx, c, http.StatusMethodNotAllowed,
			"egress: only CONNECT is supported: reach the destination over https:// (plain-HTTP proxying is refused)")
		return
	}
	target := req.RequestURI
	host, port, literal, err := parseTarget(target)
	if err != nil {
		p.rejected.Add(1)
		p.log.Info("malformed CONNECT target", "client", client, "target", clipped(target), "err", err)
		p.answer(ctx, c, http.StatusBadRequest, fmt.Sprintf("egress: CONNECT %q: %v (want host:port)", target, err))
		return
	}
	target = netJoin(host, port)
	if !p.allows(host, port, literal) {
		p.denied.Add(1)
		p.log.Info("destination not allowed", "client", client, "target", target)
		p.noteRefusal(target, http.StatusForbidden, ReasonNotAllowed)
		p.answer(ctx, c, http.StatusForbidden, fmt.Sprintf(
			"egress: %s is not allowed; add it to %s in the sub-agent definition", target, AllowSetting))
		return
	}

	up, status, msg, cause := p.connect(ctx, host, port, literal)
	if up == nil {
		if status == http.StatusForbidden {
			p.denied.Add(1)
		} else {
			p.failed.Add(1)
		}
		attrs := []any{"client", client, "target", target, "status", status, "reason", msg}
		if cause != nil {
			attrs = append(attrs, "err", cause)
		}
		p.log.Info("destination refused", attrs...)
		p.noteRefusal(target, status, msg)
		p.answer(ctx, c, status, msg)
		return
	}
	stopUp := context.AfterFunc(ctx, func() { _ = up.Close() })
	defer stopUp()
	defer up.Close()

	_ = c.SetReadDeadline(time.Time{})
	p.allowed.Add(1) // before the 200, so that a client never sees it uncounted
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	start := time.Now()
	p.log.Debug("tunnel open", "client", client, "target", target, "addr", up.RemoteAddr().String())
	// Bytes the client sent after its header (a TLS hello sent without
	// waiting for the 200) are in br's buffer; lr is still limited, so
	// read the rest from c itself.
	pending, _ := br.Peek(br.Buffered())
	out, in := p.splice(c, pending, up)
	p.log.Info("tunnel closed", "client", client, "target", target,
		"bytes_out", out, "bytes_in", in, "duration", time.Since(start))
}

// allows reports whether a rule allows the normalized target.
func (p *Proxy) allows(host string, port uint16, literal bool) bool {
	for _, r := range p.rules {
		if r.d.Port != port {
			continue
		}
		if literal {
			if r.d.Addr.IsValid() && r.d.Addr == netip.MustParseAddr(host) {
				return true
			}
		} else if r.matchName(host) {
			return true
		}
	}
	return false
}

// connect resolves an allowed destination, checks its addresses and dials
// them in turn. On failure it returns the status and message to answer, and
// the cause in full for the log: the answer leaves out what the run has no
// business knowing (the host's resolver, its addresses).
func (p *Proxy) connect(ctx context.Context, host string, port uint16, literal bool) (net.Conn, int, string, error) {
	target := netJoin(host, port)
	ctx, cancel := context.WithTimeout(ctx, p.dialTimeout)
	defer cancel()
	var addrs []netip.Addr
	if literal {
		addrs = []netip.Addr{netip.MustParseAddr(host)}
	} else {
		var err error
		addrs, err = p.resolve(ctx, host)
		if err != nil {
			return nil, http.StatusBadGateway, fmt.Sprintf("egress: cannot resolve %s: %s", host, brief(err)), err
		}
		if len(addrs) == 0 {
			return nil, http.StatusBadGateway, fmt.Sprintf("egress: %s has no address", host), nil
		}
	}
	var refused, briefs []string
	var errs []error
	for _, a := range addrs {
		a = a.Unmap()
		if why := refusal(a); why != "" && !p.allowPrivate {
			refused = append(refused, a.String()+" is "+why)
			continue
		}
		up, err := p.dial(ctx, "tcp", netip.AddrPortFrom(a, port).String())
		if err == nil {
			return up, 0, "", nil
		}
		errs = append(errs, err)
		briefs = append(briefs, a.String()+": "+brief(err))
	}
	if len(errs) == 0 {
		return nil, http.StatusForbidden, fmt.Sprintf(
			"egress: %s refused: %s; loopback, link-local, private, CGNAT, multicast, unspecified, reserved and special-purpose destinations and the host's own addresses are refused",
			target, strings.Join(refused, ", ")), nil
	}
	return nil, http.StatusBadGateway, fmt.Sprintf("egress: cannot connect to %s: %s", target, strings.Join(briefs, "; ")), errors.Join(errs...)
}

// brief is the end of an error's chain worth telling the run: "no such
// host", "connection refused", "i/o timeout".
func brief(err error) string {
	var de *net.DNSError
	if errors.As(err, &de) {
		return de.Err
	}
	var se *os.SyscallError
	if errors.As(err, &se) {
		return se.Err.Error()
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "timed out"
	}
	if errors.Is(err, context.Canceled) {
		return "canceled"
	}
	return err.Error()
}

// parseTarget reads a CONNECT request target: host:port, the host a name
// (returned normalized) or an IP literal (returned unmapped, literal set).
func parseTarget(s string) (host string, port uint16, literal bool, err error) {
	h, ps, err := net.SplitHostPort(s)
	if err != nil {
		return "", 0, false, errors.New("not host:port")
	}
	n, perr := strconv.ParseUint(ps, 10, 16)
	if perr != nil || n == 0 {
		return "", 0, false, fmt.Errorf("port %q is not a number from 1 to 65535", ps)
	}
	port = uint16(n)
	if a, err := netip.ParseAddr(h); err == nil {
		if a.Zone() != "" {
			return "", 0, false, errors.New("an address with a zone")
		}
		return a.Unmap().String(), port, true, nil
	}
	if host, err = subagent.HostName(h); err != nil {
		return "", 0, false, err
	}
	return host, port, false, nil
}

// clipped bounds what a client sent before it reaches a log line.
func clipped(s string) string {
	if len(s) > 100 {
		return s[:100] + "…"
	}
	return s
}

func netJoin(host string, port uint16) string {
	return net.JoinHostPort(host, fmt.Sprint(port))
}

// answer writes a plain-text response and closes c once the client has
// read it: it half-closes, then discards what the client still sends for a
// moment, so that closing with unread input (a reset) cannot destroy the
// response before the client reads it.
func (p *Proxy) answer(ctx context.Context, c net.Conn, status int, body string) {
	stop := context.AfterFunc(ctx, func() { _ = c.Close() })
	defer stop()
	defer c.Close()
	body += "\n"
	var extra string
	if status == http.StatusMethodNotAllowed {
		extra = "Allow: CONNECT\r\n"
	}
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	_, err := fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\n%sConnection: close\r\n\r\n%s",
		status, http.StatusText(status), len(body), extra, body)
	if err != nil {
		return
	}
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		_, _ = io.Copy(io.Discard, io.LimitReader(c, 64<<10))
	}
}

// splice copies both ways until each side has finished sending, passing a
// half-close on, and returns the bytes copied from client to up and back.
// An error either way closes both connections.
func (p *Proxy) splice(client net.Conn, pending []byte, up net.Conn) (out, in int64) {
	var wg sync.WaitGroup
	wg.Go(func() {
		var err error
		if len(pending) > 0 {
			var n int
			n, err = up.Write(pending)
			out += int64(n)
			p.bytesOut.Add(uint64(n))
		}
		if err == nil {
			var n int64
			n, err = copyCounting(up, client, &p.bytesOut)
			out += n
		}
		finish(err, up, client)
	})
	n, err := copyCounting(client, up, &p.bytesIn)
	in = n
	finish(err, client, up)
	wg.Wait()
	return out, in
}

// finish ends one direction of a tunnel: after a clean end of input it
// half-closes dst (or closes it when it cannot half-close); after an error
// it closes both.
func finish(err error, dst, src net.Conn) {
	if err != nil {
		_ = dst.Close()
		_ = src.Close()
		return
	}
	if cw, ok := dst.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		return
	}
	_ = dst.Close()
}

var bufPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// copyCounting copies src to dst until src ends, adding every chunk written
// to counter as it goes, so that long tunnels show in Stats while open.
func copyCounting(dst io.Writer, src io.Reader, counter *atomic.Uint64) (int64, error) {
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	var total int64
	for {
		nr, rerr := src.Read(buf)
		if nr > 0 {
			nw, werr := dst.Write(buf[:nr])
			total += int64(nw)
			counter.Add(uint64(nw))
			if werr != nil {
				return total, werr
			}
		}
		if rerr == io.EOF {
			return total, nil
		}
		if rerr != nil {
			return total, rerr
		}
	}
}
