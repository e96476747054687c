package dispatcher_test

import (
	"net/http"
	"strconv"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/services/dispatcher"
)

// The work message names the stream sequence of its dispatch's accepted
// event (lifecycle.AcceptedSeqHeader), stored before it: a worker's first
// delivery fences its `started` on it without reading the chain
// (docs/worker.md#fencing). An acceptance completed by a retry, after the
// first attempt stored `accepted` and failed to queue, names the event the
// first attempt stored, and stores no second one.
func TestWorkMessageNamesItsAcceptedSequence(t *testing.T) {
	for _, tc := range []struct {
		name string
		// queueFailsFirst deletes the work stream before the dispatch,
		// so its acceptance stores `accepted` and fails to queue, then
		// provisions it again and retries with the dispatch's id.
		queueFailsFirst bool
	}{
		{name: "fresh dispatch"},
		{name: "retry after a failed queue", queueFailsFirst: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, dispatcher.Config{})
			id := lifecycle.NewID()
			body := `{"dispatch_id":"` + id + `","subagent":"planner","input":{"task":"t"}}`
			if tc.queueFailsFirst {
				if err := h.js.DeleteStream(t.Context(), lifecycle.StreamDispatch); err != nil {
					t.Fatal(err)
				}
				if resp, b := h.do(http.MethodPost, "/v1/dispatches", body, ""); resp.StatusCode != http.StatusServiceUnavailable {
					t.Fatalf("with the work stream gone: status %d %s, want 503", resp.StatusCode, b)
				}
				if err := provision.Ensure(t.Context(), h.js, provision.Config{}); err != nil {
					t.Fatal(err)
				}
			}
			if resp, b := h.do(http.MethodPost, "/v1/dispatches", body, ""); resp.StatusCode >= 300 {
				t.Fatalf("dispatch: status %d %s", resp.StatusCode, b)
			}

			accepted := natstest.Stored(t, h.js, lifecycle.StreamLifecycle, lifecycle.LifecycleFilter(lifecycle.KindAccepted, "", id))
			if len(accepted) != 1 {
				t.Fatalf("%d accepted events for %s, want 1", len(accepted), id)
			}
			md, err := accepted[0].Metadata()
			if err != nil {
				t.Fatal(err)
			}
			work := workMessages(t, h)
			if len(work) != 1 {
				t.Fatalf("%d work messages, want 1", len(work))
			}
			if got, want := work[0].Header.Get(lifecycle.AcceptedSeqHeader), strconv.FormatUint(md.Sequence.Stream, 10); got != want {
				t.Errorf("%s = %q, want the accepted event's stream sequence %s", lifecycle.AcceptedSeqHeader, got, want)
			}
			if got := work[0].Header.Get(jetstream.MsgIDHeader); got != id {
				t.Errorf("work message's Nats-Msg-Id %q, want %q", got, id)
			}
		})
	}
}
