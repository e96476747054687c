package worker

import (
	"fmt"
	"net"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

type metrics struct {
	dispatches *prometheus.CounterVec
	duration   *prometheus.HistogramVec
	inFlight   prometheus.Gauge
	progress   prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, slots int) (*metrics, error) {
	m := &metrics{
		dispatches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "agora", Subsystem: "worker", Name: "dispatches_total",
			Help: "Deliveries handled, by terminal kind and failure reason (kind empty for skipped, retried and undecodable deliveries, named in reason).",
		}, []string{"kind", "reason"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "agora", Subsystem: "worker", Name: "run_duration_seconds",
			Help:    "Time from taking a delivery to publishing its terminal event, by terminal kind.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 12),
		}, []string{"kind"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "agora", Subsystem: "worker", Name: "in_flight",
			Help: "Deliveries being handled now.",
		}),
		progress: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "agora", Subsystem: "worker", Name: "progress_reports_total",
			Help: "Progress reports published (coalesced from the runs' progress lines).",
		}),
	}
	slotsGauge := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "agora", Subsystem: "worker", Name: "slots",
		Help: "Dispatches this worker runs at once (its concurrency): in_flight / slots is its utilisation.",
	}, func() float64 { return float64(slots) })
	for _, c := range []prometheus.Collector{m.dispatches, m.duration, m.inFlight, m.progress, slotsGauge} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("worker: metrics: %w", err)
		}
	}
	return m, nil
}

func (m *metrics) outcome(k lifecycle.Kind, reason lifecycle.Reason) {
	m.dispatches.WithLabelValues(string(k), string(reason)).Inc()
}

func metricsHandler(g prometheus.Gatherer) http.Handler {
	if g == nil {
		return http.NotFoundHandler()
	}
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{})
}

func listen(addr string) (net.Listener, error) { return net.Listen("tcp", addr) }
