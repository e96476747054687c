package dispatcher

import (
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

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
	reconciled prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "agora", Subsystem: "dispatcher", Name: "requests_total",
			Help: "Dispatch requests handled, by door (stream, micro, http) and result (accepted, duplicate, rejected, conflict, max_rounds, error); a stream request counted as conflict was dropped (docs/dispatcher.md).",
		}, []string{"door", "result"}),
		accept: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "agora", Subsystem: "dispatcher", Name: "request_duration_seconds",
			Help:    "Time to handle a dispatch request, by door.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10),
		}, []string{"door"}),
		dispatches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "agora", Subsystem: "dispatcher", Name: "dispatches_total",
			Help: "Dispatches that reached a terminal event, by kind and failure reason, counted once per dispatch by the status projection.",
		}, []string{"kind", "reason"}),
		projected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "agora", Subsystem: "dispatcher", Name: "events_projected_total",
			Help: "Lifecycle events applied to dispatch records, by kind (redeliveries are not counted; accepted is counted when the record is created with it).",
		}, []string{"kind"}),
	}
	m.reconciled = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "agora", Subsystem: "dispatcher", Name: "reconciled_total",
		Help: "Interrupted acceptances (records left unqueued) that the reconciler completed.",
	})
	for _, c := range []prometheus.Collector{m.requests, m.accept, m.dispatches, m.projected, m.reconciled} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("dispatcher: metrics: %w", err)
		}
	}
	return m, nil
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

func metricsHandler(g prometheus.Gatherer) http.Handler {
	if g == nil {
		return http.NotFoundHandler()
	}
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{})
}
