package chaos

import (
	"context"
	"fmt"
	"time"

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

// Audit runs the audit of the streams, records and question records in js
// for threads, whose sub-agent wrote its nonces into side, as Run does
// once the soak is over.
func Audit(ctx context.Context, js jetstream.JetStream, threads []string, side string) Report {
	r := Report{Threads: len(threads)}
	audit(ctx, js, threads, side, "agora-chaos-audit-test-no-such-process", &r)
	return r
}

// ClearWorkspaces empties the soak's workspace root as Run does once every
// worker has ended, within that long.
func ClearWorkspaces(root string, within time.Duration) (swept int, left []string, err error) {
	return clearWorkspaces(root, within)
}
