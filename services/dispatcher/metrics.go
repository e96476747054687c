package dispatcher

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/agora-dispatch/agora/internal/svc"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// The doors a request comes through (the door label).
const (
	doorStream = "stream"
	doorMicro  = "micro"
	doorHTTP   = "http"
)

// Request outcomes (the result label).
const (
	resultAccepted  = "accepted"   // a new dispatch was accepted and queued
	resultDuplicate = "duplicate"  // the dispatch id existed: its record was returned
	resultRejected  = "rejected"   // the request was invalid
	resultConflict  = "conflict"   // the dispatch id belongs to a different request
	resultMaxRounds = "max_rounds" // recorded as failed max-rounds
	resultError     = "error"      // a temporary failure: the caller or the stream retries
)

type metrics struct {
	requests   *prometheus.CounterVec
	accept     *prometheus.HistogramVec
	dispatches *prometheus.CounterVec
	projected  *prometheus.CounterVec
	// projectionWrites counts the projection's record writes: the expiry
	// of a thread's records when it ends, and the record of a request
	// refused on the stream. Statuses are not written (chain.go).
	projectionWrites prometheus.Counter
	reconciled       prometheus.Counter
	reconcilePasses  prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	r := svc.NewMetrics(reg, "dispatcher")
	m := &metrics{
		requests: r.CounterVec("requests_total",
			"Dispatch requests handled, by door (stream, micro, http) and result (accepted, duplicate, rejected, conflict, max_rounds, error); a stream request counted as conflict was dropped (docs/dispatcher.md).", "door", "result"),
		accept: r.HistogramVec("request_duration_seconds", "Time to handle a dispatch request, by door.",
			prometheus.ExponentialBuckets(0.0001, 4, 10), "door"),
		dispatches: r.CounterVec("dispatches_total",
			"Dispatches that reached a terminal event, by kind and failure reason, counted by the projection when the event is first delivered to it (a redelivery is not counted; a projection consumer rebuilt from the stream's start counts again).", "kind", "reason"),
		projected: r.CounterVec("events_projected_total",
			"Lifecycle events the projection consumed, by kind, each counted on its first delivery.", "kind"),
		projectionWrites: r.Counter("projection_writes_total",
			"Dispatch record writes by the projection: the expiry of each record of a thread that ended, and the record of a request refused on the stream. No status is written: every door derives it from the dispatch's events."),
		reconciled:      r.Counter("reconciled_total", "Interrupted acceptances the reconciler completed: work messages it stored (a queue publish that was a duplicate is not counted)."),
		reconcilePasses: r.Counter("reconcile_passes_total", "Reconciler passes completed (at start, then every AGORA_DISPATCHER_RECONCILE_GRACE)."),
	}
	return m, r.Err()
}

func (m *metrics) request(door, result string, start time.Time) {
	m.requests.WithLabelValues(door, result).Inc()
	m.accept.WithLabelValues(door).Observe(time.Since(start).Seconds())
}

func (m *metrics) applied(k lifecycle.Kind, reason lifecycle.Reason) {
	m.projected.WithLabelValues(string(k)).Inc()
	if k.Terminal() {
		m.dispatches.WithLabelValues(string(k), string(reason)).Inc()
	}
}
