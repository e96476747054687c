package inbox

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/agora-dispatch/agora/internal/svc"
)

type metrics struct {
	answers     *prometheus.CounterVec
	logins      *prometheus.CounterVec
	links       *prometheus.CounterVec
	csrfRefused prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, st *store, ss *sessions) (*metrics, error) {
	r := svc.NewMetrics(reg, "inbox")
	m := &metrics{
		answers: r.CounterVec("answers_total",
			"Answers sent from the inbox, by the router's reply status (accepted, already_answered, invalid, not_found, retry).", "status"),
		logins: r.CounterVec("logins_total",
			"Sign-in attempts, by result (ok, refused, limited: refused unchecked after too many failures).", "result"),
		links: r.CounterVec("answer_links_total",
			"Signed answer links submitted, by result (accepted, used, expired, invalid, closed, refused, retry).", "result"),
		csrfRefused: r.Counter("csrf_refused_total", "Forms and API calls refused for a missing or wrong CSRF token."),
	}
	r.GaugeFunc("live_streams", "Open Server-Sent Event streams (pages receiving live updates).",
		func() float64 { return float64(st.subscribers()) })
	r.GaugeFunc("pending_questions", "Questions waiting for an answer in the agora_questions bucket, every route, as the inbox sees it.",
		func() float64 { return float64(st.pendingCount()) })
	r.GaugeFunc("sessions", "Sessions this replica knows (signed in on any replica and not yet expired or signed out).",
		func() float64 { return float64(ss.count()) })
	return m, r.Err()
}
