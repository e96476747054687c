package natstest

import (
	"encoding/json"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/pkg/audit"
	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// PutQuestions writes question records into the agora_questions bucket of
// js under their ids, as the router keeps them, failing the test when one
// cannot be written.
func PutQuestions(t testing.TB, js jetstream.JetStream, qs ...lifecycle.Question) {
	t.Helper()
	kv := KeyValue(t, js, lifecycle.BucketQuestions)
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

// RewordQuestion rewrites question qid's record in agora_questions as if
// it had been asked anew with its text followed by suffix: the question
// and its shown_digest change, everything else stays. It returns the new
// shown digest. An answer bound to the old one must now be refused as
// changed (docs/answering.md, "Bound answers").
func RewordQuestion(t testing.TB, js jetstream.JetStream, qid, suffix string) string {
	t.Helper()
	kv := KeyValue(t, js, lifecycle.BucketQuestions)
	e, err := kv.Get(t.Context(), qid)
	if err != nil {
		t.Fatalf("reword %s: %v", qid, err)
	}
	var rec map[string]json.RawMessage
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		t.Fatal(err)
	}
	var q lifecycle.Question
	if err := json.Unmarshal(e.Value(), &q); err != nil {
		t.Fatal(err)
	}
	q.Question += suffix
	digest := audit.ShownDigest(q.Question, q.Context, string(q.Kind), q.Options, "reworded")
	for k, v := range map[string]string{"question": q.Question, "shown_digest": digest} {
		rec[k], _ = json.Marshal(v)
	}
	b, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Update(t.Context(), qid, b, e.Revision()); err != nil {
		t.Fatalf("reword %s: %v", qid, err)
	}
	return digest
}
