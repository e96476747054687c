package chaos

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// fakeDoor answers as told: the first answer accepted or not, the others
// refused (they lost), and whether the task shows the question waiting.
type fakeDoor struct {
	mu     sync.Mutex
	first  error
	calls  int
	waits  bool
	others error
}

func (d *fakeDoor) dispatch(context.Context) (string, error) { return "", errors.New("unused") }
func (d *fakeDoor) end(context.Context, string) (taskEnd, error) {
	return taskEnd{}, errors.New("unused")
}
func (d *fakeDoor) waiting(context.Context, string, string) (bool, error) { return d.waits, nil }
func (d *fakeDoor) answer(context.Context, string, string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls++
	if d.calls == 1 {
		return d.first
	}
	return d.others
}

type fakeQuestions struct{ status string }

func (q fakeQuestions) Question(_ context.Context, id string) (lifecycle.Question, error) {
	return lifecycle.Question{QuestionID: id, Status: q.status}, nil
}

// Answers through a door: refusals that lost to another of the same
// answers, or came once the question was answered, are no error; a
// refusal while the door shows the task waiting on that question is an
// anomaly; a door that is down counts by its status.
func TestAnswerThrough(t *testing.T) {
	refused := fmt.Errorf("%w: task is not waiting for input", errRefused)
	cases := []struct {
		name     string
		door     *fakeDoor
		question string
		errs     map[string]int
		anomaly  bool
	}{
		{name: "one accepted, two lost", door: &fakeDoor{others: refused}, question: "asked", errs: map[string]int{}},
		{name: "all refused, answered before", door: &fakeDoor{first: refused, others: refused}, question: "answered", errs: map[string]int{}},
		{name: "all refused while the task waits", door: &fakeDoor{first: refused, others: refused, waits: true}, question: "asked",
			errs: map[string]int{"a2a answer: refused a legitimate answer": 3}, anomaly: true},
		{name: "refused before the task waits", door: &fakeDoor{first: refused, others: refused}, question: "asked",
			errs: map[string]int{"a2a answer: refused: task is not waiting for input (the task was not waiting for it)": 3}},
		{name: "the door is down", door: &fakeDoor{first: errors.New("dial tcp: connection refused"), others: errors.New("dial tcp: connection refused")}, question: "asked",
			errs: map[string]int{"a2a answer: connection refused": 3}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			errs := map[string]int{}
			var anomalies []string
			answerThrough(t.Context(), "a2a", tc.door, fakeQuestions{tc.question}, "t1", lifecycle.Question{Common: lifecycle.Common{ThreadID: "t1"}, QuestionID: "q-1"}, 3,
				func(error) {}, func(what, status string) { mu.Lock(); errs[what+": "+status]++; mu.Unlock() },
				func(a string) { anomalies = append(anomalies, a) })
			if fmt.Sprint(errs) != fmt.Sprint(tc.errs) {
				t.Errorf("answer errors %v, want %v", errs, tc.errs)
			}
			if (len(anomalies) > 0) != tc.anomaly {
				t.Errorf("anomalies %q, want some: %v", anomalies, tc.anomaly)
			}
		})
	}
}
