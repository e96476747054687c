package egress_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strconv"

	"github.com/agora-dispatch/agora/internal/egress"
)

// A proxy that lets a run reach one HTTPS server. In the sandbox the
// listener is the one the run's launcher created inside the run's network
// namespace; here it is an ordinary loopback listener, and the "remote"
// server is a local test server that example.com resolves to.
func Example() {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "hello through the proxy")
	}))
	defer srv.Close()
	port := srv.Listener.Addr().(*net.TCPAddr).Port

	p, err := egress.New(egress.Config{
		Allow: []string{"example.com:" + strconv.Itoa(port)},
		// Only because the test server listens on loopback; a real
		// proxy leaves private destinations refused.
		AllowPrivate: true,
		Resolver: func(context.Context, string) ([]netip.Addr, error) {
			return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- p.Serve(ctx, ln) }()

	// The run's side: HTTPS_PROXY=http://127.0.0.1:<port>.
	client := srv.Client()
	tr := client.Transport.(*http.Transport)
	tr.Proxy = http.ProxyURL(&url.URL{Scheme: "http", Host: ln.Addr().String()})
	resp, err := client.Get(fmt.Sprintf("https://example.com:%d/", port))
	if err != nil {
		fmt.Println(err)
		return
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	fmt.Println(resp.Status, string(body))

	_, err = client.Get(fmt.Sprintf("https://www.example.com:%d/", port))
	fmt.Println("www.example.com refused:", err != nil)

	tr.CloseIdleConnections()
	cancel()
	fmt.Println("Serve:", <-served)
	st := p.Stats()
	fmt.Println("allowed:", st.Allowed, "denied:", st.Denied)
	// Output:
	// 200 OK hello through the proxy
	// www.example.com refused: true
	// Serve: <nil>
	// allowed: 1 denied: 1
}
