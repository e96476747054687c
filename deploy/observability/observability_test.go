package observability_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"

	"github.com/agora-dispatch/agora/answerers/inbox"
	slackanswerer "github.com/agora-dispatch/agora/answerers/slack"
	"github.com/agora-dispatch/agora/answerers/webhook"
	"github.com/agora-dispatch/agora/internal/natstest"
	"github.com/agora-dispatch/agora/internal/provision"
	"github.com/agora-dispatch/agora/services/dispatcher"
	"github.com/agora-dispatch/agora/services/router"
	"github.com/agora-dispatch/agora/services/worker"
)

// recorder is a Registerer that keeps what the services register, so the
// metric names are read from their descriptors (a vector without children
// yet is there too).
type recorder struct {
	mu         sync.Mutex
	collectors []prometheus.Collector
}

func (r *recorder) Register(c prometheus.Collector) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.collectors = append(r.collectors, c)
	return nil
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		_ = r.Register(c)
	}
}

func (r *recorder) Unregister(prometheus.Collector) bool { return false }

var fqNameRE = regexp.MustCompile(`fqName: "([^"]+)"`)

// registered builds every service with one recorder and returns the
// metric names they register, histograms with their series suffixes.
func registered(t *testing.T) map[string]bool {
	t.Helper()
	srv := natstest.StartProvisioned(t, provision.Config{})
	rec := &recorder{}
	if _, err := dispatcher.New(dispatcher.Config{}, dispatcher.Deps{Conn: srv.Conn(t), Registerer: rec}); err != nil {
		t.Fatal(err)
	}
	if _, err := worker.New(worker.Config{WorkspaceRoot: t.TempDir()}, worker.Deps{Conn: srv.Conn(t), Registerer: rec}); err != nil {
		t.Fatal(err)
	}
	if _, err := router.New(router.Config{}, router.Deps{Conn: srv.Conn(t), Registerer: rec}); err != nil {
		t.Fatal(err)
	}
	if _, err := inbox.New(inbox.Config{DevToken: true}, inbox.Deps{Conn: srv.Conn(t), Registerer: rec}); err != nil {
		t.Fatal(err)
	}
	settings := filepath.Join(t.TempDir(), "slack.yaml")
	if err := os.WriteFile(settings, []byte("routes:\n  human:\n    channel: C0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := slackanswerer.New(slackanswerer.Config{BotToken: "xoxb-test", SigningSecret: "signing-secret-for-tests", SettingsFile: settings},
		slackanswerer.Deps{Conn: srv.Conn(t), Registerer: rec}); err != nil {
		t.Fatal(err)
	}
	if _, err := webhook.New(webhook.Config{Routes: []string{"notify"}, URL: "https://example.com/hook", Secret: "a-secret-of-16-bytes+"},
		webhook.Deps{Conn: srv.Conn(t), Registerer: rec}); err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{"up": true} // Prometheus's own
	ch := make(chan *prometheus.Desc, 64)
	go func() {
		for _, c := range rec.collectors {
			c.Describe(ch)
		}
		close(ch)
	}()
	for d := range ch {
		m := fqNameRE.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("descriptor without a name: %s", d)
		}
		names[m[1]] = true
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			names[m[1]+suffix] = true // harmless for non-histograms: nothing refers to them
		}
	}
	if len(names) < 20 {
		t.Fatalf("only %d metric names registered", len(names))
	}
	return names
}

// metricRE finds the metric names of a PromQL expression: every Agora
// metric is agora_…; `up` is Prometheus's.
var metricRE = regexp.MustCompile(`\b(agora_[a-z0-9_]+|up)\b`)

// unknown returns the metrics expr uses that are not registered.
func unknown(expr string, names map[string]bool) []string {
	var out []string
	for _, m := range metricRE.FindAllString(expr, -1) {
		if !names[m] {
			out = append(out, m)
		}
	}
	return out
}

// balanced reports whether expr's brackets pair up.
func balanced(expr string) bool {
	var stack []rune
	pairs := map[rune]rune{')': '(', ']': '[', '}': '{'}
	inString := false
	for _, r := range expr {
		switch {
		case r == '"':
			inString = !inString
		case inString:
		case r == '(' || r == '[' || r == '{':
			stack = append(stack, r)
		case pairs[r] != 0:
			if len(stack) == 0 || stack[len(stack)-1] != pairs[r] {
				return false
			}
			stack = stack[:len(stack)-1]
		}
	}
	return len(stack) == 0 && !inString
}

type dashboard struct {
	Title  string `json:"title"`
	Panels []struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

type rules struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

func TestDashboardAndAlertsUseRegisteredMetrics(t *testing.T) {
	names := registered(t)

	b, err := os.ReadFile("grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	exprs := 0
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			exprs++
			if !balanced(tg.Expr) || !metricRE.MatchString(tg.Expr) {
				t.Errorf("panel %q: malformed query %q", p.Title, tg.Expr)
			}
			if u := unknown(tg.Expr, names); len(u) > 0 {
				t.Errorf("panel %q uses metrics no service registers: %v", p.Title, u)
			}
		}
	}
	if exprs < 10 {
		t.Errorf("the dashboard has %d queries", exprs)
	}

	b, err = os.ReadFile("alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	dec.KnownFields(true)
	var r rules
	if err := dec.Decode(&r); err != nil {
		t.Fatalf("alerts.yaml: %v", err)
	}
	alerts := 0
	for _, g := range r.Groups {
		for _, rule := range g.Rules {
			alerts++
			if rule.Alert == "" || rule.Expr == "" || rule.Labels["severity"] == "" || rule.Annotations["summary"] == "" || rule.Annotations["description"] == "" {
				t.Errorf("rule %q lacks alert, expr, severity, summary or description", rule.Alert)
			}
			if rule.For != "" {
				if _, err := time.ParseDuration(rule.For); err != nil {
					t.Errorf("rule %q: for %q: %v", rule.Alert, rule.For, err)
				}
			}
			if !balanced(rule.Expr) {
				t.Errorf("rule %q: malformed expression %q", rule.Alert, rule.Expr)
			}
			if u := unknown(rule.Expr, names); len(u) > 0 {
				t.Errorf("rule %q uses metrics no service registers: %v", rule.Alert, u)
			}
		}
	}
	if alerts < 5 {
		t.Errorf("%d alerts", alerts)
	}
}

// The check fails on a renamed metric: it is what keeps the files true.
func TestRenamedMetricIsCaught(t *testing.T) {
	names := registered(t)
	for expr, want := range map[string][]string{
		`max(agora_router_pending_questions)`:                                    nil,
		`max(agora_router_pending_question)`:                                     {"agora_router_pending_question"},
		`sum(rate(agora_worker_run_duration_seconds_bucket[5m]))`:                nil,
		`sum(agora_worker_in_flight) / sum(agora_worker_capacity)`:               {"agora_worker_capacity"},
		`up{job="agora-dispatcher"} == 0 or absent(agora_dispatcher_requests_x)`: {"agora_dispatcher_requests_x"},
	} {
		got := unknown(expr, names)
		sort.Strings(got)
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("unknown(%q) = %v, want %v", expr, got, want)
		}
	}
	if balanced(`sum(rate(x[5m])`) || !balanced(`sum by (a) (rate(x{b="()"}[5m]))`) {
		t.Error("balanced is wrong")
	}
}
