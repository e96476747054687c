package jserr_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agora-dispatch/agora/internal/jserr"
	"github.com/agora-dispatch/agora/internal/natstest"
)

// Each classification against the error a real JetStream answers.
func TestClassifiesRealRefusals(t *testing.T) {
	srv := natstest.Start(t)
	js := srv.JetStream(t)
	ctx := t.Context()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}, MaxMsgSize: 1024}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "t.a", []byte("first")); err != nil {
		t.Fatal(err)
	}
	_, stale := js.Publish(ctx, "t.a", []byte("second"), jetstream.WithExpectLastSequencePerSubject(7))
	_, large := js.Publish(ctx, "t.b", []byte(strings.Repeat("x", 2048)))
	other := errors.New("something else")
	for _, c := range []struct {
		name         string
		err          error
		stale, large bool
	}{
		{"a lost compare-and-set", stale, true, false},
		{"over the stream's max message size", large, false, true},
		{"another error", other, false, false},
		{"no error", nil, false, false},
	} {
		if got := jserr.WrongLastSequence(c.err); got != c.stale {
			t.Errorf("%s (%v): WrongLastSequence = %v, want %v", c.name, c.err, got, c.stale)
		}
		if got := jserr.TooLarge(c.err); got != c.large {
			t.Errorf("%s (%v): TooLarge = %v, want %v", c.name, c.err, got, c.large)
		}
	}
}
