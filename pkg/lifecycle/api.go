package lifecycle

import "time"

// PrincipalHeader carries, on agora.api.dispatch, the principal a door
// dispatches for (docs/security.md, "Principals and scopes"). The SDK sets
// it with client.OnBehalfOf.
const PrincipalHeader = "Agora-Principal"

// CancelRequest is the body of agora.api.cancel (and of the core messages
// the dispatcher sends on agora.control.cancel.<dispatch_id> and
// agora.control.cancel-thread.<thread_id>). Set DispatchID to cancel one
// dispatch or ThreadID to cancel a whole thread.
type CancelRequest struct {
	DispatchID string `json:"dispatch_id,omitempty"`
	ThreadID   string `json:"thread_id,omitempty"`
	// By names who cancels; the dispatcher uses "api" when it is empty.
	By     string `json:"by,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// DecisionsRequest is the body of agora.api.decisions.
type DecisionsRequest struct {
	// Route keeps one route's decisions; empty lists all.
	Route string `json:"route,omitempty"`
}

// ForgetRequest is the body of agora.api.decisions.forget.
type ForgetRequest struct {
	ID string `json:"id"`
}

// RuntimeAnnouncement is what a worker writes in the agora_runtimes
// bucket (BucketRuntimes), under a runtime's name, when it starts: that
// it offers the runtime (docs/subagents.md, "Writing a runtime").
type RuntimeAnnouncement struct {
	Runtime     string    `json:"runtime"`
	WorkerID    string    `json:"worker_id"`
	AnnouncedAt time.Time `json:"announced_at"`
}
