package slack

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	calls        *prometheus.CounterVec
	posted       *prometheus.CounterVec
	postFailures *prometheus.CounterVec
	answers      *prometheus.CounterVec
	refused      *prometheus.CounterVec
	updates      *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "agora", Subsystem: "slack", Name: "api_calls_total",
			Help: "Slack Web API calls, by method and result (ok, error, rate_limited); a retried call counts once per attempt.",
		}, []string{"method", "result"}),
		posted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "agora", Subsystem: "slack", Name: "questions_posted_total",
			Help: "Questions posted to Slack, by route.",
		}, []string{"route"}),
		postFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "agora", Subsystem: "slack", Name: "post_failures_total",
			Help: "Questions that could not be posted and were declined to the route's fallback, by route and reason (api, no_destination).",
		}, []string{"route", "reason"}),
		answers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "agora", Subsystem: "slack", Name: "answers_total",
			Help: "Answers sent from Slack, by the router's reply status (accepted, already_answered, invalid, not_found, retry, error).",
		}, []string{"status"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "agora", Subsystem: "slack", Name: "requests_refused_total",
			Help: "Interactivity requests refused, by reason (signature, stale, replay, not_allowed).",
		}, []string{"reason"}),
		updates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "agora", Subsystem: "slack", Name: "messages_closed_total",
			Help: "Slack messages updated because their question closed or left the route, by event (answered, expired, withdrawn, escalated) and result (ok, error).",
		}, []string{"event", "result"}),
	}
	for _, c := range []prometheus.Collector{m.calls, m.posted, m.postFailures, m.answers, m.refused, m.updates} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("slack: metrics: %w", err)
		}
	}
	return m, nil
}
