package slack

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/agora-dispatch/agora/internal/svc"
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
	r := svc.NewMetrics(reg, "slack")
	m := &metrics{
		calls: r.CounterVec("api_calls_total",
			"Slack Web API calls, by method and result (ok, error, rate_limited); a retried call counts once per attempt.", "method", "result"),
		posted: r.CounterVec("questions_posted_total", "Questions posted to Slack, by route.", "route"),
		postFailures: r.CounterVec("post_failures_total",
			"Questions that could not be posted and were declined to the route's fallback, by route and reason (api, no_destination).", "route", "reason"),
		answers: r.CounterVec("answers_total",
			"Answers sent from Slack, by the router's reply status (accepted, already_answered, invalid, not_found, retry, error).", "status"),
		refused: r.CounterVec("requests_refused_total",
			"Interactivity requests refused, by reason (signature, stale, replay, not_allowed).", "reason"),
		updates: r.CounterVec("messages_closed_total",
			"Slack messages updated because their question closed or left the route, by event (answered, expired, withdrawn, escalated) and result (ok, error).", "event", "result"),
	}
	return m, r.Err()
}
