package natstest

import (
	"encoding/json"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

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
