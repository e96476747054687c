package worker_test

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/internal/testkit"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/services/worker"
)

// A work message names the stream sequence of its dispatch's accepted
// event (lifecycle.AcceptedSeqHeader): a first delivery fences its
// `started` on it and reads nothing from AGORA_LIFECYCLE. The stream
// checks the fence, so a sequence that is no longer the chain's last — a
// cancel while the work was queued, a value that was never right — costs
// a refused `started` and a read, never a run that does not own its
// dispatch; a redelivery reads the chain first (docs/worker.md#fencing).
func TestFirstDeliveryFencesOnTheAcceptedSequence(t *testing.T) {
	for _, tc := range []struct {
		name string
		// after runs between the accepted event and the work message.
		after func(h *harness, c lifecycle.Common)
		// header gives the header's value from the accepted event's
		// sequence.
		header func(accepted uint64) string
		// redeliver returns the first delivery unacknowledged, so the
		// worker gets attempt 2.
		redeliver bool
		// subagent, when set, names a sub-agent that is not defined:
		// the run ends failed before it claims the dispatch.
		subagent string
		want     []lifecycle.Kind
		ran      bool
		reads    bool   // the worker reads the chain
		from     string // agora_worker_fences_total's label
		// starts is how many `started` the worker sends: a refused one
		// is followed by a read, not sent again on the same fence.
		starts int32
	}{{
		name:   "the accepted event's sequence",
		header: func(a uint64) string { return strconv.FormatUint(a, 10) },
		want:   []lifecycle.Kind{lifecycle.KindAccepted, lifecycle.KindStarted, lifecycle.KindFinished},
		ran:    true, from: "work_message", starts: 1,
	}, {
		name: "cancelled while queued",
		after: func(h *harness, c lifecycle.Common) {
			h.publishEvent(&lifecycle.Cancelled{Common: c, By: "bob"})
		},
		header: func(a uint64) string { return strconv.FormatUint(a, 10) },
		want:   []lifecycle.Kind{lifecycle.KindAccepted, lifecycle.KindCancelled},
		reads:  true, from: "work_message", starts: 1,
	}, {
		name:   "a sequence past the chain",
		header: func(a uint64) string { return strconv.FormatUint(a+1000, 10) },
		want:   []lifecycle.Kind{lifecycle.KindAccepted, lifecycle.KindStarted, lifecycle.KindFinished},
		ran:    true, reads: true, from: "work_message", starts: 2,
	}, {
		// `failed` is refused on the wrong fence and follows the chain's
		// `accepted`, as `started` does, rather than leave the message
		// to AckWait.
		name:     "a sequence past the chain, no definition",
		header:   func(a uint64) string { return strconv.FormatUint(a+1000, 10) },
		subagent: "undefined",
		want:     []lifecycle.Kind{lifecycle.KindAccepted, lifecycle.KindFailed},
		reads:    true, from: "work_message",
	}, {
		name:   "not a sequence",
		header: func(uint64) string { return "first" },
		want:   []lifecycle.Kind{lifecycle.KindAccepted, lifecycle.KindStarted, lifecycle.KindFinished},
		ran:    true, reads: true, from: "read", starts: 1,
	}, {
		name:      "a redelivery",
		header:    func(a uint64) string { return strconv.FormatUint(a, 10) },
		redeliver: true,
		want:      []lifecycle.Kind{lifecycle.KindAccepted, lifecycle.KindStarted, lifecycle.KindFinished},
		ran:       true, reads: true, from: "read", starts: 1,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, provision.Config{})
			marks := t.TempDir()
			h.shell("marker", `touch "$MARKS/ran"; echo '{"ok":true}' > "$AGORA_OUTPUT_FILE"`)
			req := lifecycle.Request{DispatchID: lifecycle.NewID(), Subagent: "marker", Env: map[string]string{"MARKS": marks}}
			if tc.subagent != "" {
				req.Subagent = tc.subagent
			}
			req.ThreadID = req.DispatchID
			c := lifecycle.Common{DispatchID: req.DispatchID, ThreadID: req.ThreadID, Subagent: req.Subagent}
			seq := h.publishEvent(&lifecycle.Accepted{Common: c})
			if tc.after != nil {
				tc.after(h, c)
			}
			h.dispatchMsg(req, func(m *nats.Msg) {
				m.Header.Set(lifecycle.AcceptedHeader, lifecycle.AcceptedID(req.DispatchID))
				m.Header.Set(lifecycle.AcceptedSeqHeader, tc.header(seq))
			})
			if tc.redeliver {
				returnFirstDelivery(t, h)
			}

			// Every read of the chain, by direct get or through the
			// stream leader, from here on.
			var reads atomic.Int32
			for _, subj := range []string{"$JS.API.DIRECT.GET." + lifecycle.StreamLifecycle + ".>", "$JS.API.STREAM.MSG.GET." + lifecycle.StreamLifecycle} {
				sub, err := h.nc.Subscribe(subj, func(*nats.Msg) { reads.Add(1) })
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = sub.Unsubscribe() })
			}
			// Every `started` sent, stored or refused.
			var starts atomic.Int32
			sub, err := h.nc.Subscribe(lifecycle.LifecycleFilter(lifecycle.KindStarted, "", req.DispatchID), func(*nats.Msg) { starts.Add(1) })
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = sub.Unsubscribe() })
			if err := h.nc.Flush(); err != nil {
				t.Fatal(err)
			}

			reg := prometheus.NewRegistry()
			h.startWorker(h.workerConfig(), worker.Deps{Registerer: reg})
			h.waitWorkEmpty()
			h.terminal(req.DispatchID)
			if got := kinds(h.events(req.DispatchID)); !slices.Equal(got, tc.want) {
				t.Fatalf("chain %v, want %v", got, tc.want)
			}
			if _, err := os.Stat(filepath.Join(marks, "ran")); (err == nil) != tc.ran {
				t.Errorf("the sub-agent ran: %v, want %v", err == nil, tc.ran)
			}
			if err := h.nc.Flush(); err != nil {
				t.Fatal(err)
			}
			if n := reads.Load(); (n > 0) != tc.reads {
				t.Errorf("the worker read the chain %d times; want reads: %v", n, tc.reads)
			}
			if n := starts.Load(); n != tc.starts {
				t.Errorf("%d started events sent, want %d", n, tc.starts)
			}
			if n := testkit.Counter(t, reg, "agora_worker_fences_total", map[string]string{"from": tc.from}); n != 1 {
				t.Errorf("agora_worker_fences_total{from=%q} = %v, want 1", tc.from, n)
			}
		})
	}
}

// returnFirstDelivery takes the next work message from the workers'
// consumer and returns it at once, so its next delivery is attempt 2.
func returnFirstDelivery(t *testing.T, h *harness) {
	t.Helper()
	c, err := h.js.Consumer(t.Context(), lifecycle.StreamDispatch, lifecycle.ConsumerWorkers)
	if err != nil {
		t.Fatal(err)
	}
	batch, err := c.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for m := range batch.Messages() {
		if err := m.Nak(); err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n != 1 {
		t.Fatalf("took %d work messages, want 1 (%v)", n, batch.Error())
	}
}
