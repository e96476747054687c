package answertext_test

import (
	"testing"

	"github.com/agora-dispatch/agora/internal/answertext"
)

func TestLine(t *testing.T) {
	for _, c := range []struct{ answer, decision, want string }{
		{"use A", "", "use A"},
		{"", "approve", "approve"},
		{"approve", "approve", "approve"},
		{"option-b", "approve", "approve (option-b)"},
		{"", "", ""},
	} {
		if got := answertext.Line(c.answer, c.decision); got != c.want {
			t.Errorf("Line(%q, %q) = %q, want %q", c.answer, c.decision, got, c.want)
		}
	}
}
