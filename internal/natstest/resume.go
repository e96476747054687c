package natstest

import (
	"encoding/json"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/resume"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// Answered plays the router for a test that makes a thread's later round
// itself: it writes the answered question record whose resume is req
// (round > 0, thread_id and parent_id set), as the router does before it
// publishes a re-dispatch, and returns req as that resume makes it (a
// dispatch id chosen when req has none; answer and answered_by always in
// its input). The dispatcher accepts a later round only as the resume of
// such a record (internal/resume).
func Answered(t testing.TB, js jetstream.JetStream, req lifecycle.Request) lifecycle.Request {
	t.Helper()
	if req.DispatchID == "" {
		req.DispatchID = lifecycle.NewID()
	}
	in := map[string]json.RawMessage{}
	if len(req.Input) > 0 && string(req.Input) != "null" {
		if err := json.Unmarshal(req.Input, &in); err != nil {
			t.Fatalf("natstest: the input of %s is not an object: %v", req.DispatchID, err)
		}
	}
	str := func(k string) string {
		var s string
		_ = json.Unmarshal(in[k], &s)
		delete(in, k)
		return s
	}
	r := resume.Record{
		Question: lifecycle.Question{
			Common:     lifecycle.Common{DispatchID: req.ParentID, ThreadID: req.ThreadID, Round: req.Round - 1, Subagent: req.Subagent},
			QuestionID: lifecycle.QuestionID(req.ParentID), Status: "answered", Event: lifecycle.QuestionAnswered,
		},
		PartialStateRef: req.PartialStateRef, MaxRounds: req.MaxRounds,
		NextDispatchID: req.DispatchID, Outcome: resume.OutcomeRedispatched,
	}
	r.Answer, r.AnsweredBy, r.Decision, r.Comment = str("answer"), str("answered_by"), str("decision"), str("comment")
	r.PartialState = in["partial_state"]
	delete(in, "partial_state")
	orig, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	r.Request = &lifecycle.Request{Input: orig, Target: req.Target, Env: req.Env, Labels: req.Labels, Timeout: req.Timeout, MaxRounds: req.MaxRounds}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(t.Context(), lifecycle.BucketQuestions)
	if err != nil {
		t.Fatalf("natstest: bucket %s: %v", lifecycle.BucketQuestions, err)
	}
	if _, err := kv.Put(t.Context(), r.QuestionID, b); err != nil {
		t.Fatalf("natstest: question %s: %v", r.QuestionID, err)
	}
	built, err := resume.Build(&r)
	if err != nil {
		t.Fatal(err)
	}
	return *built
}
