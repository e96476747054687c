package lifecycle_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

var badTokens = []string{"", "a.b", ".", "a*", "*", ">", "a>", "a b", " ", "a\tb", "a\nb", "a\x00b", "a\xffb", strings.Repeat("x", 257)}

func TestValidToken(t *testing.T) {
	for _, s := range []string{"a", "planner", "01JDISPATCH", "q-01J", "data_lookup", "A-b_9", "é", strings.Repeat("x", 256)} {
		if err := lifecycle.ValidToken(s); err != nil {
			t.Errorf("ValidToken(%q) = %v", s, err)
		}
	}
	for _, s := range badTokens {
		if err := lifecycle.ValidToken(s); !errors.Is(err, lifecycle.ErrBadToken) {
			t.Errorf("ValidToken(%q) = %v, want ErrBadToken", s, err)
		}
	}
}

func TestSubjectRoundTrip(t *testing.T) {
	// The subjects of one token: built, then parsed back.
	for _, tc := range []struct {
		name           string
		build, parse   func(string) (string, error)
		token, subject string
	}{
		{"request", lifecycle.RequestSubject, lifecycle.ParseRequestSubject, "planner", "agora.requests.planner"},
		{"dispatch", lifecycle.DispatchSubject, lifecycle.ParseDispatchSubject, "planner", "agora.dispatch.planner"},
		{"route answer endpoint", lifecycle.APIAnswerRoute, lifecycle.ParseAPIAnswerRoute, "human", "agora.api.answer.human"},
		{"cancel", lifecycle.CancelSubject, lifecycle.ParseCancelSubject, "d1", "agora.control.cancel.d1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := tc.build(tc.token)
			if err != nil || s != tc.subject {
				t.Fatalf("build(%q) = %q, %v; want %q", tc.token, s, err, tc.subject)
			}
			if got, err := tc.parse(s); err != nil || got != tc.token {
				t.Errorf("parse(%q) = %q, %v; want %q", s, got, err, tc.token)
			}
		})
	}
	t.Run("lifecycle", func(t *testing.T) {
		for _, k := range lifecycle.Kinds() {
			s, err := lifecycle.LifecycleSubject(k, "t1", "d1")
			if err != nil || s != "agora.lifecycle."+string(k)+".t1.d1" {
				t.Fatalf("LifecycleSubject(%s) = %q, %v", k, s, err)
			}
			want := lifecycle.LifecycleAddr{Kind: k, ThreadID: "t1", DispatchID: "d1"}
			if got, err := lifecycle.ParseLifecycleSubject(s); err != nil || got != want {
				t.Errorf("ParseLifecycleSubject(%q) = %+v, %v; want %+v", s, got, err, want)
			}
			if got := lifecycle.LifecycleFilter(k, "t1", "d1"); got != s {
				t.Errorf("LifecycleFilter with every argument = %q, want %q", got, s)
			}
		}
	})
	t.Run("question", func(t *testing.T) {
		for _, ev := range lifecycle.QuestionEvents() {
			s, err := lifecycle.QuestionSubject("approvals", "q-d1", ev)
			if err != nil || s != "agora.questions.approvals.q-d1."+string(ev) {
				t.Fatalf("QuestionSubject(%s) = %q, %v", ev, s, err)
			}
			want := lifecycle.QuestionAddr{Route: "approvals", QuestionID: "q-d1", Event: ev}
			if got, err := lifecycle.ParseQuestionSubject(s); err != nil || got != want {
				t.Errorf("ParseQuestionSubject(%q) = %+v, %v; want %+v", s, got, err, want)
			}
		}
	})
	t.Run("answer", func(t *testing.T) {
		s, err := lifecycle.AnswerSubject("approvals", "q-d1")
		if err != nil || s != "agora.answers.approvals.q-d1" {
			t.Fatalf("AnswerSubject = %q, %v", s, err)
		}
		route, qid, err := lifecycle.ParseAnswerSubject(s)
		if err != nil || route != "approvals" || qid != "q-d1" {
			t.Errorf("ParseAnswerSubject = %q, %q, %v", route, qid, err)
		}
	})
	t.Run("route answer endpoint refusals", func(t *testing.T) {
		for _, bad := range []string{lifecycle.APIAnswer, "agora.api.status.human", "agora.api.answer.a.b", "agora.api.answer.*"} {
			if _, err := lifecycle.ParseAPIAnswerRoute(bad); err == nil {
				t.Errorf("ParseAPIAnswerRoute(%q) succeeded", bad)
			}
		}
		if _, err := lifecycle.APIAnswerRoute("a.b"); err == nil {
			t.Error("APIAnswerRoute(a.b) succeeded")
		}
	})
	t.Run("caller endpoints", func(t *testing.T) {
		for _, ep := range []string{lifecycle.APIDispatch, lifecycle.APICancel, lifecycle.APIStatus} {
			s, err := lifecycle.APICaller(ep, "answerer-agents")
			if err != nil || s != ep+".answerer-agents" {
				t.Fatalf("APICaller(%s) = %q, %v", ep, s, err)
			}
			if gotEP, user, ok := lifecycle.ParseAPICaller(s); !ok || gotEP != ep || user != "answerer-agents" {
				t.Errorf("ParseAPICaller(%q) = %q %q %v", s, gotEP, user, ok)
			}
		}
		for _, bad := range []string{lifecycle.APIDispatch, "agora.api.answer.human", "agora.api.dispatch.a.b", "agora.api.dispatch.*", "agora.api.dispatch.>", "x.api.dispatch.u"} {
			if ep, user, ok := lifecycle.ParseAPICaller(bad); ok {
				t.Errorf("ParseAPICaller(%q) = %q %q", bad, ep, user)
			}
		}
		if _, err := lifecycle.APICaller(lifecycle.APIAnswer, "u"); err == nil {
			t.Error("APICaller(agora.api.answer) succeeded")
		}
		if _, err := lifecycle.APICaller(lifecycle.APIDispatch, "a.b"); err == nil {
			t.Error("APICaller with a dotted user succeeded")
		}
	})
}

func TestSubjectBuildersRejectBadTokens(t *testing.T) {
	builders := []struct {
		name  string
		build func(tok string) (string, error)
	}{
		{"RequestSubject", lifecycle.RequestSubject},
		{"DispatchSubject", lifecycle.DispatchSubject},
		{"CancelSubject", lifecycle.CancelSubject},
		{"LifecycleSubject thread", func(s string) (string, error) { return lifecycle.LifecycleSubject(lifecycle.KindStarted, s, "d1") }},
		{"LifecycleSubject dispatch", func(s string) (string, error) { return lifecycle.LifecycleSubject(lifecycle.KindStarted, "t1", s) }},
		{"QuestionSubject route", func(s string) (string, error) { return lifecycle.QuestionSubject(s, "q1", lifecycle.QuestionAsked) }},
		{"QuestionSubject question", func(s string) (string, error) { return lifecycle.QuestionSubject("r", s, lifecycle.QuestionAsked) }},
		{"AnswerSubject route", func(s string) (string, error) { return lifecycle.AnswerSubject(s, "q1") }},
		{"AnswerSubject question", func(s string) (string, error) { return lifecycle.AnswerSubject("r", s) }},
	}
	for _, b := range builders {
		for _, tok := range badTokens {
			if s, err := b.build(tok); !errors.Is(err, lifecycle.ErrBadToken) {
				t.Errorf("%s(%q) = %q, %v; want ErrBadToken", b.name, tok, s, err)
			}
		}
	}
	for _, k := range []lifecycle.Kind{"", "paused", "*"} {
		if _, err := lifecycle.LifecycleSubject(k, "t1", "d1"); !errors.Is(err, lifecycle.ErrBadSubject) {
			t.Errorf("LifecycleSubject(kind %q) = %v, want ErrBadSubject", k, err)
		}
	}
	for _, ev := range []lifecycle.QuestionEvent{"", "pending", ">"} {
		if _, err := lifecycle.QuestionSubject("r", "q1", ev); !errors.Is(err, lifecycle.ErrBadSubject) {
			t.Errorf("QuestionSubject(event %q) = %v, want ErrBadSubject", ev, err)
		}
	}
}

func TestSubjectParsersRejectWrongShapes(t *testing.T) {
	parsers := []struct {
		name  string
		parse func(string) error
		bad   []string
	}{
		{"ParseRequestSubject", func(s string) error { _, err := lifecycle.ParseRequestSubject(s); return err }, []string{
			"", "agora.requests", "agora.requests.a.b", "agora.dispatch.a", "nats.requests.a", "agora.requests.*",
			"agora.requests.>", "agora.requests.", "agora.requests.a b", "agora.requests..",
		}},
		{"ParseDispatchSubject", func(s string) error { _, err := lifecycle.ParseDispatchSubject(s); return err }, []string{
			"", "agora.dispatch", "agora.dispatch.a.b", "agora.requests.a", "agora.dispatch.*", "agora.dispatch.",
		}},
		{"ParseLifecycleSubject", func(s string) error { _, err := lifecycle.ParseLifecycleSubject(s); return err }, []string{
			"", "agora.lifecycle.started.t1", "agora.lifecycle.started.t1.d1.x", "agora.lifecycle.paused.t1.d1",
			"agora.lifecycle.*.t1.d1", "agora.lifecycle.started.*.d1", "agora.lifecycle.started.t1.>",
			"agora.questions.started.t1.d1", "x.lifecycle.started.t1.d1", "agora.lifecycle.started..d1",
			"agora.lifecycle.Started.t1.d1",
		}},
		{"ParseQuestionSubject", func(s string) error { _, err := lifecycle.ParseQuestionSubject(s); return err }, []string{
			"", "agora.questions.r.q1", "agora.questions.r.q1.asked.x", "agora.questions.r.q1.pending",
			"agora.questions.r.*.asked", "agora.questions.*.q1.asked", "agora.answers.r.q1.asked", "agora.questions..q1.asked",
		}},
		{"ParseAnswerSubject", func(s string) error { _, _, err := lifecycle.ParseAnswerSubject(s); return err }, []string{
			"", "agora.answers.r", "agora.answers.r.q1.x", "agora.questions.r.q1", "agora.answers.*.q1", "agora.answers.r.>",
		}},
		{"ParseCancelSubject", func(s string) error { _, err := lifecycle.ParseCancelSubject(s); return err }, []string{
			"", "agora.control.cancel", "agora.control.cancel.d1.x", "agora.control.stop.d1", "agora.ctl.cancel.d1",
			"agora.control.cancel.*", "agora.control.cancel.",
		}},
	}
	for _, p := range parsers {
		for _, s := range p.bad {
			if err := p.parse(s); !errors.Is(err, lifecycle.ErrBadSubject) {
				t.Errorf("%s(%q) = %v, want ErrBadSubject", p.name, s, err)
			}
		}
	}
}

func TestLifecycleFilter(t *testing.T) {
	tests := []struct {
		kind             lifecycle.Kind
		thread, dispatch string
		want             string
	}{
		{"", "", "", "agora.lifecycle.*.*.*"},
		{lifecycle.KindNeedsInput, "", "", "agora.lifecycle.needs_input.*.*"},
		{"", "t1", "", "agora.lifecycle.*.t1.*"},
		{"", "", "d1", "agora.lifecycle.*.*.d1"},
		{lifecycle.KindFailed, "t1", "d1", "agora.lifecycle.failed.t1.d1"},
	}
	for _, tt := range tests {
		if got := lifecycle.LifecycleFilter(tt.kind, tt.thread, tt.dispatch); got != tt.want {
			t.Errorf("LifecycleFilter(%q, %q, %q) = %q, want %q", tt.kind, tt.thread, tt.dispatch, got, tt.want)
		}
	}
}

func TestQuestionID(t *testing.T) {
	if got := lifecycle.QuestionID("d1"); got != "q-d1" {
		t.Errorf("QuestionID = %q, want q-d1", got)
	}
}
