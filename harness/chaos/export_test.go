package chaos

import (
	"context"
	"encoding/json"
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

// DoorOf is the door thread i of the soak goes through.
func DoorOf(i int) string { return doorOf(i) }

// TaskEnd is how a door reports a thread's end.
type TaskEnd = taskEnd

// NewTaskEnd is a door's report of a task in state with output.
func NewTaskEnd(state string, output json.RawMessage) TaskEnd {
	return taskEnd{state: state, output: output}
}

// AuditDoorEnds checks the doors' reports of their threads' ends against
// the lifecycle stream in js.
func AuditDoorEnds(ctx context.Context, js jetstream.JetStream, threadDoor map[string]string, ends map[string]TaskEnd) Report {
	var r Report
	auditDoorEnds(ctx, js, threadDoor, ends, &r)
	return r
}
