// Command agora is Agora's command-line interface: `agora dev` runs
// everything in one process on an embedded NATS server; the other verbs are
// clients and tools.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRoot().ExecuteContext(ctx)
	stop()
	if err != nil {
		var ec exitCoder
		code := 1
		if asExit(err, &ec) {
			code = ec.ExitCode()
		}
		if msg := err.Error(); msg != "" {
			fmt.Fprintln(os.Stderr, "agora:", msg)
		}
		os.Exit(code)
	}
}
