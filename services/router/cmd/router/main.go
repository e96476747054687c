// Command router runs Agora's router: it turns needs_input events into
// questions for answerers, validates answers and re-dispatches them, and
// runs deadlines, escalation and expiry (see services/router).
//
// Settings come from AGORA_* variables: AGORA_NATS_URL, AGORA_NATS_CREDS,
// AGORA_ROUTER_CONFIG (the routing file), AGORA_ROUTER_HTTP_ADDR,
// AGORA_ROUTER_TICK, … SIGHUP reloads the routing file; an invalid file is
// logged and the routes in use stay.
package main

import (
	"context"
	"log/slog"
	"os"

	"github.com/agora-dispatch/agora/internal/svc"
	"github.com/agora-dispatch/agora/services/router"
)

func main() {
	os.Exit(svc.Main("router", func(_ context.Context, cfg router.Config, log *slog.Logger) (svc.Runner, error) {
		return router.New(cfg, router.Deps{Logger: log})
	}))
}
