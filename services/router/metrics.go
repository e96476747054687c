package router

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/agora-dispatch/agora/internal/svc"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

type metrics struct {
	questions    *prometheus.CounterVec
	answers      *prometheus.CounterVec
	timeToAnswer *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer, idx *index) (*metrics, error) {
	r := svc.NewMetrics(reg, "router")
	m := &metrics{
		questions: r.CounterVec("questions_total",
			"Question transitions made by this router, by route and outcome (asked, answered, escalated, expired, withdrawn, max_rounds).", "route", "outcome"),
		answers: r.CounterVec("answers_total",
			"Answers and declines received, by door (api, api-route, stream) and reply status (accepted, already_answered, invalid, not_found, retry).", "door", "status"),
		timeToAnswer: r.HistogramVec("time_to_answer_seconds",
			"Time from question.asked to the accepted answer (or the default answer at expiry), by the route the question first matched.",
			prometheus.ExponentialBuckets(0.1, 4, 12), "route"),
	}
	r.GaugeFunc("pending_questions", "Questions waiting for an answer, as this router sees the agora_questions bucket.",
		func() float64 { return float64(idx.asked()) })
	r.GaugeFunc("oldest_pending_question_seconds", "How long the longest-waiting question has waited for an answer (0 when none waits).",
		func() float64 { return idx.oldest(time.Now()).Seconds() })
	return m, r.Err()
}

func (m *metrics) question(route string, ev lifecycle.QuestionEvent) {
	if ev != "" {
		m.questions.WithLabelValues(route, string(ev)).Inc()
	}
}
