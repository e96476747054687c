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
	// Ask once (docs/router.md, "Ask once").
	coalesced   *prometheus.CounterVec
	threads     *prometheus.HistogramVec
	reused      *prometheus.CounterVec
	remembered  *prometheus.CounterVec
	suggestions *prometheus.CounterVec
	// The periodic passes (index.go, scanLoop).
	scans, cancelSweeps prometheus.Counter
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
		coalesced: r.CounterVec("questions_coalesced_total",
			"Questions that joined one already waiting on the same route instead of being asked again, by route.", "route"),
		threads: r.HistogramVec("question_threads",
			"Threads one answered, expired or withdrawn question with joined threads ended, the asking thread included, by route.",
			prometheus.ExponentialBuckets(2, 2, 12), "route"),
		reused: r.CounterVec("answers_reused_total",
			"Questions answered at once from a remembered decision, by route.", "route"),
		remembered: r.CounterVec("decisions_remembered_total",
			"Answers written as remembered decisions, by route.", "route"),
		suggestions: r.CounterVec("suggestions_total",
			"Suggested answers, by route and result: accepted (at or above auto_accept), below (sent on to a person), confirmed or overridden (the person's answer was or was not the suggestion).", "route", "result"),
		scans:        r.Counter("scans_total", "Scans for due question deadlines, escalation steps and unpublished events (every AGORA_ROUTER_TICK)."),
		cancelSweeps: r.Counter("cancel_sweeps_total", "Sweeps for threads cancelled while the router did not hear it (at start, after a reconnect, every AGORA_ROUTER_CANCEL_SWEEP)."),
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
