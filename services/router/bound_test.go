package router_test

import (
	"strings"
	"testing"

	"github.com/agora-dispatch/agora/pkg/audit"
	"github.com/agora-dispatch/agora/pkg/client"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
	"github.com/agora-dispatch/agora/services/router"
)

// TestBoundAnswers: a question carries the digest of what it shows, the
// decision log's shown digest; an answer bound to another digest (what
// another question showed, as a hostile sub-agent on the route would
// have a person's approval land on its own question) is refused as
// changed and recorded, one bound to the question's digest is accepted
// and the record says what it was bound to, and one without a digest is
// accepted unbound.
func TestBoundAnswers(t *testing.T) {
	e := newEnv(t, "")
	e.startRouter(e.config())

	seen := lifecycle.NeedsInput{Common: lifecycle.Common{Subagent: "deployer"}, Question: "Deploy build 41 to staging?", Kind: "approval",
		Context: "diff: +3 -1"}
	hostile := lifecycle.NeedsInput{Common: lifecycle.Common{Subagent: "deployer"}, Question: "Deploy build 41 to PRODUCTION?", Kind: "approval",
		Context: "diff: +3 -1"}
	sq := e.askFrom(seen, 1)
	hq := e.askFrom(hostile, 1)
	srec, hrec := e.asked(sq), e.asked(hq)
	want := audit.ShownDigest(seen.Question, seen.Context, string(seen.Kind), nil, audit.Digest([]byte(`{"n":1}`)))
	if srec.ShownDigest != want {
		t.Fatalf("shown_digest %q, want the decision log's %q", srec.ShownDigest, want)
	}
	if hrec.ShownDigest == srec.ShownDigest {
		t.Fatalf("two questions showing different text share shown_digest %s", srec.ShownDigest)
	}

	// The approval given on what sq showed, sent for hq.
	rep := e.answer(router.Submission{QuestionID: hq, Decision: "approve", AnsweredBy: "alice", ShownDigest: srec.ShownDigest})
	if rep.Status != client.AnswerChanged || !strings.Contains(rep.Reason, "look at the question again") {
		t.Fatalf("an answer bound to another question's digest: %+v, want changed saying to look again", rep)
	}
	r := e.waitRecord(hq, "the refusal recorded", func(r questionRecord) bool { return len(r.History) == 1 })
	if h := r.History[0]; r.Status != "asked" || h.Result != "refused" || h.Status != string(client.AnswerChanged) || h.ShownDigest != srec.ShownDigest {
		t.Errorf("after the stale answer: status %s, history %+v", r.Status, h)
	}

	// Bound to what it shows: accepted, and the record says so.
	if rep := e.answer(router.Submission{QuestionID: hq, Decision: "reject", AnsweredBy: "alice", ShownDigest: hrec.ShownDigest}); rep.Status != client.AnswerAccepted {
		t.Fatalf("an answer bound to the question's own digest: %+v", rep)
	}
	if r := e.waitStatus(hq, "answered"); r.BoundDigest != hrec.ShownDigest || r.Decision != "reject" {
		t.Errorf("answered: bound_digest %q decision %s, want %q reject", r.BoundDigest, r.Decision, hrec.ShownDigest)
	}

	// Without a digest: the question as it stands, unbound.
	if rep := e.answer(router.Submission{QuestionID: sq, Decision: "approve", AnsweredBy: "script"}); rep.Status != client.AnswerAccepted {
		t.Fatalf("an unbound answer: %+v", rep)
	}
	if r := e.waitStatus(sq, "answered"); r.BoundDigest != "" {
		t.Errorf("an unbound answer recorded bound_digest %q", r.BoundDigest)
	}
}

// TestMemoryBoundToWhatWasShown: a remembered decision records the
// digest it was made on and answers a later question only when that
// shows the same, partial state included; the reuse names the digest.
func TestMemoryBoundToWhatWasShown(t *testing.T) {
	e := newEnv(t, `routes:
  - name: default
    remember: 1h
`)
	e.startRouter(e.config())
	first := e.askFrom(sameQuestion, 7)
	frec := e.asked(first)
	if rep := e.answer(router.Submission{QuestionID: first, Answer: "parseConfig", AnsweredBy: "alice", ShownDigest: frec.ShownDigest}); rep.Status != client.AnswerAccepted {
		t.Fatalf("answer = %+v", rep)
	}
	e.waitRecord(first, "remembered", func(r questionRecord) bool { return r.Status == "answered" && !r.Release && len(r.Pending) == 0 })

	// Another partial state: the person never saw this analysis.
	other := e.askFrom(sameQuestion, 8)
	if r := e.asked(other); r.Status != "asked" || r.Reused != nil {
		t.Fatalf("the same words with another partial state: status %s reused %+v, want asked", r.Status, r.Reused)
	}
	if rep := e.answer(router.Submission{QuestionID: other, Answer: "readConfig", AnsweredBy: "bob"}); rep.Status != client.AnswerAccepted {
		t.Fatalf("answer = %+v", rep)
	}
	e.waitRecord(other, "settled", func(r questionRecord) bool { return r.Status == "answered" && !r.Release && len(r.Pending) == 0 })

	// Everything shown the same: answered from memory, bound to the
	// decision's digest. (bob's answer replaced alice's decision: the
	// same match, the newer answer.)
	again := e.askFrom(sameQuestion, 8)
	r := e.waitStatus(again, "answered")
	orec, _ := e.record(other)
	if r.Reused == nil || r.Reused.QuestionID != other || r.Reused.ShownDigest != orec.ShownDigest || r.BoundDigest != orec.ShownDigest || r.ShownDigest != orec.ShownDigest {
		t.Errorf("reused %+v bound_digest %q shown_digest %q, want the decision of %s bound to %q", r.Reused, r.BoundDigest, r.ShownDigest, other, orec.ShownDigest)
	}
}

// TestShownDigestOfALargeState: a partial state kept in agora_state is in
// the shown digest by its object's SHA-256, as the decision log names it;
// one whose object cannot be read, as unavailable:<ref>.
func TestShownDigestOfALargeState(t *testing.T) {
	e := newEnv(t, "")
	e.startRouter(e.config())
	obs, err := e.js.ObjectStore(t.Context(), lifecycle.BucketState)
	if err != nil {
		t.Fatal(err)
	}
	state := []byte(`{"analysis":"` + strings.Repeat("x", 4096) + `"}`)
	if _, err := obs.PutBytes(t.Context(), "big-state", state); err != nil {
		t.Fatal(err)
	}
	ni := lifecycle.NeedsInput{Common: lifecycle.Common{Subagent: "big"}, Question: "Go on?", Kind: "clarification", PartialStateRef: "big-state"}
	rec := e.asked(e.ask(ni, lifecycle.Request{Input: []byte(`{}`)}, ""))
	if want := audit.ShownDigest(ni.Question, "", string(ni.Kind), nil, audit.Digest(state)); rec.ShownDigest != want {
		t.Errorf("shown_digest %s, want %s (the object's digest)", rec.ShownDigest, want)
	}
	ni.PartialStateRef, ni.Question = "gone", "Go on without it?" // other words: not joined to the first
	rec = e.asked(e.ask(ni, lifecycle.Request{Input: []byte(`{}`)}, ""))
	if want := audit.ShownDigest(ni.Question, "", string(ni.Kind), nil, "unavailable:gone"); rec.ShownDigest != want {
		t.Errorf("shown_digest of a state whose object is gone %s, want %s", rec.ShownDigest, want)
	}
}

// TestBoundAnswerOnAJoinedQuestion: a door that follows a thread shows
// that thread's own question, joined to another; an answer bound to what
// the joined question shows answers the question it joined (and so every
// thread waiting on it), one bound to something else is refused as
// changed.
func TestBoundAnswerOnAJoinedQuestion(t *testing.T) {
	e := newEnv(t, "routes:\n  - name: default\n")
	e.startRouter(e.config())
	qids := e.askGroup(sameQuestion, 2)
	lead, joined := e.asked(qids[0]), e.asked(qids[1])
	if joined.ShownDigest == "" || joined.ShownDigest == lead.ShownDigest {
		t.Fatalf("joined question's shown_digest %q, the lead's %q: want its own", joined.ShownDigest, lead.ShownDigest)
	}
	if rep := e.answer(router.Submission{QuestionID: qids[1], Answer: "readConfig", AnsweredBy: "alice", ShownDigest: lead.ShownDigest + "0"}); rep.Status != client.AnswerChanged {
		t.Fatalf("an answer on the joined question bound to something else: %+v, want changed", rep)
	}
	if rep := e.answer(router.Submission{QuestionID: qids[1], Answer: "readConfig", AnsweredBy: "alice", ShownDigest: joined.ShownDigest}); rep.Status != client.AnswerAccepted {
		t.Fatalf("an answer bound to what the joined question shows: %+v, want accepted", rep)
	}
	e.checkResumed(qids, "readConfig")
}
