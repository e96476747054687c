package worker_test

import (
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/services/worker"
)

// The dispatcher sends a dispatch's accepted event and its work message
// back to back to two streams, which do not store in the order they were
// sent: the work can be delivered before the event is stored. A worker that
// fenced its `started` on the empty chain would have it stored before the
// accepted event, and its terminal event refused once that landed. Here the
// accepted event comes only after the first delivery gave up waiting: no
// `started` may be stored before it, and the dispatch then runs once, its
// chain in order (docs/worker.md#fencing).
func TestWorkDeliveredBeforeItsAcceptedEvent(t *testing.T) {
	h := newHarness(t, provision.Config{})
	h.shell("quick", `echo '{"ok":true}' > "$AGORA_OUTPUT_FILE"`)
	reg := prometheus.NewRegistry()
	h.startWorker(h.workerConfig(), worker.Deps{Registerer: reg})

	req := lifecycle.Request{DispatchID: lifecycle.NewID(), Subagent: "quick"}
	req.ThreadID = req.DispatchID
	h.dispatchMsg(req, func(m *nats.Msg) { m.Header.Set(lifecycle.AcceptedHeader, lifecycle.AcceptedID(req.DispatchID)) })

	// The first delivery waits, finds nothing and returns the message.
	testkit.Eventually(t, 30*time.Second, "the work message redelivered", func() bool {
		return testkit.Counter(t, reg, "agora_worker_accepted_waits_total", map[string]string{"outcome": "not_stored"}) >= 1 &&
			natstest.ConsumerInfo(t, h.js, lifecycle.StreamDispatch, lifecycle.ConsumerWorkers).NumRedelivered >= 1
	})
	if ks := kinds(h.events(req.DispatchID)); len(ks) != 0 {
		t.Fatalf("events before the accepted event was stored: %v", ks)
	}

	h.publishEvent(&lifecycle.Accepted{Common: lifecycle.Common{DispatchID: req.DispatchID, ThreadID: req.ThreadID, Subagent: req.Subagent}})
	r := h.terminal(req.DispatchID)
	if f, ok := r.Data.(*lifecycle.Finished); !ok || string(f.Output) != `{"ok":true}` {
		t.Fatalf("terminal %T %+v, want finished with the run's output", r.Data, r.Data)
	}
	got := kinds(h.events(req.DispatchID))
	if want := []lifecycle.Kind{lifecycle.KindAccepted, lifecycle.KindStarted, lifecycle.KindFinished}; !slices.Equal(got, want) {
		t.Fatalf("chain %v, want %v", got, want)
	}
	h.waitWorkEmpty()
}
