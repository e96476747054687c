package worker

import (
	"net"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/agora-dispatch/agora/internal/egress"
	"github.com/agora-dispatch/agora/internal/svc"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

type metrics struct {
	dispatches *prometheus.CounterVec
	duration   *prometheus.HistogramVec
	inFlight   prometheus.Gauge
	progress   prometheus.Counter
	// acceptedWaits counts runs that found their dispatch's chain empty
	// though their work message follows an accepted event (fence.go), by
	// outcome: "stored" once it was read, "not_stored" when the message
	// went back for redelivery.
	acceptedWaits *prometheus.CounterVec
	// fences counts how deliveries learned their fence (fence.go), by
	// from: "work_message" (a first delivery naming its accepted event's
	// sequence) or "read" (the chain read by direct get).
	fences *prometheus.CounterVec
	// sweeps counts the workspace sweeps this worker ran (at its start and
	// every AGORA_WORKER_SWEEP_INTERVAL); swept the workspaces they removed.
	sweeps, swept prometheus.Counter
	// egress counts the connections runs' egress proxies judged, by
	// sub-agent and verdict; egressBytes what they carried, by direction.
	egress, egressBytes *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, slots int) (*metrics, error) {
	r := svc.NewMetrics(reg, "worker")
	m := &metrics{
		dispatches: r.CounterVec("dispatches_total",
			"Deliveries handled, by terminal kind and failure reason (kind empty for skipped, retried and undecodable deliveries, named in reason).", "kind", "reason"),
		duration: r.HistogramVec("run_duration_seconds", "Time from taking a delivery to publishing its terminal event, by terminal kind.",
			prometheus.ExponentialBuckets(0.001, 4, 12), "kind"),
		inFlight: r.Gauge("in_flight", "Deliveries being handled now."),
		progress: r.Counter("progress_reports_total", "Progress reports published (coalesced from the runs' progress lines)."),
		acceptedWaits: r.CounterVec("accepted_waits_total",
			"Runs that found their dispatch's event chain empty although an accepted event was sent before their work message, and waited for it, by outcome (stored, not_stored: returned for redelivery).", "outcome"),
		fences: r.CounterVec("fences_total",
			"Deliveries by where their fence came from: work_message (a first delivery fenced on the accepted event's sequence its work message names, without a read) or read (the dispatch's chain read by direct get).", "from"),
		sweeps: r.Counter("workspace_sweeps_total", "Workspace sweeps run (at the worker's start and every AGORA_WORKER_SWEEP_INTERVAL)."),
		swept:  r.Counter("workspaces_swept_total", "Abandoned workspaces the sweeps removed (no run held them)."),
		egress: r.CounterVec("egress_connections_total",
			"Connections the runs' egress proxies judged, by sub-agent and verdict: allowed (tunnel made), denied (not allowed, or an address refused), failed (unreachable), rejected (malformed, not CONNECT), busy (the connection limit).", "subagent", "verdict"),
		egressBytes: r.CounterVec("egress_bytes_total", "Bytes the runs' egress tunnels carried, by sub-agent and direction (out: to the destinations, in: back).", "subagent", "direction"),
	}
	r.GaugeFunc("slots", "Dispatches this worker runs at once (its concurrency): in_flight / slots is its utilisation.",
		func() float64 { return float64(slots) })
	return m, r.Err()
}

func (m *metrics) outcome(k lifecycle.Kind, reason lifecycle.Reason) {
	m.dispatches.WithLabelValues(string(k), string(reason)).Inc()
}

func listen(addr string) (net.Listener, error) { return net.Listen("tcp", addr) }

// egressOf adds a finished run's egress proxy counters.
func (m *metrics) egressOf(subagent string, st egress.Stats) {
	for verdict, n := range map[string]uint64{"allowed": st.Allowed, "denied": st.Denied, "failed": st.Failed, "rejected": st.Rejected, "busy": st.Busy} {
		if n > 0 {
			m.egress.WithLabelValues(subagent, verdict).Add(float64(n))
		}
	}
	if st.BytesOut > 0 {
		m.egressBytes.WithLabelValues(subagent, "out").Add(float64(st.BytesOut))
	}
	if st.BytesIn > 0 {
		m.egressBytes.WithLabelValues(subagent, "in").Add(float64(st.BytesIn))
	}
}
