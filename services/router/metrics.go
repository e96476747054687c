package router

import (
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

type metrics struct {
	questions    *prometheus.CounterVec
	answers      *prometheus.CounterVec
	timeToAnswer *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer, idx *index) (*metrics, error) {
	m := &metrics{
		questions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "agora", Subsystem: "router", Name: "questions_total",
			Help: "Question transitions made by this router, by route and outcome (asked, answered, escalated, expired, withdrawn, max_rounds).",
		}, []string{"route", "outcome"}),
		answers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "agora", Subsystem: "router", Name: "answers_total",
			Help: "Answers and declines received, by door (api, api-route, stream) and reply status (accepted, already_answered, invalid, not_found, retry).",
		}, []string{"door", "status"}),
		timeToAnswer: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "agora", Subsystem: "router", Name: "time_to_answer_seconds",
			Help:    "Time from question.asked to the accepted answer (or the default answer at expiry), by the route the question first matched.",
			Buckets: prometheus.ExponentialBuckets(0.1, 4, 12),
		}, []string{"route"}),
	}
	pending := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "agora", Subsystem: "router", Name: "pending_questions",
		Help: "Questions waiting for an answer, as this router sees the agora_questions bucket.",
	}, func() float64 { return float64(idx.asked()) })
	oldest := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "agora", Subsystem: "router", Name: "oldest_pending_question_seconds",
		Help: "How long the longest-waiting question has waited for an answer (0 when none waits).",
	}, func() float64 { return idx.oldest(time.Now()).Seconds() })
	for _, c := range []prometheus.Collector{m.questions, m.answers, m.timeToAnswer, pending, oldest} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("router: metrics: %w", err)
		}
	}
	return m, nil
}

func (m *metrics) question(route string, ev lifecycle.QuestionEvent) {
	if ev != "" {
		m.questions.WithLabelValues(route, string(ev)).Inc()
	}
}

func metricsHandler(g prometheus.Gatherer) http.Handler {
	if g == nil {
		return http.NotFoundHandler()
	}
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{})
}
