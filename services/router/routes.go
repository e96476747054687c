package router

import (
	"errors"
	"fmt"
	"os"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/agora-dispatch/agora/pkg/sentinel"
)

// Routes is a parsed and validated routing file (docs/router.md, "The routing
// file"). A Routes value is immutable and safe for concurrent use.
type Routes struct {
	source   string
	list     []*Route
	byName   map[string]*Route
	catchAll *Route
}

// Route is one entry of the routing file.
type Route struct {
	// Name is the route: the <route> token of the question subjects
	// agora.questions.<route>.<question_id>.<event> that its answerers
	// consume.
	Name string
	// Answerer names what answers on this route (human, sqldb, an agent…);
	// it travels in every question event. Default: Name.
	Answerer string
	// Match selects questions; nil matches every question (a catch-all).
	Match *Match
	// Standby marks a route written with `match: none`: never matched
	// directly, only reached by escalation or as a fallback.
	Standby bool
	// Deadline is how long a question may wait for its answer; zero
	// means no deadline.
	Deadline time.Duration
	// Escalate is the escalation ladder: after each step's delay since
	// the question was asked, the question moves to the step's route.
	Escalate []Step
	// OnExpiry is what happens when the deadline passes.
	OnExpiry Expiry
	// Fallback is the route that gets the question when this route's
	// answerer declines it; empty for none.
	Fallback string
	// Coalesce joins a question to one still waiting on this route that
	// matches it (docs/router.md, "Ask once"); on unless the file says
	// coalesce: false.
	Coalesce bool
	// ShareAcrossSubagents lets a dedupe_key join and remember questions
	// of different sub-agents on this route; off (the default), ask once
	// stays within one sub-agent's questions (docs/security.md, "What
	// sub-agents share").
	ShareAcrossSubagents bool
	// ShareAcrossPrincipals lets questions of threads different
	// principals dispatched join and remember one another on this route;
	// off (the default), ask once stays within the threads of one
	// dispatching principal (docs/security.md, "What sub-agents share").
	ShareAcrossPrincipals bool
	// Remember keeps each answer this long and answers a matching later
	// question with it; zero (the default) remembers nothing. Approval
	// questions are remembered only with RememberApprovals.
	Remember          time.Duration
	RememberApprovals bool
	// AutoAccept is the confidence (0 to 1) at or above which an
	// answerer's suggestion answers the question; zero takes none.
	AutoAccept float64
	// Line is the route's line in the routing file (0 for built-in routes).
	Line int
}

// Step is one rung of an escalation ladder.
type Step struct {
	After time.Duration
	To    string
}

// Match is a route's selector. Every present condition must hold; a list
// matches when any of its values does.
type Match struct {
	Kinds     []string          // question kinds
	Subagents []string          // glob patterns (path.Match) over the asking sub-agent's name
	Labels    map[string]string // label name → glob pattern over its value; the label must exist
}

// Expiry is a route's on_expiry action.
type Expiry struct {
	// Action is ExpiryFail, ExpiryCancel or ExpiryDefault.
	Action string
	// Option is the answer given by ExpiryDefault.
	Option string
}

// The on_expiry actions.
const (
	ExpiryFail    = "fail"    // the thread ends failed unanswered
	ExpiryCancel  = "cancel"  // the thread ends cancelled
	ExpiryDefault = "default" // the question is answered with Option by agora:default
)

// String returns the action as written in the routing file.
func (e Expiry) String() string {
	if e.Action == ExpiryDefault {
		return ExpiryDefault + ":" + e.Option
	}
	return e.Action
}

func parseExpiry(s string) (Expiry, error) {
	switch {
	case s == ExpiryFail, s == ExpiryCancel:
		return Expiry{Action: s}, nil
	case strings.HasPrefix(s, ExpiryDefault+":"):
		opt := strings.TrimSpace(strings.TrimPrefix(s, ExpiryDefault+":"))
		if opt == "" {
			return Expiry{}, errors.New("default: needs an option, as in default:B")
		}
		return Expiry{Action: ExpiryDefault, Option: opt}, nil
	}
	return Expiry{}, fmt.Errorf("%q: want fail, cancel or default:<option>", s)
}

// Facts are what a question is matched on.
type Facts struct {
	Kind     string
	Subagent string
	Labels   map[string]string
}

// matches reports whether every condition of m holds for f.
func (m *Match) matches(f Facts) bool {
	if m == nil {
		return true
	}
	if len(m.Kinds) > 0 && !slices.Contains(m.Kinds, f.Kind) {
		return false
	}
	if len(m.Subagents) > 0 && !slices.ContainsFunc(m.Subagents, func(p string) bool { ok, _ := path.Match(p, f.Subagent); return ok }) {
		return false
	}
	for k, p := range m.Labels {
		v, ok := f.Labels[k]
		if !ok {
			return false
		}
		if ok, _ := path.Match(p, v); !ok {
			return false
		}
	}
	return true
}

// Match returns the first route, in file order, whose selector matches f.
// A valid Routes always has a catch-all, so the result is never nil.
func (r *Routes) Match(f Facts) *Route {
	for _, rt := range r.list {
		if !rt.Standby && rt.Match.matches(f) {
			return rt
		}
	}
	return r.catchAll // not reached: the catch-all matches first
}

// Route returns the route named name.
func (r *Routes) Route(name string) (*Route, bool) {
	rt, ok := r.byName[name]
	return rt, ok
}

// List returns the routes in file order.
func (r *Routes) List() []Route {
	out := make([]Route, len(r.list))
	for i, rt := range r.list {
		out[i] = *rt
	}
	return out
}

// Source names where the routes came from: a file path, or "built-in".
func (r *Routes) Source() string { return r.source }

// DefaultRouteName is the single route of the built-in configuration.
const DefaultRouteName = "human"

// DefaultRoutes is the configuration used when no routing file is set:
// every question, approvals included, goes to the route `human`, without
// a deadline.
func DefaultRoutes() *Routes {
	rt := &Route{Name: DefaultRouteName, Answerer: DefaultRouteName, Coalesce: true}
	return &Routes{source: "built-in", list: []*Route{rt}, byName: map[string]*Route{rt.Name: rt}, catchAll: rt}
}

// RoutesError reports every problem of a routing file, each with its line.
type RoutesError struct {
	File     string
	Problems []Problem
}

// Problem is one problem at one line of a routing file (line 0: the file
// as a whole).
type Problem struct {
	Line int
	Msg  string
}

// Error implements error.
func (e *RoutesError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "router: routing file %s:", e.File)
	for i, p := range e.Problems {
		if i > 0 {
			b.WriteString(";")
		}
		if p.Line > 0 {
			fmt.Fprintf(&b, " line %d: %s", p.Line, p.Msg)
		} else {
			fmt.Fprintf(&b, " %s", p.Msg)
		}
	}
	return b.String()
}

// LoadRoutes reads and validates the routing file at path.
func LoadRoutes(file string) (*Routes, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("router: routing file: %w", err)
	}
	return ParseRoutes(file, b)
}

// nameRE is the shape of a route name: a subject token that is also a
// valid durable consumer name (answerer-<route>).
var nameRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// ParseRoutes parses and validates a routing file's content; name is used
// in error messages. A *RoutesError lists every problem with its line.
func ParseRoutes(name string, data []byte) (*Routes, error) {
	p := &parser{err: &RoutesError{File: name}}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		// yaml's messages already say "yaml: line N: …".
		p.add(0, err.Error())
		return nil, p.err
	}
	r := &Routes{source: name, byName: map[string]*Route{}}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		p.add(0, `the file is empty: want a "routes:" list`)
		return nil, p.err
	}
	top := doc.Content[0]
	if top.Kind != yaml.MappingNode {
		p.add(top.Line, `want a mapping with a "routes:" list`)
		return nil, p.err
	}
	var routesNode *yaml.Node
	p.fields(top, "top level", func(k string, key, v *yaml.Node) {
		switch k {
		case "routes":
			routesNode = v
		default:
			p.add(key.Line, fmt.Sprintf("unknown key %q (want routes)", k))
		}
	})
	if routesNode == nil {
		p.add(top.Line, `no "routes:" list`)
		return nil, p.err
	}
	if routesNode.Kind != yaml.SequenceNode {
		p.add(routesNode.Line, `"routes" must be a list of routes`)
		return nil, p.err
	}
	if len(routesNode.Content) == 0 {
		p.add(routesNode.Line, `"routes" is empty: want at least a catch-all route`)
		return nil, p.err
	}
	for _, n := range routesNode.Content {
		if rt := p.route(n); rt != nil {
			r.list = append(r.list, rt)
		}
	}
	p.check(r)
	if len(p.err.Problems) > 0 {
		return nil, p.err
	}
	return r, nil
}

type parser struct{ err *RoutesError }

func (p *parser) add(line int, msg string) {
	p.err.Problems = append(p.err.Problems, Problem{Line: line, Msg: msg})
}

// fields walks a mapping node's keys in order, reporting duplicates.
func (p *parser) fields(n *yaml.Node, what string, f func(k string, key, v *yaml.Node)) {
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		key, v := n.Content[i], n.Content[i+1]
		if key.Kind != yaml.ScalarNode {
			p.add(key.Line, fmt.Sprintf("%s: keys must be plain names", what))
			continue
		}
		if seen[key.Value] {
			p.add(key.Line, fmt.Sprintf("%s: key %q given twice", what, key.Value))
			continue
		}
		seen[key.Value] = true
		if v.Kind == yaml.AliasNode && v.Alias != nil {
			v = v.Alias
		}
		f(key.Value, key, v)
	}
}

func (p *parser) scalar(v *yaml.Node, what string) (string, bool) {
	if v.Kind != yaml.ScalarNode {
		p.add(v.Line, what+" must be a single value")
		return "", false
	}
	return v.Value, true
}

func (p *parser) duration(v *yaml.Node, what string) (time.Duration, bool) {
	s, ok := p.scalar(v, what)
	if !ok {
		return 0, false
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		p.add(v.Line, fmt.Sprintf("%s %q is not a positive duration such as 90s, 30m or 4h", what, s))
		return 0, false
	}
	return d, true
}

func (p *parser) boolean(v *yaml.Node, what string) (bool, bool) {
	s, ok := p.scalar(v, what)
	if !ok {
		return false, false
	}
	switch s {
	case "true":
		return true, true
	case "false":
		return false, true
	}
	p.add(v.Line, fmt.Sprintf("%s %q: want true or false", what, s))
	return false, false
}

// strings reads a scalar or a list of scalars.
func (p *parser) list(v *yaml.Node, what string) []string {
	switch v.Kind {
	case yaml.ScalarNode:
		return []string{v.Value}
	case yaml.SequenceNode:
		var out []string
		for _, e := range v.Content {
			if s, ok := p.scalar(e, what); ok {
				out = append(out, s)
			}
		}
		if len(out) == 0 {
			p.add(v.Line, what+" is an empty list")
		}
		return out
	}
	p.add(v.Line, what+" must be a value or a list of values")
	return nil
}

func (p *parser) route(n *yaml.Node) *Route {
	if n.Kind != yaml.MappingNode {
		p.add(n.Line, "a route must be a mapping with at least a name")
		return nil
	}
	rt := &Route{Line: n.Line, Coalesce: true}
	var seen routeLines
	p.fields(n, "route", func(k string, key, v *yaml.Node) { p.routeField(rt, &seen, k, key, v) })
	if rt.Name == "" {
		p.add(n.Line, "route without a name")
		return nil
	}
	p.checkRoute(n, rt, seen)
	return rt
}

// routeLines are where a route set the keys its checks refer back to.
type routeLines struct {
	expiryLine, approvalsLine int
	expirySet                 bool
}

// routeField reads one key k of a route into rt.
func (p *parser) routeField(rt *Route, seen *routeLines, k string, key, v *yaml.Node) {
	switch k {
	case "name":
		if s, ok := p.scalar(v, "name"); ok {
			rt.Name = s
			if !nameRE.MatchString(s) {
				p.add(v.Line, fmt.Sprintf("route name %q: want 1-64 letters, digits, '-' or '_' (it is a subject token and part of a consumer name)", s))
			}
		}
	case "answerer":
		if s, ok := p.scalar(v, "answerer"); ok {
			rt.Answerer = s
			if !nameRE.MatchString(s) {
				p.add(v.Line, fmt.Sprintf("answerer %q: want 1-64 letters, digits, '-' or '_'", s))
			}
		}
	case "match":
		if v.Kind == yaml.ScalarNode && v.Value == "none" {
			rt.Standby = true
			return
		}
		rt.Match = p.match(v)
	case "deadline":
		rt.Deadline, _ = p.duration(v, "deadline")
	case "escalate":
		if v.Kind != yaml.SequenceNode {
			p.add(v.Line, "escalate must be a list of {after: DURATION, to: ROUTE}")
			return
		}
		for _, s := range v.Content {
			if st, ok := p.step(s); ok {
				rt.Escalate = append(rt.Escalate, st)
			}
		}
	case "on_expiry":
		if s, ok := p.scalar(v, "on_expiry"); ok {
			e, err := parseExpiry(s)
			if err != nil {
				p.add(v.Line, "on_expiry "+err.Error())
			}
			rt.OnExpiry, seen.expiryLine, seen.expirySet = e, v.Line, true
		}
	case "fallback":
		if s, ok := p.scalar(v, "fallback"); ok {
			rt.Fallback = s
		}
	case "coalesce":
		rt.Coalesce, _ = p.boolean(v, "coalesce")
	case "share_across_subagents":
		rt.ShareAcrossSubagents, _ = p.boolean(v, "share_across_subagents")
	case "share_across_principals":
		rt.ShareAcrossPrincipals, _ = p.boolean(v, "share_across_principals")
	case "remember":
		rt.Remember, _ = p.duration(v, "remember")
	case "remember_approvals":
		rt.RememberApprovals, _ = p.boolean(v, "remember_approvals")
		seen.approvalsLine = v.Line
	case "auto_accept":
		if s, ok := p.scalar(v, "auto_accept"); ok {
			f, err := strconv.ParseFloat(s, 64)
			if err != nil || f <= 0 || f > 1 {
				p.add(v.Line, fmt.Sprintf("auto_accept %q: want a confidence above 0 and at most 1, such as 0.9", s))
			}
			rt.AutoAccept = f
		}
	default:
		p.add(key.Line, fmt.Sprintf("unknown route key %q (want name, match, answerer, deadline, escalate, on_expiry, fallback, coalesce, share_across_subagents, share_across_principals, remember, remember_approvals, auto_accept)", k))
	}
}

// checkRoute checks what a route's keys say together, and fills in the
// defaults they imply.
func (p *parser) checkRoute(n *yaml.Node, rt *Route, seen routeLines) {
	if rt.Answerer == "" {
		rt.Answerer = rt.Name
	}
	if rt.RememberApprovals && rt.Remember == 0 {
		p.add(seen.approvalsLine, fmt.Sprintf("route %s: remember_approvals needs remember (how long to keep answers, such as 720h)", rt.Name))
	}
	switch {
	case seen.expirySet && rt.Deadline == 0:
		p.add(seen.expiryLine, fmt.Sprintf("route %s: on_expiry needs a deadline", rt.Name))
	case !seen.expirySet && rt.Deadline > 0:
		rt.OnExpiry = Expiry{Action: ExpiryFail}
	}
	for i, st := range rt.Escalate {
		if i > 0 && st.After <= rt.Escalate[i-1].After {
			p.add(n.Line, fmt.Sprintf("route %s: escalate step %d (after %s) must come later than step %d (after %s)", rt.Name, i+1, st.After, i, rt.Escalate[i-1].After))
		}
		if rt.Deadline > 0 && st.After >= rt.Deadline {
			p.add(n.Line, fmt.Sprintf("route %s: escalate step %d (after %s) is not before the deadline (%s)", rt.Name, i+1, st.After, rt.Deadline))
		}
	}
}

func (p *parser) step(n *yaml.Node) (Step, bool) {
	if n.Kind != yaml.MappingNode {
		p.add(n.Line, "an escalate step must be {after: DURATION, to: ROUTE}")
		return Step{}, false
	}
	var st Step
	ok := true
	p.fields(n, "escalate step", func(k string, key, v *yaml.Node) {
		switch k {
		case "after":
			var good bool
			st.After, good = p.duration(v, "escalate after")
			ok = ok && good
		case "to":
			s, good := p.scalar(v, "escalate to")
			st.To, ok = s, ok && good
		default:
			p.add(key.Line, fmt.Sprintf("unknown escalate key %q (want after, to)", k))
			ok = false
		}
	})
	if st.After == 0 || st.To == "" {
		if ok {
			p.add(n.Line, "an escalate step needs both after and to")
		}
		return Step{}, false
	}
	return st, ok
}

func (p *parser) match(v *yaml.Node) *Match {
	if v.Kind != yaml.MappingNode {
		p.add(v.Line, "match must be a mapping of kind, subagent and labels (or none)")
		return nil
	}
	m := &Match{}
	p.fields(v, "match", func(k string, key, v *yaml.Node) {
		switch k {
		case "kind":
			for _, s := range p.list(v, "match kind") {
				if !sentinel.Kind(s).Valid() {
					p.add(v.Line, fmt.Sprintf("match kind %q: want clarification, decision, information or approval", s))
				}
				m.Kinds = append(m.Kinds, s)
			}
		case "subagent":
			for _, s := range p.list(v, "match subagent") {
				if _, err := path.Match(s, ""); err != nil {
					p.add(v.Line, fmt.Sprintf("match subagent %q is not a valid glob pattern", s))
				}
				m.Subagents = append(m.Subagents, s)
			}
		case "labels":
			if v.Kind != yaml.MappingNode {
				p.add(v.Line, "match labels must be a mapping of label name to glob pattern")
				return
			}
			m.Labels = map[string]string{}
			p.fields(v, "match labels", func(k string, _, v *yaml.Node) {
				s, ok := p.scalar(v, "label "+k)
				if !ok {
					return
				}
				if _, err := path.Match(s, ""); err != nil {
					p.add(v.Line, fmt.Sprintf("match label %s: %q is not a valid glob pattern", k, s))
				}
				m.Labels[k] = s
			})
		default:
			p.add(key.Line, fmt.Sprintf("unknown match key %q (want kind, subagent, labels)", k))
		}
	})
	if len(m.Kinds) == 0 && len(m.Subagents) == 0 && len(m.Labels) == 0 {
		p.add(v.Line, "match is empty: leave it out for a catch-all route, or write match: none")
	}
	return m
}

// check validates the routes together: unique names, targets that exist,
// exactly one catch-all after every other matchable route.
func (p *parser) check(r *Routes) {
	for _, rt := range r.list {
		if first, dup := r.byName[rt.Name]; dup {
			p.add(rt.Line, fmt.Sprintf("route name %q is already used at line %d", rt.Name, first.Line))
			continue
		}
		r.byName[rt.Name] = rt
	}
	for _, rt := range r.list {
		for i, st := range rt.Escalate {
			if _, ok := r.byName[st.To]; !ok {
				p.add(rt.Line, fmt.Sprintf("route %s: escalate step %d goes to %q, which is not a route in this file", rt.Name, i+1, st.To))
			} else if st.To == rt.Name {
				p.add(rt.Line, fmt.Sprintf("route %s: escalate step %d goes to the route itself", rt.Name, i+1))
			}
		}
		if rt.Fallback != "" {
			if _, ok := r.byName[rt.Fallback]; !ok {
				p.add(rt.Line, fmt.Sprintf("route %s: fallback %q is not a route in this file", rt.Name, rt.Fallback))
			} else if rt.Fallback == rt.Name {
				p.add(rt.Line, fmt.Sprintf("route %s: fallback is the route itself", rt.Name))
			}
		}
	}
	var catchAll *Route
	for _, rt := range r.list {
		switch {
		case rt.Standby:
		case catchAll != nil:
			p.add(rt.Line, fmt.Sprintf("route %s is never matched: the catch-all route %s (line %d) comes before it", rt.Name, catchAll.Name, catchAll.Line))
		case rt.Match == nil:
			catchAll = rt
		}
	}
	if catchAll == nil && len(r.list) > 0 {
		p.add(0, "no catch-all route: end the list with a route without match (for example name: default, answerer: human)")
	}
	r.catchAll = catchAll
}
