package lifecycle_test

import (
	"encoding/json"
	"time"

	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

const (
	testSource = "/agora/test/1"
	dispatchID = "01JDISPATCH"
	threadID   = "01JTHREAD"
	subagent   = "planner"
)

var (
	questionID = lifecycle.QuestionID(dispatchID)
	testTime   = time.Date(2025, 11, 21, 12, 30, 0, 123456789, time.UTC)
)

func common() lifecycle.Common {
	return lifecycle.Common{DispatchID: dispatchID, ThreadID: threadID, ParentID: "01JPARENT", Round: 2, Subagent: subagent}
}

func exitCode(n int) *int { return &n }

// sample is one value of every data type, with the event id, CloudEvents
// type and subject, NATS subject and schema file New and Subject must give.
// An empty id means a fresh ULID.
type sample struct {
	name     string
	data     lifecycle.Data
	id       string
	typ      string
	ceSubj   string
	natsSubj string
	schema   string
}

func question(ev lifecycle.QuestionEvent, escalation int) *lifecycle.Question {
	deadline := testTime.Add(4 * time.Hour)
	return &lifecycle.Question{
		Common: common(), QuestionID: questionID, Event: ev, Status: "asked", Route: "approvals",
		Answerer: "human", Question: "A or B?", Options: []string{"A", "B"}, Kind: "decision",
		AskedAt: testTime, Deadline: &deadline, Escalation: escalation, Labels: map[string]string{"team": "payments"},
	}
}

func samples() []sample {
	lc := func(k lifecycle.Kind) string {
		return "agora.lifecycle." + string(k) + "." + threadID + "." + dispatchID
	}
	s := []sample{
		{
			name: "request with dispatch id",
			data: &lifecycle.Request{DispatchID: dispatchID, Subagent: subagent, Input: json.RawMessage(`{"task":"plan"}`),
				Target: "repo", Env: map[string]string{"A": "b"}, Labels: map[string]string{"team": "payments"}, Timeout: "30m", MaxRounds: 3},
			id: dispatchID, typ: lifecycle.TypeRequested, ceSubj: dispatchID,
			natsSubj: "agora.requests.planner", schema: "dispatch.requested.json",
		},
		{
			name: "request without dispatch id",
			data: &lifecycle.Request{Subagent: subagent, Input: json.RawMessage(`{"task":"plan"}`)},
			typ:  lifecycle.TypeRequested, natsSubj: "agora.requests.planner", schema: "dispatch.requested.json",
		},
		{
			name: "accepted",
			data: &lifecycle.Accepted{Common: common(), SubagentRevision: 7, Target: "repo", Labels: map[string]string{"team": "payments"}},
			id:   dispatchID + ".accepted", typ: "dev.agora.dispatch.accepted", ceSubj: dispatchID,
			natsSubj: lc(lifecycle.KindAccepted), schema: "dispatch.accepted.json",
		},
		{
			name: "started",
			data: &lifecycle.Started{Common: common(), WorkerID: "w-1", Attempt: 3},
			id:   dispatchID + ".started.3", typ: "dev.agora.dispatch.started", ceSubj: dispatchID,
			natsSubj: lc(lifecycle.KindStarted), schema: "dispatch.started.json",
		},
		{
			name: "finished",
			data: &lifecycle.Finished{Common: common(), ExitCode: 0, DurationMS: 1234, Output: json.RawMessage(`{"ok":true}`), StdoutTail: "done\n"},
			id:   dispatchID + ".terminal", typ: "dev.agora.dispatch.finished", ceSubj: dispatchID,
			natsSubj: lc(lifecycle.KindFinished), schema: "dispatch.finished.json",
		},
		{
			name: "needs_input",
			data: &lifecycle.NeedsInput{Common: common(), QuestionID: questionID, Question: "A or B?", Options: []string{"A", "B"},
				Context: "same signature", Kind: "decision", PartialState: json.RawMessage(`{"analysis":"half"}`), DurationMS: 99, ExitCode: 3},
			id: dispatchID + ".terminal", typ: "dev.agora.dispatch.needs_input", ceSubj: dispatchID,
			natsSubj: lc(lifecycle.KindNeedsInput), schema: "dispatch.needs_input.json",
		},
		{
			name: "failed",
			data: &lifecycle.Failed{Common: common(), Reason: lifecycle.ReasonProviderFailed, Detail: "exit 2", ExitCode: exitCode(2), DurationMS: 5},
			id:   dispatchID + ".terminal", typ: "dev.agora.dispatch.failed", ceSubj: dispatchID,
			natsSubj: lc(lifecycle.KindFailed), schema: "dispatch.failed.json",
		},
		{
			name: "cancelled",
			data: &lifecycle.Cancelled{Common: common(), By: "alice", Reason: "no longer needed"},
			id:   dispatchID + ".terminal", typ: "dev.agora.dispatch.cancelled", ceSubj: dispatchID,
			natsSubj: lc(lifecycle.KindCancelled), schema: "dispatch.cancelled.json",
		},
		{
			name: "answer",
			data: &lifecycle.Answer{QuestionID: questionID, Route: "approvals", Answer: "B", Decision: "approve", AnsweredBy: "alice@example.com", Comment: "ok"},
			typ:  lifecycle.TypeAnswerSubmitted, ceSubj: questionID,
			natsSubj: "agora.answers.approvals." + questionID, schema: "answer.submitted.json",
		},
	}
	for _, ev := range lifecycle.QuestionEvents() {
		id := questionID + "." + string(ev)
		escalation := 0
		if ev == lifecycle.QuestionEscalated {
			escalation = 2
			id = questionID + ".escalated.2"
		}
		s = append(s, sample{
			name: "question " + string(ev), data: question(ev, escalation),
			id: id, typ: "dev.agora.question." + string(ev), ceSubj: questionID,
			natsSubj: "agora.questions.approvals." + questionID + "." + string(ev), schema: "question.json",
		})
	}
	return s
}
