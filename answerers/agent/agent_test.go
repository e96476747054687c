package agent_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/answerers/agent"
	"github.com/agora-dispatch/agora/harness/systemtest"
	"github.com/agora-dispatch/agora/pkg/answerer"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// system is the real Agora with the agent answerer serving route "agents".
type system struct {
	*systemtest.System
	c *client.Client
}

func startSystem(t *testing.T, routes string) *system {
	t.Helper()
	sys := systemtest.Start(t, systemtest.Options{Routes: routes})
	aconn := sys.Server.Conn(t)
	a, err := agent.New(sys.Client, agent.Config{Subagent: "oracle", Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	sys.Go("agent answerer", func(ctx context.Context) error {
		return answerer.Serve(ctx, aconn, "agents", a, answerer.WithLogger(systemtest.Logger()), answerer.WithConcurrency(2))
	})
	return &system{System: sys, c: sys.Client}
}

func (s *system) shell(name, script string) { s.Shell(name, script) }

// planner asks in round 0 and, resumed, copies its input.json (answer and
// partial state included) into its output.
const planner = `if [ "$AGORA_ROUND" = "0" ]; then
  printf '{"question":"Rewrite function A or B?","options":["A","B"],"context":"same signature","kind":"decision","partial_state":{"analysis":"call sites mapped","n":1e400}}' > "$AGORA_NEEDS_INPUT_FILE"
else
  cp "$AGORA_INPUT_FILE" "$AGORA_OUTPUT_FILE"
fi`

const routes = `routes:
  - name: agents
    match: {subagent: planner}
    answerer: oracle
    fallback: people
  - name: people
    answerer: human
`

// TestAgentAnswersAndThreadResumes: dispatch → needs_input → the agent
// answerer dispatches the oracle sub-agent → its answer is re-dispatched →
// round 1 finishes with the answer and the partial state in its input.
func TestAgentAnswersAndThreadResumes(t *testing.T) {
	s := startSystem(t, routes)
	s.shell("planner", planner)
	s.shell("oracle", `printf '{"answer":"B","comment":"B keeps the API","seen":%s}' "$(cat "$AGORA_INPUT_FILE")" > "$AGORA_OUTPUT_FILE"`)

	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	d, err := s.c.Dispatch(ctx, lifecycle.Request{Subagent: "planner", Input: json.RawMessage(`{"task":"refactor"}`), Labels: map[string]string{"team": "core"}})
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	end, err := s.c.Follow(ctx, d.ThreadID, func(it client.Item) {
		if l := it.Data; l != nil {
			kinds = append(kinds, string(l.LifecycleKind())+"@"+string(rune('0'+l.Base().Round)))
		}
	})
	if err != nil {
		t.Fatalf("Follow: %v (events %v)", err, kinds)
	}
	fin, ok := end.Data.(*lifecycle.Finished)
	if !ok {
		t.Fatalf("thread ended %T %+v (events %v)", end.Data, end.Data, kinds)
	}
	if fin.Round != 1 || fin.ThreadID != d.ThreadID || fin.ParentID != d.DispatchID {
		t.Errorf("finished in round %d, thread %s, parent %s", fin.Round, fin.ThreadID, fin.ParentID)
	}
	var in map[string]json.RawMessage
	if err := json.Unmarshal(fin.Output, &in); err != nil {
		t.Fatalf("output %s: %v", fin.Output, err)
	}
	if string(in["answer"]) != `"B"` || string(in["answered_by"]) != `"answerer:agents"` || string(in["comment"]) != `"B keeps the API"` || string(in["task"]) != `"refactor"` {
		t.Errorf("round 1 input = %s", fin.Output)
	}
	if string(in["partial_state"]) != `{"analysis":"call sites mapped","n":1e400}` {
		t.Errorf("round 1 partial_state = %s", in["partial_state"])
	}
	// The oracle saw the question.
	qs, err := s.c.Questions(ctx, client.QuestionFilter{ThreadID: d.ThreadID})
	if err != nil || len(qs) != 1 {
		t.Fatalf("questions = %+v, %v", qs, err)
	}
	rec, err := s.c.Status(ctx, agent.DispatchID(qs[0]))
	if err != nil {
		t.Fatal(err)
	}
	if rec.Result == nil || !strings.Contains(string(rec.Result.Output), `"question":"Rewrite function A or B?"`) || !strings.Contains(string(rec.Result.Output), `"subagent":"planner"`) {
		t.Errorf("the oracle's output = %+v", rec.Result)
	}
	if qs[0].Status != "answered" || qs[0].Route != "agents" || qs[0].AnsweredBy != "answerer:agents" {
		t.Errorf("question = %+v", qs[0])
	}
}

// TestAgentDeclines: when the answering sub-agent fails, needs input
// itself or gives no answer, the question goes to the fallback route,
// where a person answers and the thread resumes.
func TestAgentDeclines(t *testing.T) {
	tests := []struct {
		name   string
		oracle string
		want   string
	}{
		{"fails", `echo broken >&2; exit 3`, "failed (provider-failed)"},
		{"needs input", `printf '{"question":"What is A?"}' > "$AGORA_NEEDS_INPUT_FILE"`, "needs input itself: What is A?"},
		{"no answer", `printf '{"thinking":"hard"}' > "$AGORA_OUTPUT_FILE"`, "without an answer"},
		{"confidence out of range", `printf '{"answer":"B","confidence":1.5}' > "$AGORA_OUTPUT_FILE"`, "gave confidence 1.5: want a number from 0 to 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := startSystem(t, routes)
			s.shell("planner", planner)
			s.shell("oracle", tt.oracle)
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			d, err := s.c.Dispatch(ctx, lifecycle.Request{Subagent: "planner", Input: json.RawMessage(`{}`)})
			if err != nil {
				t.Fatal(err)
			}
			// Wait for the question to reach the people route.
			var q lifecycle.Question
			for {
				qs, err := s.c.Questions(ctx, client.QuestionFilter{ThreadID: d.ThreadID, Route: "people"})
				if err != nil {
					t.Fatal(err)
				}
				if len(qs) == 1 {
					q = qs[0]
					break
				}
				select {
				case <-ctx.Done():
					t.Fatal("the question never reached the fallback route")
				case <-time.After(50 * time.Millisecond):
				}
			}
			if !strings.Contains(q.Detail, "declined on route agents by answerer:agents") || !strings.Contains(q.Detail, tt.want) {
				t.Errorf("detail = %q, want %q", q.Detail, tt.want)
			}
			if tt.name == "needs input" {
				// The oracle's own question: its thread is cancelled, so the
				// question is withdrawn rather than left waiting.
				for {
					qs, err := s.c.Questions(ctx, client.QuestionFilter{Subagent: "oracle"})
					if err != nil {
						t.Fatal(err)
					}
					if len(qs) == 1 && qs[0].Status == "withdrawn" {
						break
					}
					select {
					case <-ctx.Done():
						t.Fatalf("the oracle's question was not withdrawn: %+v", qs)
					case <-time.After(50 * time.Millisecond):
					}
				}
			}
			if _, err := s.c.Answer(ctx, q.QuestionID, lifecycle.Answer{Answer: "A", AnsweredBy: "alice"}); err != nil {
				t.Fatal(err)
			}
			end, err := s.c.Follow(ctx, d.ThreadID, nil)
			if err != nil {
				t.Fatal(err)
			}
			if fin, ok := end.Data.(*lifecycle.Finished); !ok || !strings.Contains(string(fin.Output), `"answer":"A"`) {
				t.Fatalf("thread ended %+v", end.Data)
			}
		})
	}
}

// suggestRoutes take the agent's suggestion at confidence 0.9 or more;
// below, the question goes to people with the suggestion.
const suggestRoutes = `routes:
  - name: agents
    match: {subagent: planner}
    answerer: oracle
    auto_accept: 0.9
    fallback: people
  - name: people
    answerer: human
`

// waitQuestion waits until the thread's question matches cond and
// returns it.
func waitQuestion(ctx context.Context, t *testing.T, c *client.Client, threadID string, cond func(lifecycle.Question) bool) lifecycle.Question {
	t.Helper()
	for {
		qs, err := c.Questions(ctx, client.QuestionFilter{ThreadID: threadID})
		if err != nil {
			t.Fatal(err)
		}
		if len(qs) == 1 && cond(qs[0]) {
			return qs[0]
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the question of thread %s never got there: %+v", threadID, qs)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// TestAgentSuggestsWithItsConfidence: an oracle that gives a confidence
// suggests rather than answers. At or above the route's auto_accept the
// suggestion answers the question (answered_by suggested:…); below it the
// question waits on the fallback route with the suggestion, and a person
// answers.
func TestAgentSuggestsWithItsConfidence(t *testing.T) {
	t.Run("accepted", func(t *testing.T) {
		s := startSystem(t, suggestRoutes)
		s.shell("planner", planner)
		s.shell("oracle", `printf '{"answer":"B","confidence":0.95,"rationale":"B keeps the API"}' > "$AGORA_OUTPUT_FILE"`)
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		defer cancel()
		d, err := s.c.Dispatch(ctx, lifecycle.Request{Subagent: "planner", Input: json.RawMessage(`{}`)})
		if err != nil {
			t.Fatal(err)
		}
		end, err := s.c.Follow(ctx, d.ThreadID, nil)
		if err != nil {
			t.Fatal(err)
		}
		if fin, ok := end.Data.(*lifecycle.Finished); !ok || !strings.Contains(string(fin.Output), `"answer":"B"`) {
			t.Fatalf("thread ended %+v", end.Data)
		}
		q := waitQuestion(ctx, t, s.c, d.ThreadID, func(q lifecycle.Question) bool { return q.Status == "answered" })
		if !strings.HasPrefix(q.AnsweredBy, "suggested:") || q.Suggestion == nil || !q.Suggestion.Accepted ||
			q.Suggestion.Confidence != 0.95 || q.Suggestion.Rationale != "B keeps the API" || q.Suggestion.Answer != "B" {
			t.Errorf("question = %+v, suggestion %+v", q, q.Suggestion)
		}
	})
	t.Run("below auto_accept", func(t *testing.T) {
		s := startSystem(t, suggestRoutes)
		s.shell("planner", planner)
		s.shell("oracle", `printf '{"answer":"B","confidence":0.5,"rationale":"a hunch"}' > "$AGORA_OUTPUT_FILE"`)
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		defer cancel()
		d, err := s.c.Dispatch(ctx, lifecycle.Request{Subagent: "planner", Input: json.RawMessage(`{}`)})
		if err != nil {
			t.Fatal(err)
		}
		q := waitQuestion(ctx, t, s.c, d.ThreadID, func(q lifecycle.Question) bool { return q.Route == "people" && q.Suggestion != nil })
		if q.Status != "asked" || q.Suggestion.Accepted || q.Suggestion.Answer != "B" || q.Suggestion.Confidence != 0.5 || q.Suggestion.Rationale != "a hunch" {
			t.Errorf("question on people = %+v, suggestion %+v", q, q.Suggestion)
		}
		if _, err := s.c.Answer(ctx, q.QuestionID, lifecycle.Answer{Answer: "A", AnsweredBy: "alice"}); err != nil {
			t.Fatal(err)
		}
		end, err := s.c.Follow(ctx, d.ThreadID, nil)
		if err != nil {
			t.Fatal(err)
		}
		if fin, ok := end.Data.(*lifecycle.Finished); !ok || !strings.Contains(string(fin.Output), `"answer":"A"`) || !strings.Contains(string(fin.Output), `"answered_by":"alice"`) {
			t.Fatalf("thread ended %+v", end.Data)
		}
	})
}
