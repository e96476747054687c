package lifecycle_test

import (
	"slices"
	"testing"

	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

func TestKinds(t *testing.T) {
	tests := []struct {
		kind     lifecycle.Kind
		valid    bool
		terminal bool
		typ      string
	}{
		{lifecycle.KindAccepted, true, false, "dev.agora.dispatch.accepted"},
		{lifecycle.KindStarted, true, false, "dev.agora.dispatch.started"},
		{lifecycle.KindFinished, true, true, "dev.agora.dispatch.finished"},
		{lifecycle.KindNeedsInput, true, true, "dev.agora.dispatch.needs_input"},
		{lifecycle.KindFailed, true, true, "dev.agora.dispatch.failed"},
		{lifecycle.KindCancelled, true, true, "dev.agora.dispatch.cancelled"},
		{"", false, false, ""},
		{"requested", false, false, ""},
		{"Finished", false, false, ""},
		{"needs-input", false, false, ""},
		{"finished ", false, false, ""},
		{"*", false, false, ""},
	}
	for _, tt := range tests {
		t.Run(string(tt.kind), func(t *testing.T) {
			if got := tt.kind.Valid(); got != tt.valid {
				t.Errorf("Valid() = %v, want %v", got, tt.valid)
			}
			if got := tt.kind.Terminal(); got != tt.terminal {
				t.Errorf("Terminal() = %v, want %v", got, tt.terminal)
			}
			if tt.valid && tt.kind.Type() != tt.typ {
				t.Errorf("Type() = %q, want %q", tt.kind.Type(), tt.typ)
			}
			if got := slices.Contains(lifecycle.Kinds(), tt.kind); got != tt.valid {
				t.Errorf("Kinds() contains %q = %v, want %v", tt.kind, got, tt.valid)
			}
		})
	}
	if got := len(lifecycle.Kinds()); got != 6 {
		t.Errorf("len(Kinds()) = %d, want 6", got)
	}
}

func TestReasons(t *testing.T) {
	want := []lifecycle.Reason{"rejected", "worker-failed", "provider-failed", "timeout",
		"redelivery-exhausted", "max-rounds", "unanswered", "limit-exceeded", "workspace-lost"}
	if got := lifecycle.Reasons(); !slices.Equal(got, want) {
		t.Errorf("Reasons() = %q, want %q", got, want)
	}
	for _, r := range want {
		if !r.Valid() {
			t.Errorf("%q.Valid() = false", r)
		}
	}
	for _, r := range []lifecycle.Reason{"", "failed", "Timeout", "worker_failed", "provider-failed "} {
		if r.Valid() {
			t.Errorf("%q.Valid() = true, want false", r)
		}
	}
}

func TestQuestionEvents(t *testing.T) {
	want := []lifecycle.QuestionEvent{"asked", "answered", "expired", "withdrawn", "escalated", "joined", "reversed"}
	if got := lifecycle.QuestionEvents(); !slices.Equal(got, want) {
		t.Errorf("QuestionEvents() = %q, want %q", got, want)
	}
	for _, q := range want {
		if !q.Valid() {
			t.Errorf("%q.Valid() = false", q)
		}
		if got := q.Type(); got != "dev.agora.question."+string(q) {
			t.Errorf("%q.Type() = %q", q, got)
		}
	}
	for _, q := range []lifecycle.QuestionEvent{"", "pending", "Asked"} {
		if q.Valid() {
			t.Errorf("%q.Valid() = true, want false", q)
		}
	}
}

func TestTypes(t *testing.T) {
	want := []string{
		"dev.agora.dispatch.requested",
		"dev.agora.answer.submitted",
		"dev.agora.dispatch.accepted",
		"dev.agora.dispatch.started",
		"dev.agora.dispatch.finished",
		"dev.agora.dispatch.needs_input",
		"dev.agora.dispatch.failed",
		"dev.agora.dispatch.cancelled",
		"dev.agora.question.asked",
		"dev.agora.question.answered",
		"dev.agora.question.expired",
		"dev.agora.question.withdrawn",
		"dev.agora.question.escalated",
		"dev.agora.question.joined",
		"dev.agora.question.reversed",
		"dev.agora.progress.reported",
	}
	got := lifecycle.Types()
	if !slices.Equal(slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(want))) {
		t.Errorf("Types() = %q, want the set %q", got, want)
	}
	seen := map[string]bool{}
	for _, typ := range got {
		if seen[typ] {
			t.Errorf("Types() lists %q twice", typ)
		}
		seen[typ] = true
		if _, err := lifecycle.SchemaName(typ); err != nil {
			t.Errorf("SchemaName(%q): %v", typ, err)
		}
	}
	// Every data type's event type is listed.
	for _, s := range samples() {
		if !seen[s.typ] {
			t.Errorf("Types() misses %q (%s)", s.typ, s.name)
		}
	}
}
