package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os/signal"
	"syscall"

	"github.com/nats-io/nats.go"

	"github.com/agora-dispatch/agora/answerers/inbox"
)

// The inbox mounted on a listener shared with other handlers, as agora dev
// does: Handler serves everything under /inbox, Run keeps the questions
// current and feeds the live pages.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer nc.Drain()
	s, err := inbox.New(inbox.Config{DevToken: true}, inbox.Deps{Conn: nc})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("inbox: " + inbox.LoginLink("http://127.0.0.1:8080", s.DevToken()))

	mux := http.NewServeMux()
	mux.Handle(inbox.Prefix+"/", s.Handler())
	srv := &http.Server{Addr: "127.0.0.1:8080", Handler: mux}
	go func() {
		if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Println(err)
		}
	}()
	if err := s.Run(ctx); err != nil { // blocks; ends the live streams on cancel
		fmt.Println(err)
	}
	_ = srv.Shutdown(context.Background())
}
