package chaos

import (
	"net"
	"net/url"
	"sync"
)

// blackhole forwards one worker's NATS connections to the server, so the
// soak can blackhole them (docs/chaos.md): while held, no byte moves
// either way and the connections stay open, as on a network that drops
// everything without a reset; on release what was held flows again.
type blackhole struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	held  chan struct{} // non-nil while held; closed on release
	conns map[net.Conn]struct{}
	done  bool
}

// newBlackhole listens on loopback and forwards to the server at natsURL.
func newBlackhole(natsURL string) (*blackhole, error) {
	u, err := url.Parse(natsURL)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	b := &blackhole{ln: ln, target: u.Host, conns: map[net.Conn]struct{}{}}
	go b.serve()
	return b, nil
}

// URL is the NATS URL the worker connects to.
func (b *blackhole) URL() string { return "nats://" + b.ln.Addr().String() }

func (b *blackhole) serve() {
	for {
		c, err := b.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", b.target)
		if err != nil {
			c.Close()
			continue
		}
		if !b.track(c, s) {
			return
		}
		go b.pipe(s, c)
		go b.pipe(c, s)
	}
}

func (b *blackhole) track(cs ...net.Conn) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done {
		for _, c := range cs {
			c.Close()
		}
		return false
	}
	for _, c := range cs {
		b.conns[c] = struct{}{}
	}
	return true
}

// pipe copies src to dst, waiting before each write while held; it
// closes both when either side ends.
func (b *blackhole) pipe(dst, src net.Conn) {
	defer func() {
		dst.Close()
		src.Close()
		b.mu.Lock()
		delete(b.conns, dst)
		delete(b.conns, src)
		b.mu.Unlock()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			b.wait()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // io.EOF or a closed connection: both sides go
		}
	}
}

func (b *blackhole) wait() {
	b.mu.Lock()
	h := b.held
	b.mu.Unlock()
	if h != nil {
		<-h
	}
}

// waitOpen blocks while the blackhole is held.
func (b *blackhole) waitOpen() { b.wait() }

// hold stops every byte until release.
func (b *blackhole) hold() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.held == nil {
		b.held = make(chan struct{})
	}
}

// release lets what was held flow again.
func (b *blackhole) release() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.held != nil {
		close(b.held)
		b.held = nil
	}
}

// close releases, stops listening and closes every connection.
func (b *blackhole) close() {
	b.release()
	b.mu.Lock()
	b.done = true
	conns := b.conns
	b.conns = map[net.Conn]struct{}{}
	b.mu.Unlock()
	b.ln.Close()
	for c := range conns {
		c.Close()
	}
}
