package webhook

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/agora-dispatch/agora/internal/svc"
)

type metrics struct {
	deliveries *prometheus.CounterVec
	retries    *prometheus.CounterVec
	declined   *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	r := svc.NewMetrics(reg, "webhook")
	m := &metrics{
		deliveries: r.CounterVec("deliveries_total",
			"Questions handled, by route and result (delivered; skipped: no longer asked there; declined: the POST failed for good and the question went to the fallback).", "route", "result"),
		retries: r.CounterVec("retries_total", "POSTs retried after a failure, by route.", "route"),
		declined: r.CounterVec("declined_total",
			"Questions declined to the route's fallback because they could not be posted, by route.", "route"),
	}
	return m, r.Err()
}
