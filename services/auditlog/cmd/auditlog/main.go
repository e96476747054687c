// Command auditlog writes Agora's decision log (see services/auditlog and
// docs/audit.md).
//
// Settings: AGORA_NATS_URL, AGORA_NATS_CREDS, AGORA_AUDIT_CHECKPOINT_EVERY,
// AGORA_AUDIT_CHECKPOINT_INTERVAL, AGORA_AUDIT_SIGNING_KEY_FILE,
// AGORA_AUDIT_HTTP_ADDR.
package main

import (
	"context"
	"log/slog"
	"os"

	"github.com/agora-dispatch/agora/internal/svc"
	"github.com/agora-dispatch/agora/services/auditlog"
)

func main() {
	os.Exit(svc.Main("auditlog", func(_ context.Context, cfg auditlog.Config, log *slog.Logger) (svc.Runner, error) {
		return auditlog.New(cfg, auditlog.Deps{Logger: log})
	}))
}
