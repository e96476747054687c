package svc

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// ServeHTTP listens on addr and serves srv there from a goroutine of its
// own: with serve when it is not nil (srv.ServeTLS with the service's
// files, say), else with srv.Serve. It returns the address listened on and
// a channel that receives the error Serve ended with, prefixed with name,
// unless it is http.ErrServerClosed (a Shutdown). A failure to listen is
// returned as "<name>: <setting>=<addr>: <cause>", setting being the
// variable that set addr.
func ServeHTTP(name, setting, addr string, srv *http.Server, serve func(net.Listener) error) (net.Addr, <-chan error, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %s=%s: %w", name, setting, addr, err)
	}
	if serve == nil {
		serve = srv.Serve
	}
	errs := make(chan error, 1)
	go func() {
		if err := serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errs <- fmt.Errorf("%s: http: %w", name, err)
		}
	}()
	return ln.Addr(), errs, nil
}

// AwaitWork waits for done, which a service closes when its work in
// flight has ended, for up to timeout (its shutdown timeout). Past that it
// logs giveUp, calls abandon to cancel the work, and waits 5 s more,
// logging stuck if the work still has not ended.
func AwaitWork(log *slog.Logger, done <-chan struct{}, timeout time.Duration, abandon func(), giveUp, stuck string) {
	select {
	case <-done:
	case <-time.After(timeout):
		log.Warn(giveUp)
		abandon()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			log.Warn(stuck)
		}
	}
}
