package svc

import (
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics registers one service's Prometheus collectors, each named
// agora_<subsystem>_<name> (the names are in each service's doc page). It
// keeps the first registration error for Err, so a service declares all
// its metrics in one expression and checks once. Not safe for concurrent
// use: a service builds its metrics in New.
type Metrics struct {
	reg prometheus.Registerer
	sub string
	err error
}

// NewMetrics returns a Metrics registering on reg under subsystem.
func NewMetrics(reg prometheus.Registerer, subsystem string) *Metrics {
	return &Metrics{reg: reg, sub: subsystem}
}

func (m *Metrics) register(c prometheus.Collector) {
	if err := m.reg.Register(c); err != nil && m.err == nil {
		m.err = fmt.Errorf("%s: metrics: %w", m.sub, err)
	}
}

func (m *Metrics) opts(name, help string) prometheus.Opts {
	return prometheus.Opts{Namespace: "agora", Subsystem: m.sub, Name: name, Help: help}
}

// Counter registers a counter.
func (m *Metrics) Counter(name, help string) prometheus.Counter {
	c := prometheus.NewCounter(prometheus.CounterOpts(m.opts(name, help)))
	m.register(c)
	return c
}

// CounterVec registers a counter with labels.
func (m *Metrics) CounterVec(name, help string, labels ...string) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts(m.opts(name, help)), labels)
	m.register(c)
	return c
}

// Gauge registers a gauge.
func (m *Metrics) Gauge(name, help string) prometheus.Gauge {
	g := prometheus.NewGauge(prometheus.GaugeOpts(m.opts(name, help)))
	m.register(g)
	return g
}

// GaugeFunc registers a gauge whose value f reads at each scrape; f must
// be safe to call from the scraping goroutine.
func (m *Metrics) GaugeFunc(name, help string, f func() float64) {
	m.register(prometheus.NewGaugeFunc(prometheus.GaugeOpts(m.opts(name, help)), f))
}

// HistogramVec registers a histogram with labels.
func (m *Metrics) HistogramVec(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	o := m.opts(name, help)
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: o.Namespace, Subsystem: o.Subsystem, Name: o.Name, Help: o.Help, Buckets: buckets,
	}, labels)
	m.register(h)
	return h
}

// Err is the first registration error, naming the subsystem; nil when
// every collector registered.
func (m *Metrics) Err() error { return m.err }

// MetricsHandler serves g's metrics in the Prometheus text format; a
// service without a gatherer (its registerer is not one) answers 404.
func MetricsHandler(g prometheus.Gatherer) http.Handler {
	if g == nil {
		return http.NotFoundHandler()
	}
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{})
}
