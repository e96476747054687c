// Package observability holds Agora's Grafana dashboard and Prometheus
// alerting rules (grafana-dashboard.json, alerts.yaml); its test checks
// every metric they use against what the services register
// (deploy/observability/README.md).
package observability
