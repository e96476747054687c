package inbox

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	answers     *prometheus.CounterVec
	logins      *prometheus.CounterVec
	links       *prometheus.CounterVec
	csrfRefused prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, st *store, ss *sessions) (*metrics, error) {
	m := &metrics{
		answers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "agora", Subsystem: "inbox", Name: "answers_total",
			Help: "Answers sent from the inbox, by the router's reply status (accepted, already_answered, invalid, not_found, retry).",
		}, []string{"status"}),
		logins: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "agora", Subsystem: "inbox", Name: "logins_total",
			Help: "Sign-in attempts, by result (ok, refused, limited: refused unchecked after too many failures).",
		}, []string{"result"}),
		links: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "agora", Subsystem: "inbox", Name: "answer_links_total",
			Help: "Signed answer links submitted, by result (accepted, used, expired, invalid, closed, refused, retry).",
		}, []string{"result"}),
		csrfRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "agora", Subsystem: "inbox", Name: "csrf_refused_total",
			Help: "Forms and API calls refused for a missing or wrong CSRF token.",
		}),
	}
	streams := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "agora", Subsystem: "inbox", Name: "live_streams",
		Help: "Open Server-Sent Event streams (pages receiving live updates).",
	}, func() float64 { return float64(st.subscribers()) })
	pending := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "agora", Subsystem: "inbox", Name: "pending_questions",
		Help: "Questions waiting for an answer in the agora_questions bucket, every route, as the inbox sees it.",
	}, func() float64 { return float64(st.pendingCount()) })
	signedIn := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "agora", Subsystem: "inbox", Name: "sessions",
		Help: "Sessions this replica knows (signed in on any replica and not yet expired or signed out).",
	}, func() float64 { return float64(ss.count()) })
	for _, c := range []prometheus.Collector{m.answers, m.logins, m.links, m.csrfRefused, streams, pending, signedIn} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("inbox: metrics: %w", err)
		}
	}
	return m, nil
}
