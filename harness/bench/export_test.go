package bench

import (
	"context"
	"io"

	"github.com/agora-dispatch/agora/services/worker"
)

// PendingWith is Pending with rt as the sub-agent's runtime instead of
// one that always asks.
func PendingWith(ctx context.Context, cfg PendingConfig, rt worker.InProcess, progress io.Writer) (PendingReport, error) {
	cfg.runtime = rt
	return Pending(ctx, cfg, progress)
}
