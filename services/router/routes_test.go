package router_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/services/router"
)

const designRoutes = `routes:
  - name: approvals
    match: {kind: approval}
    answerer: human
    deadline: 4h
    escalate: [{after: 1h, to: oncall}]
    on_expiry: fail        # fail | cancel | default:<option>
  - name: data
    match: {subagent: "data-*"}
    answerer: sqldb
    fallback: default      # used when the answerer declines
  - name: payments
    match:
      labels: {team: pay*}
      kind: [decision, clarification]
  - name: oncall
    match: none            # only reached by escalation
    answerer: pager
  - name: default
    answerer: human
`

func TestParseRoutesAndMatch(t *testing.T) {
	r, err := router.ParseRoutes("routes.yaml", []byte(designRoutes))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		facts router.Facts
		want  string
	}{
		{router.Facts{Kind: "approval", Subagent: "data-x"}, "approvals"},
		{router.Facts{Kind: "decision", Subagent: "data-loader"}, "data"},
		{router.Facts{Kind: "decision", Subagent: "planner", Labels: map[string]string{"team": "payments"}}, "payments"},
		{router.Facts{Kind: "information", Subagent: "planner", Labels: map[string]string{"team": "payments"}}, "default"},
		{router.Facts{Kind: "decision", Subagent: "planner", Labels: map[string]string{"team": "search"}}, "default"},
		{router.Facts{Kind: "decision", Subagent: "planner"}, "default"},
		{router.Facts{}, "default"},
	}
	for _, tt := range tests {
		if got := r.Match(tt.facts).Name; got != tt.want {
			t.Errorf("Match(%+v) = %s, want %s", tt.facts, got, tt.want)
		}
	}
	a, _ := r.Route("approvals")
	if a.Deadline != 4*time.Hour || a.OnExpiry.Action != router.ExpiryFail || len(a.Escalate) != 1 || a.Escalate[0].To != "oncall" || a.Answerer != "human" || a.Line != 2 {
		t.Errorf("approvals = %+v", a)
	}
	if p, _ := r.Route("payments"); p.Answerer != "payments" {
		t.Errorf("payments answerer = %q, want the route name by default", p.Answerer)
	}
	if d := router.DefaultRoutes(); d.Match(router.Facts{Kind: "approval"}).Name != "human" || d.Match(router.Facts{}).Name != "human" {
		t.Error("the built-in routes do not send everything to human")
	}
}

func TestParseRoutesReportsLineAndProblem(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		line int
		want string
	}{
		{"bad name", "routes:\n  - name: a.b\n", 2, `route name "a.b"`},
		{"bad deadline", "routes:\n  - name: a\n    deadline: soon\n", 3, `deadline "soon" is not a positive duration`},
		{"negative deadline", "routes:\n  - name: a\n    deadline: -1h\n", 3, "not a positive duration"},
		{"bad on_expiry", "routes:\n  - name: a\n    deadline: 1h\n    on_expiry: explode\n", 4, "want fail, cancel or default:<option>"},
		{"default without option", "routes:\n  - name: a\n    deadline: 1h\n    on_expiry: 'default:'\n", 4, "needs an option"},
		{"on_expiry without deadline", "routes:\n  - name: a\n    on_expiry: cancel\n", 3, "on_expiry needs a deadline"},
		{"unknown escalation target", "routes:\n  - name: a\n    deadline: 2h\n    escalate: [{after: 1h, to: ghost}]\n", 2, `"ghost", which is not a route`},
		{"escalation after deadline", "routes:\n  - name: a\n    deadline: 1h\n    escalate: [{after: 2h, to: b}]\n  - name: b\n    match: none\n", 2, "not before the deadline"},
		{"escalation out of order", "routes:\n  - name: a\n    escalate: [{after: 2h, to: b}, {after: 1h, to: b}]\n  - name: b\n    match: none\n", 2, "must come later"},
		{"unknown fallback", "routes:\n  - name: a\n    fallback: ghost\n", 2, `fallback "ghost" is not a route`},
		{"duplicate name", "routes:\n  - name: a\n    match: {kind: approval}\n  - name: a\n", 4, `already used at line 2`},
		{"no catch-all", "routes:\n  - name: a\n    match: {kind: approval}\n", 0, "no catch-all route"},
		{"catch-all not last", "routes:\n  - name: a\n  - name: b\n    match: {kind: approval}\n", 3, "route b is never matched"},
		{"unknown key", "routes:\n  - name: a\n    deadlin: 1h\n", 3, `unknown route key "deadlin"`},
		{"unknown match key", "routes:\n  - name: a\n    match: {knd: approval}\n  - name: b\n", 3, `unknown match key "knd"`},
		{"bad kind", "routes:\n  - name: a\n    match: {kind: urgent}\n  - name: b\n", 3, `match kind "urgent"`},
		{"bad glob", "routes:\n  - name: a\n    match: {subagent: \"[x\"}\n  - name: b\n", 3, "not a valid glob"},
		{"empty match", "routes:\n  - name: a\n    match: {}\n", 3, "match is empty"},
		{"yaml syntax", "routes:\n  - name: [a\n", 0, "yaml: line"},
		{"empty file", "", 0, "the file is empty"},
		{"no routes key", "rutes: []\n", 1, `unknown key "rutes"`},
		{"empty routes", "routes: []\n", 1, `"routes" is empty`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := router.ParseRoutes("routes.yaml", []byte(tt.yaml))
			var re *router.RoutesError
			if !errors.As(err, &re) {
				t.Fatalf("err = %v, want a *RoutesError", err)
			}
			for _, p := range re.Problems {
				if p.Line == tt.line && strings.Contains(p.Msg, tt.want) {
					if !strings.Contains(err.Error(), "routes.yaml") {
						t.Errorf("error %q does not name the file", err)
					}
					return
				}
			}
			t.Fatalf("problems %+v: want line %d with %q", re.Problems, tt.line, tt.want)
		})
	}
}

func TestParseRoutesReportsEveryProblem(t *testing.T) {
	_, err := router.ParseRoutes("r.yaml", []byte("routes:\n  - name: a\n    deadline: x\n  - name: b\n    fallback: nope\n    match: {kind: approval}\n"))
	var re *router.RoutesError
	if !errors.As(err, &re) || len(re.Problems) < 3 {
		t.Fatalf("err = %v, want the deadline, the fallback and the shadowed route", err)
	}
	for _, want := range []string{"line 3", "fallback \"nope\"", "never matched"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

func TestInvalidRoutingFileStopsTheRouter(t *testing.T) {
	file := filepath.Join(t.TempDir(), "routes.yaml")
	if err := os.WriteFile(file, []byte("routes:\n  - name: a\n    deadline: tomorrow\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := router.New(router.Config{RoutesFile: file}, router.Deps{Logger: quietLogger()})
	if err == nil || !strings.Contains(err.Error(), "line 3") || !strings.Contains(err.Error(), "AGORA_ROUTER_CONFIG") {
		t.Fatalf("New = %v, want an error naming line 3 and AGORA_ROUTER_CONFIG", err)
	}
}

func TestReloadKeepsRoutesWhenTheNewFileIsInvalid(t *testing.T) {
	e := newEnv(t, "routes:\n  - name: first\n")
	svc, err := router.New(e.config(), router.Deps{Conn: e.nc, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	write := func(s string) {
		if err := os.WriteFile(e.routes, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("routes:\n  - name: second\n    deadline: never\n")
	if err := svc.Reload(); err == nil || !strings.Contains(err.Error(), "line 3") {
		t.Fatalf("Reload = %v, want the problem at line 3", err)
	}
	if got := svc.Routes().Match(router.Facts{}).Name; got != "first" {
		t.Fatalf("after a failed reload the route is %s, want first", got)
	}
	write("routes:\n  - name: second\n")
	if err := svc.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := svc.Routes().Match(router.Facts{}).Name; got != "second" {
		t.Fatalf("after a reload the route is %s, want second", got)
	}
}

func TestConfigValidateNamesVariables(t *testing.T) {
	err := router.Config{ID: "a.b", Tick: time.Millisecond, Concurrency: -1, RoutesFile: "/nonexistent/routes.yaml", Retention: time.Millisecond}.Validate()
	for _, want := range []string{"AGORA_ROUTER_ID", "AGORA_ROUTER_TICK", "AGORA_ROUTER_CONCURRENCY", "AGORA_ROUTER_CONFIG", "AGORA_RETENTION"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate = %v, want it to name %s", err, want)
		}
	}
}
