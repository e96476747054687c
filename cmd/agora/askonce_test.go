package main_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// putQuestions writes question records into the dev server's
// agora_questions bucket, as the router keeps them, for the verbs that read
// the bucket.
func putQuestions(t *testing.T, qs ...lifecycle.Question) {
	t.Helper()
	js := devServer(t).jetStream(t)
	kv, err := js.KeyValue(t.Context(), lifecycle.BucketQuestions)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range qs {
		b, err := json.Marshal(q)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Put(t.Context(), q.QuestionID, b); err != nil {
			t.Fatal(err)
		}
	}
}

// askedOnce is a question three threads wait on, with a suggestion below
// the route's auto_accept, one question that joined it, one answered from
// a remembered decision and one a suggestion answered; all of one thread
// set (ids of this test's own) so other tests' questions stay out.
func askedOnce(t *testing.T) (asked, joined, reused, suggested lifecycle.Question) {
	t.Helper()
	at := time.Now().Add(-5 * time.Minute).UTC().Truncate(time.Second)
	common := func() lifecycle.Common {
		id := lifecycle.NewID()
		return lifecycle.Common{DispatchID: id, ThreadID: id, Subagent: "renamer", Round: 0}
	}
	ca, cj, c3 := common(), common(), common()
	asked = lifecycle.Question{Common: ca, QuestionID: lifecycle.QuestionID(ca.DispatchID), Event: "asked", Status: "asked",
		Route: "default", Question: "Rename the config loader to readConfig or parseConfig?", Options: []string{"readConfig", "parseConfig"},
		Kind: "decision", AskedAt: at,
		WaitingThreads: []lifecycle.WaitingThread{
			{QuestionID: lifecycle.QuestionID(ca.DispatchID), DispatchID: ca.DispatchID, ThreadID: ca.ThreadID, Subagent: "renamer", AskedAt: at},
			{QuestionID: lifecycle.QuestionID(cj.DispatchID), DispatchID: cj.DispatchID, ThreadID: cj.ThreadID, Subagent: "renamer", AskedAt: at.Add(time.Second)},
			{QuestionID: lifecycle.QuestionID(c3.DispatchID), DispatchID: c3.DispatchID, ThreadID: c3.ThreadID, Subagent: "renamer", AskedAt: at.Add(2 * time.Second)},
		},
		Suggestion: &lifecycle.Suggestion{Answer: "parseConfig", Confidence: 0.72, Rationale: "it parses, it does not only read", By: "agent:reviewer", At: at.Add(time.Minute)},
	}
	joined = asked
	joined.Common, joined.QuestionID, joined.Status, joined.JoinedTo = cj, lifecycle.QuestionID(cj.DispatchID), lifecycle.StatusJoined, asked.QuestionID
	joined.WaitingThreads, joined.Suggestion = nil, nil

	cr, cs := common(), common()
	answeredAt := at.Add(2 * time.Minute)
	decidedAt := at.Add(-24 * time.Hour)
	reused = lifecycle.Question{Common: cr, QuestionID: lifecycle.QuestionID(cr.DispatchID), Event: "answered", Status: "answered",
		Route: "default", Question: "Keep the old flag?", Options: []string{"yes", "no"}, Kind: "decision", AskedAt: at,
		Answer: "no", AnsweredBy: "memory:q-01REMEMBERED", AnsweredAt: &answeredAt,
		Reused: &lifecycle.Reused{QuestionID: "q-01REMEMBERED", AnsweredBy: "alice", AnsweredAt: decidedAt}}
	suggested = lifecycle.Question{Common: cs, QuestionID: lifecycle.QuestionID(cs.DispatchID), Event: "answered", Status: "answered",
		Route: "default", Question: "Which test runner?", Options: []string{"go test", "gotestsum"}, Kind: "decision", AskedAt: at,
		Answer: "go test", AnsweredBy: "suggested:agent:reviewer", AnsweredAt: &answeredAt,
		Suggestion: &lifecycle.Suggestion{Answer: "go test", Confidence: 0.95, Rationale: "the Makefile uses it", By: "agent:reviewer", At: answeredAt, Accepted: true}}
	putQuestions(t, asked, joined, reused, suggested)
	return asked, joined, reused, suggested
}

// agora questions shows a question asked once for several threads, the
// one that joined it, a pending suggestion and whose remembered decision
// or suggestion answered a question: in the table, in --long, in
// questions show, and field for field in --json.
func TestQuestionsShowAskOnce(t *testing.T) {
	t.Parallel()
	asked, joined, reused, suggested := askedOnce(t)

	r := mustAgora(t, "questions", "--status", "all", "--thread", asked.ThreadID)
	for _, want := range []string{"asked by 3 threads", "suggested: parseConfig (0.72, by agent:reviewer): it parses"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("questions: no %q in\n%s", want, r.stdout)
		}
	}
	r = mustAgora(t, "questions", "--status", "joined", "--thread", joined.ThreadID)
	if !strings.Contains(r.stdout, "joined "+asked.QuestionID) || !strings.Contains(r.stdout, "answered with "+asked.QuestionID) {
		t.Errorf("questions --status joined:\n%s", r)
	}
	r = mustAgora(t, "questions", "--status", "answered", "--thread", reused.ThreadID)
	if !strings.Contains(r.stdout, "reused the decision of q-01REMEMBERED by alice") {
		t.Errorf("a reused answer:\n%s", r)
	}
	r = mustAgora(t, "questions", "--status", "answered", "--thread", suggested.ThreadID)
	if !strings.Contains(r.stdout, "by suggested:agent:reviewer, confidence 0.95") {
		t.Errorf("an accepted suggestion:\n%s", r)
	}

	// The long form and show list the threads waiting.
	long := mustAgora(t, "questions", "--status", "all", "--thread", asked.ThreadID, "--long").stdout
	show := mustAgora(t, "questions", "show", asked.QuestionID).stdout
	for name, out := range map[string]string{"--long": long, "show": show} {
		for _, want := range []string{"asked by 3 threads", "3 waiting", "THREAD", "— shown preselected",
			asked.WaitingThreads[1].ThreadID, asked.WaitingThreads[2].DispatchID, asked.WaitingThreads[2].QuestionID} {
			if !strings.Contains(out, want) {
				t.Errorf("%s: no %q in\n%s", name, want, out)
			}
		}
	}
	if out := mustAgora(t, "questions", "show", joined.QuestionID).stdout; !strings.Contains(out, "waits on") || !strings.Contains(out, asked.QuestionID) {
		t.Errorf("show of a joined question:\n%s", out)
	}
	if out := mustAgora(t, "questions", "show", reused.QuestionID).stdout; !strings.Contains(out, "reused the decision of q-01REMEMBERED by alice, made ") {
		t.Errorf("show of a reused answer:\n%s", out)
	}
	if out := mustAgora(t, "questions", "show", suggested.QuestionID).stdout; !strings.Contains(out, "accepted as the answer") {
		t.Errorf("show of an accepted suggestion:\n%s", out)
	}

	// --json passes the fields through.
	for _, args := range [][]string{{"questions", "--status", "all", "--thread", asked.ThreadID, "--json"}, {"questions", "show", asked.QuestionID, "--json"}} {
		lines := jsonLines(t, mustAgora(t, args...).stdout)
		if len(lines) != 1 {
			t.Fatalf("%v: %d lines", args, len(lines))
		}
		b, _ := json.Marshal(lines[0])
		var got lifecycle.Question
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatal(err)
		}
		if len(got.WaitingThreads) != 3 || got.WaitingThreads[1] != asked.WaitingThreads[1] || got.Suggestion == nil || *got.Suggestion != *asked.Suggestion {
			t.Errorf("%v: %s", args, b)
		}
	}
	lines := jsonLines(t, mustAgora(t, "questions", "show", reused.QuestionID, "--json").stdout)
	if rr, _ := lines[0]["reused"].(map[string]any); rr["question_id"] != "q-01REMEMBERED" || rr["answered_by"] != "alice" {
		t.Errorf("show --json of a reused answer: %v", lines[0])
	}
	lines = jsonLines(t, mustAgora(t, "questions", "show", joined.QuestionID, "--json").stdout)
	if lines[0]["joined_to"] != asked.QuestionID || lines[0]["status"] != "joined" {
		t.Errorf("show --json of a joined question: %v", lines[0])
	}

	// An unknown id says how to list them.
	if r := agora(t, "questions", "show", "q-01NOSUCHQUESTION"); r.code != 1 || !strings.Contains(r.stderr, "no question q-01NOSUCHQUESTION") || !strings.Contains(r.stderr, "questions --status all") {
		t.Errorf("show of an unknown question: %s", r)
	}
}
