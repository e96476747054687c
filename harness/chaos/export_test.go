package chaos

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// AuditAskOnce runs the audit's ask-once checks on the question records
// in js, with the re-dispatches counted per dispatch (children) and the
// answered events per question (answered).
func AuditAskOnce(ctx context.Context, js jetstream.JetStream, children, answered map[string]int) Report {
	var r Report
	auditAskOnce(ctx, js, children, answered, &r, func(f string, a ...any) { r.Anomalies = append(r.Anomalies, fmt.Sprintf(f, a...)) })
	return r
}
