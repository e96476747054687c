package auditlog

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/agora-dispatch/agora/internal/svc"
)

type metrics struct {
	entries   *prometheus.CounterVec
	conflicts prometheus.Counter
	retries   prometheus.Counter
	head      prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	r := svc.NewMetrics(reg, "audit")
	m := &metrics{
		entries:   r.CounterVec("entries_total", "Entries appended to the decision log, by kind.", "kind"),
		conflicts: r.Counter("conflicts_total", "Appends refused because another writer appended first; the writer reread the head and resumed from its cursors."),
		retries:   r.Counter("retries_total", "Writer sessions restarted after an error (NATS unavailable, a source unreadable)."),
		head:      r.Gauge("head_seq", "Seq of the last entry this writer appended or read."),
	}
	return m, r.Err()
}
