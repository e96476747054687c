package webhook

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	deliveries *prometheus.CounterVec
	retries    *prometheus.CounterVec
	declined   *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "agora", Subsystem: "webhook", Name: "deliveries_total",
			Help: "Questions handled, by route and result (delivered; skipped: no longer asked there; declined: the POST failed for good and the question went to the fallback).",
		}, []string{"route", "result"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "agora", Subsystem: "webhook", Name: "retries_total",
			Help: "POSTs retried after a failure, by route.",
		}, []string{"route"}),
		declined: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "agora", Subsystem: "webhook", Name: "declined_total",
			Help: "Questions declined to the route's fallback because they could not be posted, by route.",
		}, []string{"route"}),
	}
	for _, c := range []prometheus.Collector{m.deliveries, m.retries, m.declined} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("webhook: metrics: %w", err)
		}
	}
	return m, nil
}
