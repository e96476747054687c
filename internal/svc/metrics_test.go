package svc_test

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/agora-dispatch/agora/internal/svc"
)

func TestMetricsNamesAndServes(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := svc.NewMetrics(reg, "demo")
	m.Counter("things_total", "Things.").Inc()
	m.CounterVec("calls_total", "Calls.", "result").WithLabelValues("ok").Add(2)
	m.Gauge("in_flight", "In flight.").Set(3)
	m.GaugeFunc("slots", "Slots.", func() float64 { return 4 })
	m.HistogramVec("wait_seconds", "Waits.", []float64{1, 2}, "route").WithLabelValues("human").Observe(1.5)
	if err := m.Err(); err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	svc.MetricsHandler(reg).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	for _, want := range []string{
		"agora_demo_things_total 1", `agora_demo_calls_total{result="ok"} 2`, "agora_demo_in_flight 3",
		"agora_demo_slots 4", `agora_demo_wait_seconds_bucket{route="human",le="2"} 1`, "# HELP agora_demo_calls_total Calls.",
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q:\n%s", want, body)
		}
	}
}

func TestMetricsKeepsTheFirstError(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := svc.NewMetrics(reg, "demo")
	m.Counter("twice_total", "Once.")
	m.Counter("twice_total", "Once.")
	m.Gauge("fine", "Fine.")
	err := m.Err()
	if err == nil || !strings.HasPrefix(err.Error(), "demo: metrics: ") {
		t.Fatalf("err %v, want the duplicate named under demo: metrics", err)
	}
	if are := (prometheus.AlreadyRegisteredError{}); !errors.As(err, &are) {
		t.Errorf("err %v does not wrap the registry's AlreadyRegisteredError", err)
	}
}

func TestMetricsHandlerWithoutGatherer(t *testing.T) {
	rec := httptest.NewRecorder()
	svc.MetricsHandler(nil).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusNotFound {
		t.Errorf("status %d, want 404", rec.Code)
	}
}
