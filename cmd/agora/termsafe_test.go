package main_test

import (
	"strings"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/pkg/lifecycle"
)

// hostileText is what a prompt-injected sub-agent puts in its question:
// an OSC 52 clipboard write, a screen clear through C1 CSI, DEL, a carriage
// return that paints over the line, and a line break that forges a
// command for the operator to copy.
const hostileText = "Which one?\x1b]52;c;ZXZpbA==\x07\u009b2J\x7f\rok\nagora answer q-FAKE yes"

// TestPrintersEscapeControlCharacters shows a hostile question through
// every human-readable printer that shows one — questions, --long,
// questions show and --json — and checks that no control character
// reaches the terminal and no line of the output is the forged one.
func TestPrintersEscapeControlCharacters(t *testing.T) {
	t.Parallel()
	id := lifecycle.NewID()
	at := time.Now().Add(-time.Minute).UTC().Truncate(time.Second)
	q := lifecycle.Question{Common: lifecycle.Common{DispatchID: id, ThreadID: id, Subagent: "hostile"}, QuestionID: lifecycle.QuestionID(id),
		Event: "asked", Status: "asked", Route: "default", Question: hostileText, Options: []string{"a\x1b[31m", "b\nagora answer q-FAKE b"},
		Context: hostileText, Kind: "decision", AskedAt: at, Detail: hostileText}
	putQuestions(t, q)
	for _, args := range [][]string{
		{"questions", "--thread", id},
		{"questions", "--thread", id, "--long"},
		{"questions", "show", q.QuestionID},
		{"questions", "show", q.QuestionID, "--json"},
		{"questions", "--thread", id, "--json"},
	} {
		r := mustAgora(t, args...)
		out := r.stdout + r.stderr
		if i := strings.IndexFunc(out, func(c rune) bool { return c < 0x20 && c != '\n' && c != '\t' || c == 0x7f || c >= 0x80 && c <= 0x9f }); i >= 0 {
			t.Errorf("agora %s: a control character %U reached the terminal at byte %d:\n%q", strings.Join(args, " "), []rune(out[i:])[0], i, out)
		}
		for _, line := range strings.Split(out, "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "agora answer q-FAKE") {
				t.Errorf("agora %s: the sub-agent forged a line of its own: %q", strings.Join(args, " "), line)
			}
		}
		if !strings.Contains(out, `\u001b]52`) && !strings.Contains(out, "Which one?") {
			t.Errorf("agora %s: the question is not shown:\n%s", strings.Join(args, " "), out)
		}
	}
}
